"""`Follower`: a subscription read as an async iterator without a task per message.

nats-py's own iterators (``Subscription.messages``, ``next_msg``) create a task and wait on it for every
message: on an ordered consumer 27.8 µs of wall time per message against 5.3 µs through a callback (this
machine, 20k stored messages). A reader of a fast stream (a burst of progress events, token deltas) then
fell behind its writer and every event waited in the queue behind the earlier ones. Here the
subscription's callback appends to a deque and wakes the one reader; only a reader that finds the deque
empty waits on a future.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["FOLLOW_LIMIT", "Follower"]

M = TypeVar("M")

#: Messages held for a reader that does not keep up. Past it the callback waits, so further messages stay
#: in nats-py's pending queue under its own limits (its slow-consumer handling), as they did before.
FOLLOW_LIMIT = 65_536


class Follower(Generic[M]):
    """Pass `deliver` as a subscription's callback and iterate the follower; the iteration ends after
    `end()` or once ``closed`` (the connection's closed event) is set, with every message delivered
    before that still read."""

    def __init__(self, closed: asyncio.Event | None = None, limit: int = FOLLOW_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._items: deque[M] = deque()
        self._limit = limit
        self._closed = closed
        self._closed_watch: asyncio.Task[bool] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._space: asyncio.Future[None] | None = None
        self._ended = False

    async def deliver(self, msg: M) -> None:
        """The subscription's callback."""
        while len(self._items) >= self._limit and not self._ended:
            self._space = asyncio.get_running_loop().create_future()
            await self._space
        if self._ended:
            return
        self._items.append(msg)
        _wake(self._waiter)

    def end(self) -> None:
        """Stop the iteration once the messages already delivered are read (idempotent)."""
        self._ended = True
        _wake(self._waiter)
        _wake(self._space)
        if self._closed_watch is not None:
            self._closed_watch.cancel()

    def __aiter__(self) -> Follower[M]:
        return self

    async def __anext__(self) -> M:
        while not self._items:
            if self._ended or (self._closed is not None and self._closed.is_set()):
                self.end()
                raise StopAsyncIteration
            if self._closed is not None and self._closed_watch is None:
                # One watcher for the follower's life, not one per wait.
                watch = self._closed_watch = asyncio.ensure_future(self._closed.wait())
                watch.add_done_callback(lambda _f: self.end())
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        msg = self._items.popleft()
        if self._space is not None and len(self._items) < self._limit:
            _wake(self._space)
            self._space = None
        return msg


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
