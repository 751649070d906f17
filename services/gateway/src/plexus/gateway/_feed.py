"""`TreeFeed`: the durable events of one SSE stream, handed over by its subscription's callback.

`Subscription.next_msg` makes a task, a ``wait_for`` and a uuid per message; a stream waited for it and for
the token tap with one more task and an ``asyncio.wait`` per event. Here the subscription's callback appends
to a deque and sets one event that the token tap sets too, so a busy stream takes its next event without
waiting at all, and an idle one waits on that event under one timeout.
"""

from __future__ import annotations

import asyncio
from collections import deque

from nats.aio.msg import Msg

__all__ = ["TreeFeed"]

#: Events held for a slow viewer before the callback waits (nats-py's own pending limits apply beyond).
_LIMIT = 65_536


class TreeFeed:
    """Filled by the subscription's callback (`deliver`); the stream `take`s in order, `wait`s when empty."""

    def __init__(self, limit: int = _LIMIT) -> None:
        self.msgs: deque[Msg] = deque()
        #: Set by a delivered event and by the token tap: something may be there to send.
        self.wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._limit = limit

    async def deliver(self, msg: Msg) -> None:
        while len(self.msgs) >= self._limit:
            self._room.clear()
            await self._room.wait()
        self.msgs.append(msg)
        self.wake.set()

    def take(self) -> Msg:
        msg = self.msgs.popleft()
        if len(self.msgs) < self._limit:
            self._room.set()
        return msg

    async def wait(self, timeout_s: float) -> bool:
        """Until something is delivered or tapped (True), or `timeout_s` passes (False). Only for a caller
        that found nothing to send: the wake-up is cleared first."""
        if timeout_s <= 0:
            return False
        self.wake.clear()
        try:
            async with asyncio.timeout(timeout_s):
                await self.wake.wait()
        except TimeoutError:
            return False
        return True
