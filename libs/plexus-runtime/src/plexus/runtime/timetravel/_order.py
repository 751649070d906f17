"""`CompletionOrder`: a parent's children end in a replay in the order the recording holds their endings.

Children a handler spawns concurrently (the LLM loop runs a turn's tool calls together) end in whatever
order the live run happened to see, and the parent journals each ending as it comes (``child.completed``,
then the tool's result). A replay answers every child from the recording at once, so they ended in the
order the event loop ran them, and an unchanged app diverged from its own export (seen in CI). A child's
ending is recorded only once every child recorded ending before it has been recorded too, unless that one
is not running (never spawned yet): then waiting could deadlock, and the comparison reports the
divergence instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

__all__ = ["CompletionOrder"]


class CompletionOrder:
    """One parent's children: which run (spawned, not ended), which ended, and the order to end them in."""

    def __init__(self, recorded: Iterable[str]) -> None:
        self._order = list(recorded)  # child run ids, as their endings were recorded
        self._running: set[str] = set()
        self._ended: set[str] = set()
        self._changed = asyncio.Condition()

    def started(self, child: str) -> None:
        self._running.add(child)

    @contextlib.asynccontextmanager
    async def turn(self, child: str) -> AsyncIterator[None]:
        """Held while `child`'s ending is recorded: entered once every running child recorded ending before
        it has ended; on leaving, `child` has ended."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._may_end(child))
            try:
                yield
            finally:
                self._running.discard(child)
                self._ended.add(child)
                self._changed.notify_all()

    async def abandon(self, child: str) -> None:
        """`child`'s replay raised before its turn: nobody waits for it any more."""
        async with self._changed:
            self._running.discard(child)
            self._changed.notify_all()

    def _may_end(self, child: str) -> bool:
        earlier = self._order[: self._order.index(child)] if child in self._order else []
        return not any(c in self._running and c not in self._ended for c in earlier)
