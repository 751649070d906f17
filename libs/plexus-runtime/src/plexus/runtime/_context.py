"""`Context`: what a handler can see and do while it handles one message.

The Context is a thin, per-message view; the work is done by a `ContextBackend` (the worker). The seams the
orchestrator fills — `spawn` and budget accounting (`usage`) — go through a `Supervisor` (see
`_supervisor.py`), so a budget-aware cluster replaces the local default without touching agents.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from plexus.core import (
    AgentId,
    AgentStep,
    BaseBlock,
    CancellationController,
    CancellationHandle,
    Cost,
    KernelMessage,
    TopicId,
    Usage,
)

from .store._schedules import (
    InvalidScheduleError,
    ScheduleId,
    ScheduleOp,
    cron_spec,
    every_spec,
    op_id,
    reminder_subject,
    timer_spec,
    timer_subject,
    tombstone,
)

if TYPE_CHECKING:
    from .store._eventlog import EventLog
    from .store._schedule_store import ScheduleStore
    from .wire._envelope import RunInfo

__all__ = ["Context", "ContextBackend"]


class ContextBackend(Protocol):
    """Implemented by the worker: the side effects a Context delegates."""

    async def send_from(
        self, ctx: Context, blocks: Sequence[BaseBlock], recipient: AgentId, timeout_s: float
    ) -> list[BaseBlock]: ...

    async def publish_from(self, ctx: Context, blocks: Sequence[BaseBlock], topic: TopicId) -> None: ...

    async def progress_from(
        self, ctx: Context, step: AgentStep, content: Sequence[BaseBlock], metadata: Mapping[str, Any]
    ) -> None: ...

    async def stream_from(self, ctx: Context, text: str, reasoning: bool) -> None: ...

    async def usage_from(self, ctx: Context, usage: Usage, turns: int) -> None: ...

    async def check_from(self, ctx: Context, max_age_s: float) -> None: ...

    async def spawn_from(
        self,
        ctx: Context,
        child: AgentId,
        blocks: Sequence[BaseBlock],
        priority: int | None,
        timeout_s: float,
    ) -> list[BaseBlock]: ...

    async def checkpoint_from(self, ctx: Context) -> None: ...

    async def reload(self, ctx: Context) -> None: ...

    def event_log_for(self, agent_id: AgentId) -> EventLog[Any]: ...

    def schedule_store(self) -> ScheduleStore: ...


@dataclass(eq=False)
class Context:
    """Per-message handler context. Create via the worker, never directly in production code."""

    agent_id: AgentId
    message_id: str
    sender: AgentId | None
    topic: TopicId | None
    run: RunInfo | None
    is_rpc: bool
    attempt: int
    _backend: ContextBackend = field(repr=False)
    _controller: CancellationController = field(default_factory=CancellationController, repr=False)
    #: Entries recorded by the handler; appended to the EventLog with the message's own entries, atomically.
    pending_entries: list[KernelMessage] = field(default_factory=list, repr=False)
    #: Children spawned so far by this handler run: their ordinal makes their run ids deterministic.
    _spawned: int = field(default=0, repr=False)
    #: Set by `await_approval`: the decisions this message's reply waits for.
    awaiting: list[str] | None = field(default=None, repr=False)
    #: Set by `await_approval`: the id of the suspension it waits in, when the agent names one.
    suspension: str | None = field(default=None, repr=False)
    #: Timer and reminder writes recorded by the handler: its commit writes them when it succeeds.
    pending_schedules: list[ScheduleOp] = field(default_factory=list, repr=False)
    _schedule_ops: int = field(default=0, repr=False)
    #: The account's stored timers and reminders, counted once per handler run (the limit's check).
    _stored_schedules: int | None = field(default=None, repr=False)

    @property
    def cancellation(self) -> CancellationHandle:
        """Fires on run cancellation, deadline, or worker shutdown; `check()` raises CancellationError."""
        return self._controller.handle

    @property
    def run_id(self) -> str | None:
        return self.run.run_id if self.run else None

    async def send(
        self, blocks: Sequence[BaseBlock], recipient: AgentId, *, timeout: float = 30.0
    ) -> list[BaseBlock]:
        """RPC another agent; raises its typed error. Carries this message's run info."""
        return await self._backend.send_from(self, blocks, recipient, timeout)

    async def publish(self, blocks: Sequence[BaseBlock], topic: TopicId) -> None:
        await self._backend.publish_from(self, blocks, topic)

    async def emit_progress(
        self,
        step: AgentStep | str,
        content: Sequence[BaseBlock] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Publish an `AgentProgress` on the run tree's subject (captured for replay).

        Returns once published; its JetStream ack is awaited with the handler's others when the handler
        returns, and a refused event fails the message then."""
        await self._backend.progress_from(self, AgentStep(step), content, metadata or {})

    async def stream(self, text: str, *, reasoning: bool = False) -> None:
        """Emit a token delta on this agent's stream subject (core NATS only: live viewers, no replay)."""
        await self._backend.stream_from(self, text, reasoning)

    async def usage(
        self, usage: Usage | None = None, *, tokens: int = 0, cost_usd: float = 0.0, turns: int = 0
    ) -> None:
        """Report consumption (the seed's ExecutionTracker.consume); raises BudgetExhaustedError when over."""
        if usage is None:
            # Plain totals (the seed's consume(tokens, cost, turns)) count as output tokens.
            usage = Usage(output_tokens=tokens, cost=Cost(amount=cost_usd) if cost_usd else None)
        await self._backend.usage_from(self, usage, turns)

    async def check(self, *, max_age: float = 0.0) -> None:
        """Raise if this agent should stop: the tree's budget is exhausted (BudgetExhaustedError), the run
        was cancelled or passed its deadline (CancellationError); park here while preempted.

        ``max_age`` (seconds): in an orchestrated run, accept the tree's budget as this process last verified
        it (a `usage` or `check` of any agent of the same tree) if that was at most ``max_age`` ago, instead
        of reading it from the server; cancellation and preemption are always as known now. 0 (the default)
        reads it every time."""
        if max_age < 0:
            raise ValueError(f"max_age must be >= 0, got {max_age}")
        await self._backend.check_from(self, max_age)
        self.cancellation.check()

    async def spawn(
        self,
        child: AgentId,
        blocks: Sequence[BaseBlock],
        *,
        priority: int | None = None,
        timeout: float = 300.0,
    ) -> list[BaseBlock]:
        """Start `child` as a sub-run of this run and await its reply (SpawnDenied when over budget)."""
        return await self._backend.spawn_from(self, child, blocks, priority, timeout)

    def await_approval(self, ids: Sequence[str], *, suspension: str | None = None) -> None:
        """End this message waiting for decisions on `ids` (e.g. tool calls) rather than done: an orchestrated
        run it started gets status ``awaiting_approval`` (not ``completed``) when the handler returns, and
        `Runtime.approve` delivers each decision to this agent inside the same run.

        ``suspension`` names the wait when ids recur over the agent's life (a model reusing ``call_0``): a
        run then takes a new suspension's ids as undecided, and its decisions name it (``suspension`` in the
        decision's data). Report the same id again while the same wait goes on."""
        if not ids or not all(isinstance(i, str) and i for i in ids):
            raise ValueError("await_approval needs at least one non-empty id")
        if suspension is not None and (not isinstance(suspension, str) or not suspension):
            raise ValueError("await_approval's suspension must be a non-empty string")
        self.awaiting = list(ids)
        self.suspension = suspension

    def record(self, entry: KernelMessage) -> None:
        """Add an entry to this agent's EventLog; written atomically with the message's own entries."""
        self.pending_entries.append(entry)

    async def checkpoint(self) -> None:
        """Persist the agent's state now (long handlers); it is also saved after the handler returns."""
        await self._backend.checkpoint_from(self)

    async def restore(self) -> None:
        """Put the agent's state back to its last checkpoint (discarding changes made since)."""
        await self._backend.reload(self)

    @property
    def event_log(self) -> EventLog[Any]:
        return self._backend.event_log_for(self.agent_id)

    # -- timers and reminders (docs/schedules.md) ----------------------------------------------------------

    def _op_id(self) -> str:
        # Derived from the message: a handler run again for it writes the same ids (de-duplicated).
        self._schedule_ops += 1
        return op_id(str(self.agent_id), self.message_id, self._schedule_ops)

    async def _check_room(self, store: ScheduleStore) -> None:
        if store.max_pending is None:
            return
        if self._stored_schedules is None:
            self._stored_schedules = await store.stored()
        store.check_room(self._stored_schedules, self.pending_schedules)

    def _record(self, op: ScheduleOp) -> None:
        # One write per subject, the last one: the commit writes them concurrently.
        self.pending_schedules = [p for p in self.pending_schedules if p.subject != op.subject]
        self.pending_schedules.append(op)

    async def schedule_message(
        self,
        target: AgentId,
        blocks: Sequence[BaseBlock],
        *,
        after: datetime.timedelta | None = None,
        at: datetime.datetime | None = None,
    ) -> ScheduleId:
        """Deliver `blocks` to durable agent `target`'s inbox once, `after` from now or `at` (aware; a time
        in the past fires at once), as a message of this run. Written by this message's commit: nothing is
        scheduled if the handler fails, and a handler run again for the message schedules it once.
        Raises InvalidScheduleError (bad time, stateless target), AgentNotFoundError or TooManyTimersError
        (the tenant's limit) at once."""
        spec = timer_spec(after, at)
        store = self._backend.schedule_store()
        await self._check_room(store)
        schedule_id = ScheduleId(self._op_id())
        subjects = store.connection.subjects_for(self.agent_id.namespace)
        op = await store.envelope_op(
            subject=timer_subject(subjects, self.agent_id.type, self.agent_id.key, schedule_id),
            op_id=schedule_id,
            target=target,
            sender=self.agent_id,
            blocks=blocks,
            run=self.run,
            spec=spec,
        )
        self._record(op)
        return schedule_id

    async def cancel_schedule(self, schedule_id: ScheduleId | str) -> None:
        """Cancel a timer this agent scheduled (with this message's commit); one that fired or was
        cancelled already is left as it is."""
        store = self._backend.schedule_store()
        subjects = store.connection.subjects_for(self.agent_id.namespace)
        subject = timer_subject(subjects, self.agent_id.type, self.agent_id.key, str(schedule_id))
        self._record(tombstone(subject, self._op_id()))

    async def set_reminder(
        self,
        name: str,
        *,
        every: datetime.timedelta | None = None,
        cron: str | None = None,
        tz: str | None = None,
        blocks: Sequence[BaseBlock] = (),
    ) -> None:
        """Deliver `blocks` to this agent every `every` (at least 1 s), or at each `cron` time (5 fields, or 6
        with seconds first, in time zone `tz`, default UTC), until `clear_reminder(name)`. One reminder per
        name: setting it again replaces it. Written by this message's commit."""
        if (every is None) == (cron is None):
            raise InvalidScheduleError("give exactly one of every= and cron=")
        if every is not None:
            if tz is not None:
                raise InvalidScheduleError("tz applies to cron reminders only")
            spec, zone = every_spec(every), None
        else:
            assert cron is not None
            spec, zone = cron_spec(cron, tz)
        if not isinstance(name, str) or not name:
            raise InvalidScheduleError("a reminder needs a non-empty name")
        store = self._backend.schedule_store()
        await self._check_room(store)
        subjects = store.connection.subjects_for(self.agent_id.namespace)
        op = await store.envelope_op(
            subject=reminder_subject(subjects, self.agent_id.type, self.agent_id.key, name),
            op_id=self._op_id(),
            target=self.agent_id,
            sender=self.agent_id,
            blocks=blocks,
            run=self.run,
            spec=spec,
            tz=zone,
        )
        self._record(op)

    async def clear_reminder(self, name: str) -> None:
        """Stop this agent's reminder `name` (with this message's commit); an unknown name is ignored."""
        store = self._backend.schedule_store()
        subjects = store.connection.subjects_for(self.agent_id.namespace)
        subject = reminder_subject(subjects, self.agent_id.type, self.agent_id.key, name)
        self._record(tombstone(subject, self._op_id()))

    async def reminders(self) -> list[str]:
        """The names of this agent's reminders as stored now (this message's own changes are not yet)."""
        return await self._backend.schedule_store().reminders(self.agent_id)
