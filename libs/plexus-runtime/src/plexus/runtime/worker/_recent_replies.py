"""`RecentReplies`: a worker answers again, after a reconnect, what it answered just before a disconnect.

A reply is a core message. One written to the socket of a nats-server that then died (read by it but not yet
forwarded to the caller's server, or not read at all) is lost, and its caller would wait for its deadline:
the inbox message was acked, so no redelivery answers it from the checkpoint. The worker keeps the replies of
the last `WINDOW_S` seconds (at most `LIMIT`; older ones are let go as each reply is recorded, and by a timer
once replies stop coming); when its connection drops it sets aside those sent in that window, and publishes
them again once reconnected. A caller that already has its answer ignores the copy (its reply inbox no
longer expects the id). Replies published while disconnected are not at risk: nats-py buffers them and sends
them on reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

from plexus.runtime.store._connection import Connection

__all__ = ["RecentReplies"]


class RecentReplies:
    """The last replies published on `nc`, re-published after a reconnect."""

    WINDOW_S = 1.0
    LIMIT = 8192

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._nc = connection.nc
        self._recent: deque[tuple[float, str, bytes]] = deque(maxlen=self.LIMIT)
        self._unsure: list[tuple[str, bytes]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._expiry: asyncio.TimerHandle | None = None
        connection.on_disconnect.append(self.disconnected)
        connection.on_reconnect.append(self.reconnected)

    def published(self, subject: str, data: bytes) -> None:
        now = time.monotonic()
        recent = self._recent
        recent.append((now, subject, data))
        # Replies older than the window are never sent again: kept until LIMIT newer ones pushed them out,
        # they held the last 8,192 replies (of agents long passivated, up to a message's size each) for good.
        since = now - self.WINDOW_S
        while recent[0][0] < since:
            recent.popleft()
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(self.WINDOW_S, self._expire)

    def _expire(self) -> None:
        """Let go of the replies older than the window when no newer reply does: the last second of a burst
        was kept until the next reply, for good on a worker that then went idle."""
        self._expiry = None
        recent = self._recent
        now = time.monotonic()
        while recent and recent[0][0] <= now - self.WINDOW_S:
            recent.popleft()
        if recent:
            delay = recent[0][0] + self.WINDOW_S - now
            self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def disconnected(self) -> None:
        since = time.monotonic() - self.WINDOW_S
        self._unsure.extend((s, d) for t, s, d in self._recent if t >= since)
        self._recent.clear()

    def reconnected(self) -> None:
        unsure, self._unsure = self._unsure, []
        if unsure:
            task = asyncio.ensure_future(self._publish(unsure))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _publish(self, replies: list[tuple[str, bytes]]) -> None:
        for subject, data in replies:
            with contextlib.suppress(Exception):  # a caller that went away is not our failure
                await self._nc.publish(subject, data)

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        with contextlib.suppress(ValueError):
            self._connection.on_disconnect.remove(self.disconnected)
        with contextlib.suppress(ValueError):
            self._connection.on_reconnect.remove(self.reconnected)
        for task in list(self._tasks):
            task.cancel()
