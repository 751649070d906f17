"""`ReplayLog`: an EventLog served from a recording, for one replayed message.

Reads see the recorded entries the replayed handler is meant to read back (a hook's ``shown``); appends
are kept for the comparison and answered with the sequence the recorded log had at that point, so what a
handler stores about its log (plexus.llm keeps the journal's end in the agent's state) comes out as
recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plexus.core import entry_from_json
from plexus.runtime.store._eventlog import EventLog, LogRecord

__all__ = ["ReplayLog"]


class ReplayLog(EventLog[Any]):
    """``recorded``: (seq, index, raw entry, shown) of the message's entries, in log order."""

    def __init__(self, recorded: Sequence[tuple[int, int, bytes, bool]]) -> None:
        # No stream behind it: EventLog's own state is never used, every method it has is overridden here.
        self._recorded = list(recorded)
        self.appended: list[Any] = []
        self._expected = [i for i, r in enumerate(self._recorded) if not r[3]]

    async def last_seq(self) -> int:
        return self._recorded[-1][0] if self._recorded else 0

    async def read(self, from_seq: int = 0, to_seq: int | None = None) -> list[LogRecord[Any]]:
        stop = to_seq if to_seq is not None else await self.last_seq()
        return [
            LogRecord(seq, index, entry_from_json(raw))
            for seq, index, raw, shown in self._recorded
            if shown and from_seq <= seq <= stop
        ]

    async def append(
        self,
        entries: Sequence[Any],
        expected_seq: int,
        *,
        msg_id: str | None = None,
        timeout: float | None = None,
    ) -> int:
        self.appended.extend(entries)
        made = len(self.appended)
        if made < len(self._expected):
            # The log's end as recorded just before the next entry the handler appends itself.
            return self._recorded[self._expected[made] - 1][0]
        return max(await self.last_seq(), 1) + max(0, made - len(self._expected))
