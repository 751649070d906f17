"""The worker's implementation of `ContextBackend`: what `ctx.send`, `ctx.emit_progress`, … actually do.

Each `Context` call with an interception point (send, publish, usage, spawn, emit_progress) runs through the
chain of the app's interceptors that override it; with none, the call goes straight to its terminal. `usage`
also runs the built-in `MetricsInterceptor`, innermost, while metrics are enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from plexus.core import (
    AgentId,
    AgentStep,
    BaseBlock,
    CancellationError,
    KernelError,
    MessageId,
    RunChildCompleted,
    RunChildSpawned,
    TopicId,
    Usage,
    delta_event_json,
    progress_event_json,
)
from plexus.runtime._context import Context
from plexus.runtime.client._supervisor import LocalSupervisor, Supervisor, child_run_id, new_root_run
from plexus.runtime.interceptors._interceptors import (
    ProgressInput,
    PublishInput,
    SendInput,
    SpawnInput,
    UsageInput,
    chain,
)
from plexus.runtime.ops._telemetry import metrics_enabled
from plexus.runtime.store._artifacts import check_payload_size
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._eventlog import EventLog
from plexus.runtime.store._schedule_store import ScheduleStore
from plexus.runtime.wire._orchestration import FinishedReport

from ._commit import CheckpointTaken
from .pipeline._metrics import MetricsInterceptor

if TYPE_CHECKING:
    from plexus.runtime._app import App
    from plexus.runtime.client._calls import ClientCalls
    from plexus.runtime.client._cluster import OrchestratorClient

    from ._activation import Activation, ActivationTable

__all__ = ["WorkerBackend"]

#: Every this many progress events of one handler, emitting one yields to the event loop (see below).
_PROGRESS_BURST = 8

#: Before a handler's effect: None when it may act now, else what to await first (it raises to stop it).
LeaseGate = Callable[[Context], Awaitable[None] | None]


def _open(ctx: Context) -> None:
    return None


class WorkerBackend:
    """What a worker's handlers do through their `Context`, given the worker's parts (never the worker): the
    `Connection`, and the client's `calls` where a handler's call goes on through the client."""

    def __init__(
        self,
        connection: Connection,
        calls: ClientCalls,
        app: App,
        orchestrator: OrchestratorClient,
        activations: ActivationTable,
        supervisor: Supervisor | None = None,
        gate: LeaseGate = _open,
        schedules: ScheduleStore | None = None,
    ) -> None:
        self.connection = connection
        #: Every effect of a handler (send, publish, progress, stream, usage, spawn, checkpoint) passes it
        #: first: a worker that stalled past its partition's lease must not act for the partition's new owner.
        self._gate = gate
        self.calls = calls
        self.orchestrator = orchestrator
        self.activations = activations
        self.supervisor: Supervisor = supervisor or LocalSupervisor()
        self._bound: dict[int, Activation] = {}
        self.schedules = schedules or ScheduleStore(connection)
        # Progress events published but not yet acknowledged, per bound Context (see `progress_stored`).
        self._progress_acks: dict[int, list[asyncio.Future[Any]]] = {}
        self._acks = connection.acks
        icpt = app.interceptors
        # Outbound sends and publications continue into the Runtime's own (client) chain.
        self._send = chain(icpt, "send", calls.send)
        self._publish = chain(icpt, "publish", calls.publish)
        self._usage = chain(icpt, "usage", self._usage_terminal)
        # While an exporter is installed, `usage` also runs the built-in metrics (`plexus.budget.tokens`),
        # innermost: it counts the usage that reaches the run tree, once per call.
        self._usage_metered = chain([*icpt, MetricsInterceptor()], "usage", self._usage_terminal)
        self._spawn = chain(icpt, "spawn", self._spawn_terminal)
        self._progress = chain(icpt, "emit_progress", self._progress_terminal)

    def bind(self, ctx: Context, activation: Activation) -> None:
        self._bound[id(ctx)] = activation

    def unbind(self, ctx: Context) -> None:
        self._bound.pop(id(ctx), None)
        # The handler failed before `progress_stored`: its message runs again anyway.
        self._acks.forget(self._progress_acks.pop(id(ctx), ()))

    async def progress_stored(self, ctx: Context) -> None:
        """Wait for the JetStream acks of every progress event `ctx`'s handler emitted.

        `emit_progress` publishes without waiting for its ack (the events of one connection are stored in
        order), so a handler's steps do not each pay a round trip; the worker calls this when the handler
        returns, before its result is committed or answered. A progress event JetStream did not store
        therefore still fails the message (it runs again), as an awaited publish did.
        """
        acks = self._progress_acks.pop(id(ctx), None)
        if acks:
            await self._acks.wait(acks)

    def _may_act(self, ctx: Context) -> Awaitable[None] | None:
        """Before every effect: None when `ctx`'s handler may act now, else what to await first (the lease
        gate). RuntimeError once the handler has returned: a task it left running acts no more (the gate
        knows only running handlers)."""
        self._activation(ctx)
        return self._gate(ctx)

    def _activation(self, ctx: Context) -> Activation:
        try:
            return self._bound[id(ctx)]
        except KeyError:
            raise RuntimeError("this Context is no longer active (its handler returned)") from None

    def _run(self, ctx: Context) -> Any:
        return ctx.run or new_root_run()

    async def send_from(
        self, ctx: Context, blocks: Sequence[BaseBlock], recipient: AgentId, timeout_s: float
    ) -> list[BaseBlock]:
        if timeout_s <= 0:
            raise ValueError(f"timeout must be positive, got {timeout_s}")
        if (wait := self._may_act(ctx)) is not None:
            await wait
        inp = SendInput(
            blocks=list(blocks),
            recipient=recipient,
            sender=ctx.agent_id,
            message_id=str(MessageId.new()),
            timeout_s=timeout_s,
            headers={},
            run=ctx.run,
        )
        result: list[BaseBlock] = await self._send(inp)
        return result

    async def publish_from(self, ctx: Context, blocks: Sequence[BaseBlock], topic: TopicId) -> None:
        if (wait := self._may_act(ctx)) is not None:
            await wait
        inp = PublishInput(
            blocks=list(blocks),
            topic=topic,
            sender=ctx.agent_id,
            message_id=str(MessageId.new()),
            headers={},
            run=ctx.run,
        )
        await self._publish(inp)

    async def progress_from(
        self, ctx: Context, step: AgentStep, content: Sequence[BaseBlock], metadata: Mapping[str, Any]
    ) -> None:
        if (wait := self._may_act(ctx)) is not None:
            await wait
        await self._progress(ProgressInput(ctx=ctx, step=step, content=list(content), metadata=metadata))

    async def _progress_terminal(self, inp: ProgressInput) -> None:
        ctx, step, content, metadata = inp.ctx, inp.step, inp.content, inp.metadata
        activation = self._activation(ctx)
        activation.progress_seq += 1
        run = self._run(ctx)
        subject = self.connection.subjects_for(ctx.agent_id.namespace).progress(
            run.root_id, ctx.agent_id.type, ctx.agent_id.key
        )
        # One JetStream publish both captures the event for replay and delivers it to live subscribers. Its
        # ack is awaited once for all the handler's events (`progress_stored`), not here.
        data = progress_event_json(
            agent_id=str(ctx.agent_id),
            step=step,
            content=content,
            run_id=run.run_id,
            root_id=run.root_id,
            parent_id=run.parent_id,
            depth=run.depth,
            seq=activation.progress_seq,
            ts=time.time(),
            metadata=metadata,
        )
        check_payload_size(len(data), self.connection.nc.max_payload)
        # Sent now, in order with the handler's other messages (its stream deltas, sends): only the ack waits.
        ack = await self._acks.publish(subject, data)
        acks = self._progress_acks.setdefault(id(ctx), [])
        acks.append(ack)
        if len(acks) % _PROGRESS_BURST == 0:
            # A handler emitting events back to back never awaits in between: let the publishes go out
            # now and then, so viewers still follow them live. (Others await I/O between events anyway.)
            await asyncio.sleep(0)

    async def stream_from(self, ctx: Context, text: str, reasoning: bool) -> None:
        if (wait := self._may_act(ctx)) is not None:
            await wait
        agent_id = ctx.agent_id
        subject = self.connection.subjects_for(agent_id.namespace).stream(agent_id.type, agent_id.key)
        await self.connection.nc.publish(subject, delta_event_json(text, reasoning=reasoning))

    async def usage_from(self, ctx: Context, usage: Usage, turns: int) -> None:
        if (wait := self._may_act(ctx)) is not None:
            await wait
        call = self._usage_metered if metrics_enabled() else self._usage
        await call(UsageInput(ctx=ctx, usage=usage, turns=turns))

    async def _usage_terminal(self, inp: UsageInput) -> None:
        await self.supervisor.consume(self._run(inp.ctx), inp.ctx.agent_id, inp.usage, inp.turns)

    async def check_from(self, ctx: Context, max_age_s: float) -> None:
        await self.supervisor.check(self._run(ctx), max_age_s)

    async def spawn_from(
        self,
        ctx: Context,
        child: AgentId,
        blocks: Sequence[BaseBlock],
        priority: int | None,
        timeout_s: float,
    ) -> list[BaseBlock]:
        if (wait := self._may_act(ctx)) is not None:
            await wait
        inp = SpawnInput(ctx=ctx, child=child, blocks=list(blocks), priority=priority, timeout_s=timeout_s)
        result: list[BaseBlock] = await self._spawn(inp)
        return result

    async def _spawn_terminal(self, inp: SpawnInput) -> list[BaseBlock]:
        ctx, child, blocks, priority, timeout_s = inp.ctx, inp.child, inp.blocks, inp.priority, inp.timeout_s
        if timeout_s <= 0:
            raise ValueError(f"timeout must be positive, got {timeout_s}")
        activation = self._activation(ctx)
        parent = self._run(ctx)
        ordinal = ctx._spawned  # taken before any await: concurrent spawns number in call order
        ctx._spawned += 1
        # No slot for a child nobody can run: AgentNotFoundError before the tree's budget is touched.
        await self.calls.host_for(child, time.monotonic() + min(timeout_s, 30.0))
        child_run = await self.supervisor.spawn(
            parent, ctx.agent_id, child, priority, child_run_id(ctx.message_id, ordinal, parent.run_id)
        )
        # The two calls above can take up to 30 s: the lease is asked again before the effects that follow
        # (a stall in between must not record and enqueue a child after the partition moved on).
        if (wait := self._gate(ctx)) is not None:
            await wait
        log = self.event_log_for(ctx.agent_id)
        # child.spawned is durable before the child is enqueued, so a crash never leaves an unrecorded child.
        spawned = RunChildSpawned(
            run_id=parent.run_id,
            agent_id=str(ctx.agent_id),
            child_run_id=child_run.run_id,
            child_agent_id=str(child),
        )
        async with activation.log_turn():
            if activation.agent_type.durable:
                activation.log_seq = await log.append([spawned], expected_seq=activation.log_seq)
            else:  # no single activation, no tracked sequence: append after whatever is there
                await log.append_with_retry(lambda _seq: [spawned])
        status = "completed"
        try:
            # Through the client's send chain only (the app's interceptors saw this call as a spawn).
            result: list[BaseBlock] = await self.calls.send(
                SendInput(
                    blocks=list(blocks),
                    recipient=child,
                    sender=ctx.agent_id,
                    message_id=str(MessageId.new()),
                    timeout_s=timeout_s,
                    headers={},
                    run=child_run,
                    kind="spawn",
                )
            )
            return result
        except KernelError as exc:
            ended: Literal["failed", "cancelled"] = (
                "cancelled" if isinstance(exc, CancellationError) else "failed"
            )
            status = ended
            if child_run.orchestrated:
                # Idempotent: if the child ran, its worker already reported; if its message never got through
                # (or we gave up waiting), this frees its slot instead of leaking it until the tree ends.
                report = FinishedReport(run_id=child_run.run_id, status=ended, error=exc.to_wire())
                with contextlib.suppress(KernelError):
                    await self.orchestrator.call("finished", report, dict, namespace=child.namespace)
            raise
        finally:
            await self.supervisor.finished(child_run, status)
            ctx.record(
                RunChildCompleted(
                    run_id=parent.run_id,
                    agent_id=str(ctx.agent_id),
                    child_run_id=child_run.run_id,
                    child_agent_id=str(child),
                    status=status,
                )
            )

    async def reload(self, ctx: Context) -> None:
        """Put the agent back to its last checkpointed state (before a handler retry)."""
        activation = self._activation(ctx)
        activation.agent.load_state(msgspec.json.decode(activation.saved_state))

    async def checkpoint_from(self, ctx: Context) -> None:
        if (wait := self._may_act(ctx)) is not None:
            await wait
        activation = self._activation(ctx)
        if activation.agent_type.durable:
            # Fenced like a commit: a zombie fails this append before its checkpoint could replace the base
            # of the deltas the owner has logged since (commits write no checkpoint as a rule).
            taken = CheckpointTaken(message_id=ctx.message_id)
            async with activation.log_turn():
                activation.log_seq = await self.connection.event_log(ctx.agent_id).append(
                    [taken], expected_seq=activation.log_seq
                )
        await self.activations.save(activation)

    def event_log_for(self, agent_id: AgentId) -> EventLog[Any]:
        return self.connection.event_log(agent_id)

    def schedule_store(self) -> ScheduleStore:
        return self.schedules
