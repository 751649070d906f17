"""Per-key mailboxes: one key handles one message at a time in arrival order; keys run concurrently.

A global semaphore bounds the handlers running at once (`--concurrency`). A key's drain task exists only
while its mailbox has work, so 100k idle keys cost nothing here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Mailboxes"]

K = TypeVar("K", bound=Hashable)
M = TypeVar("M")


class Mailboxes(Generic[K, M]):
    def __init__(self, handle: Callable[[K, M], Awaitable[None]], concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._handle = handle
        self._slots = asyncio.Semaphore(concurrency)
        self._queues: dict[K, deque[M]] = {}
        self._tasks: dict[K, asyncio.Task[None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def busy_keys(self) -> set[K]:
        return set(self._queues)

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def put(self, key: K, message: M) -> None:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._idle.clear()
            # One name for all: formatting the key's would cost a str(AgentId) per message of an idle key.
            self._tasks[key] = asyncio.create_task(self._drain(key, queue), name="mailbox")
        queue.append(message)

    async def _drain(self, key: K, queue: deque[M]) -> None:
        try:
            while queue:
                message = queue[0]
                async with self._slots:
                    await self._handle(key, message)
                queue.popleft()
        finally:
            self._queues.pop(key, None)
            self._tasks.pop(key, None)
            if not self._queues:
                self._idle.set()

    async def join(self, timeout: float | None = None) -> bool:
        """Wait until every mailbox is empty; False if `timeout` passed first."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def cancel(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._queues.clear()
        self._tasks.clear()
        self._idle.set()
