"""The loop's journal: every completed model turn and tool step, stored before the loop acts on it.

A crash-retried handler (same message id) reads its journal back and takes completed steps from it instead
of calling the model or the tools again: a crash never pays for a model call twice.

Where: the agent's own EventLog cannot take these appends, because the worker commits each handled message
to it fenced by the sequence it cached at activation (an append in the middle of the handler would make that
commit fail). The journal is therefore a sibling EventLog, ``<type>.llm-journal/<key>``, written only by the
handler of that agent key. Each handled message records where the journal ended in the agent's state, so a
replay reads only the entries since.

An append is sent at once and stored in the background; `Journal.settle` waits for it. The loop settles
before anything that must follow a stored step (a tool runs, the next model call, the handler's end), so
the CPU work in between (usage, records, the next request) overlaps the server's round trip without
widening the window in which a crash re-pays a turn (the ack arrives when it arrives either way).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Literal

from pydantic import Field

from plexus.core import (
    AgentId,
    FinishReason,
    Item,
    KernelMessage,
    Usage,
    register_message_type,
)
from plexus.runtime import Context
from plexus.runtime.kernel import EventLog

__all__ = ["JOURNAL_SEQ_KEY", "Journal", "LlmStep", "collect_outcome"]

#: Agent state key holding the journal's last sequence when the previous message was committed.
JOURNAL_SEQ_KEY = "plexus.llm.journal_seq"
_JOURNAL_SUFFIX = ".llm-journal"


@register_message_type
class LlmStep(KernelMessage):
    """One completed step of the loop while handling ``message_id``: a model turn or the tool results."""

    type: Literal["llm.step"] = "llm.step"
    message_id: str
    step: int = Field(ge=0)
    item: Item
    usage: Usage | None = None
    finish_reason: FinishReason | None = None


def journal_id(agent_id: AgentId) -> AgentId:
    return AgentId(agent_id.type + _JOURNAL_SUFFIX, agent_id.key, agent_id.namespace)


class Journal:
    """The journal of one handling of one message."""

    def __init__(self, log: EventLog[Any], message_id: str, seq: int, replay: dict[int, LlmStep]) -> None:
        self._log = log
        self._message_id = message_id
        self.seq = seq
        self.replay = replay
        self._pending: asyncio.Future[int] | None = None

    @classmethod
    async def open(cls, ctx: Context, state: dict[str, Any], known_end: int | None = None) -> Journal:
        """The journal for ``ctx``'s message. ``known_end``: where this activation last saw the journal end
        after a completed message; when it equals the state's mark nothing was written since (this
        activation is the only writer), so the server round trips are skipped."""
        # The public Context exposes the EventLog of its own agent only; a copy pointed at the journal's
        # id reaches the sibling log through the same backend (plexus.runtime has no API for this yet).
        log = dataclasses.replace(ctx, agent_id=journal_id(ctx.agent_id)).event_log
        since = int(state.get(JOURNAL_SEQ_KEY, 0))
        replay: dict[int, LlmStep] = {}
        if known_end is not None and known_end == since:
            return cls(log, ctx.message_id, since, replay)
        seq = await log.last_seq()
        if seq > since:
            for record in await log.read(from_seq=since + 1, to_seq=seq):
                entry = record.entry
                if isinstance(entry, LlmStep) and entry.message_id == ctx.message_id:
                    replay[entry.step] = entry
        return cls(log, ctx.message_id, seq, replay)

    def replayed(self, step: int) -> LlmStep | None:
        return self.replay.get(step)

    async def append(
        self, step: int, item: Item, usage: Usage | None = None, finish_reason: FinishReason | None = None
    ) -> None:
        """Send one completed step (after the previous one is stored: each append is fenced by its seq)."""
        entry = LlmStep(
            message_id=self._message_id, step=step, item=item, usage=usage, finish_reason=finish_reason
        )
        expected = await self.settle()
        self._pending = asyncio.ensure_future(self._log.append([entry], expected_seq=expected))

    async def settle(self) -> int:
        """Wait until every sent step is stored (raising what its append raised); the journal's last seq."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.seq = await pending
        return self.seq

    def abandon(self) -> asyncio.Future[int] | None:
        """The handling failed: a step still in flight lands or fails on its own (a retry reads the journal
        back either way, once it is over: returned, for the next handling to wait for); its outcome is
        collected so a failure is not reported as never retrieved."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.add_done_callback(collect_outcome)
        return pending


def collect_outcome(future: asyncio.Future[Any]) -> None:
    """Retrieve a future's outcome nobody awaits (so a failure is not reported as never retrieved)."""
    if not future.cancelled():
        future.exception()
