"""The worker: hosts an App's agent types, pulls their inboxes and runs handlers.

The worker loop only decodes, routes to per-key mailboxes, runs the interceptor chain and commits
(EventLog → checkpoint → reply → ack). Everything else — time limits, tracing, budgets, retries — is an
interceptor; what happens around one message's handling (its lease, fenced commits, retries in place) is a
step that ends it with a `Settlement`, which `_settle` alone carries out (`pipeline/`, whose docstring states
the whole order); partition ownership lives in `_partitions.py`; activations in `_activation.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, HandlerError, KernelError
from plexus.runtime._app import App
from plexus.runtime._context import Context
from plexus.runtime.client._client import Runtime
from plexus.runtime.client._cluster import ClusterSupervisor, RunControl
from plexus.runtime.interceptors._interceptors import HandleInput, compose
from plexus.runtime.ops._telemetry import INSTRUMENTS, metrics_enabled
from plexus.runtime.store._artifacts import PayloadTooLargeError
from plexus.runtime.store._checkpoints import CheckpointStore
from plexus.runtime.store._consumer_records import ConsumerRecords
from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.store._outage import is_nats_outage
from plexus.runtime.store._schedule_store import ScheduleStore
from plexus.runtime.wire._envelope import (
    RESEND,
    Envelope,
    Reply,
    decode_reply,
    encode_reply,
    payload_from_blocks,
)
from plexus.runtime.wire._subjects import checkpoint_key, escape_token

from ._activation import Activation, ActivationTable
from ._backend import WorkerBackend
from ._commit import Committer
from ._config import WorkerConfig, with_lease_ttl
from ._gc import GcThresholds
from ._intake import Intake
from ._partitions import PartitionOwner
from ._runend import RunEndReporter
from ._topics import TopicReceiver
from ._upkeep import Upkeep
from ._work import _is_run_entry, _JsDelivery, run_stoppable
from .pipeline._chains import HandleChains
from .pipeline._commit_retry import CommitRetry
from .pipeline._fencing import Fencing
from .pipeline._retry import RetriesExhausted
from .pipeline._steps import LeaseLost
from .pipeline._work import ACK, LEAVE, Outcome, Settlement, Work

__all__ = ["Worker"]


log = logging.getLogger("plexus.worker")


class Worker:
    """Serves `app` on an existing runtime connection. `start()`, then `stop()` (graceful) or `kill`."""

    def __init__(self, app: App, runtime: Runtime, config: WorkerConfig | None = None) -> None:
        # The one place that reads the Runtime: its parts get the `Connection`, and the client's calls.
        self.app = app
        self.rt = runtime
        self.connection = connection = runtime.connection
        self.config = with_lease_ttl(config or WorkerConfig(), connection.topology.leases_ttl_s)
        self.worker_id = self.config.worker_id or f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.started_at = time.time()
        self._inflight = asyncio.Semaphore(self.config.concurrency * 4)
        from ._mailbox import Mailboxes

        self._mailboxes: Mailboxes[AgentId, Work] = Mailboxes(self._run_one, self.config.concurrency)
        self._activations = ActivationTable(
            CheckpointStore(
                connection.topology.checkpoints,
                bucket=connection.topology.names.checkpoints_bucket,
                get_last_msg=connection.gets.get_last_msg,
            ),
            lambda aid: checkpoint_key(aid.namespace, aid.type, aid.key),
            lambda aid: connection.event_log(aid).last_seq(),
            lambda aid, seq: self._committer.logged_since(aid, seq),
        )
        # One store for the handlers' schedule calls and the commits that write them: its count of stored
        # schedules (for the tenant's limit) follows this worker's own writes.
        schedules = ScheduleStore(connection, max_pending=self.config.max_pending_schedules)
        self._committer = Committer(
            connection, self._activations, self._work_gate, self._lease_left, schedules=schedules
        )
        #: Durable work by its handler's context while it runs: `_invoke` looks at its lease once more.
        self._starting: dict[int, Work] = {}
        self._intake = Intake(app, connection, self.worker_id)
        self._topics = TopicReceiver(app, connection, self._intake, self._mailboxes)

        self._owners: dict[str, PartitionOwner] = {}
        self._unacked: set[Work] = set()
        self._upkeep = Upkeep(
            connection,
            app,
            self.config,
            self.worker_id,
            started_at=self.started_at,
            owners=self._owners,
            unacked=self._unacked,
            activations=self._activations,
            mailboxes=self._mailboxes,
            topic_groups=self._topics.groups,
        )
        self._subs: list[Any] = []
        self._control_subs: list[Any] = []
        self.control = RunControl(connection)
        self.orchestrator = runtime.orchestrator  # the client `connection.orchestrator` is
        self._run_end = RunEndReporter(self.orchestrator, app.namespace)
        self._backend = WorkerBackend(
            connection,
            runtime.worker_calls(),
            app,
            self.orchestrator,
            self._activations,
            ClusterSupervisor(connection, self.control, self.orchestrator),
            self._lease_gate,
            schedules,
        )
        self._chains = HandleChains(
            self.control, self.orchestrator, self._backend.reload, app.interceptors, self._invoke
        )
        self._run_control = self._chains.run_control
        # Around each message's handling, outermost first: its lease and fenced commits, then retries
        # (the whole order: `pipeline/__init__.py`).
        drop = self._activations.drop
        fencing = Fencing(self._may_start, self._holds_partition, drop)
        retry = CommitRetry(self.config.unavailable_retry_s, self._may_start, lambda: self._stopping, drop)
        self._steps = compose([fencing.process, retry.process], self._handle)
        # Core NATS work holds no lease and commits nothing, so there is nothing for `Fencing` to sort out.
        self._core_steps = compose([retry.process], self._handle)
        self._stopping = False
        self._gc_held = False

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        # Interceptors are ready before the first message can arrive (they may open their own resources).
        connection = self.connection
        for interceptor in self.app.interceptors:
            await interceptor.start(connection, self.worker_id)
        ns = escape_token(self.app.namespace)
        # Control subscriptions come first and live until the drain ends (see `stop`): no handler may start
        # before cancel and pause broadcasts reach this worker (they are not replayed), and draining
        # handlers must still be cancellable and pausable. They once came after the first rebalance, which
        # takes seconds on R3: a run preempted meanwhile was never paused (found by the e2e suite on R3).
        for verb, cb in (
            ("cancel", self._run_control.on_cancel_notice),
            ("pause", self._run_control.on_pause_notice),
        ):
            self._control_subs.append(
                await connection.nc.subscribe(f"{connection.prefix}.{ns}.ctl.{verb}.*", cb=cb)
            )
        await self._upkeep.register()
        leases = LeaseManager(connection.topology.leases, self.worker_id, self.config.lease_ttl_s)
        durable_types = sum(1 for t in self.app.types.values() if t.durable)
        # Every partition of every durable type may be ours: each must be able to hold a pull request open.
        slots_per_partition = self.config.concurrency * 4 // max(1, durable_types * connection.partitions)
        max_batch = max(1, min(64, slots_per_partition))
        for agent_type in self.app.types.values():
            if agent_type.durable:
                self._owners[agent_type.name] = PartitionOwner(
                    nc=connection.nc,
                    js=connection.js,
                    leases=leases,
                    consumers=ConsumerRecords(connection.topology.consumers, agent_type.namespace),
                    subjects=connection.subjects_for(agent_type.namespace),
                    stream=connection.topology.names.inbox_stream,
                    agent_type=agent_type.name,
                    partitions=connection.partitions,
                    worker_id=self.worker_id,
                    live_workers=self._upkeep.live_workers(agent_type),
                    dispatch=self._dispatch_durable,
                    slots=self._inflight,
                    ack_wait_s=self.config.ack_wait_s,
                    max_ack_pending=self.config.concurrency * 8,
                    on_lost=self._upkeep.partition_lost(agent_type.name),
                    on_taken=self._upkeep.partition_taken(agent_type.name),
                    max_batch=max_batch,
                )
            else:
                subjects = connection.subjects_for(agent_type.namespace)
                sub = await connection.nc.subscribe(
                    subjects.ephemeral_wildcard(agent_type.name),
                    queue=subjects.ephemeral_queue(agent_type.name),
                    cb=self._on_ephemeral,
                )
                self._subs.append(sub)
        self._subs.extend(await self._topics.subscribe())
        # Announced only once the server has every subscription: a client that finds this worker in the
        # registry must not meet "no responders" (an AgentNotFoundError) on its first send.
        await connection.nc.flush()
        await self._upkeep.start()
        # Last: a start that failed before here leaves the process's collector as it found it.
        self._gc_held = GcThresholds.acquire(self.config.gc_threshold)

    async def stop(self, drain_timeout: float = 30.0) -> None:
        """Graceful: stop pulling, finish in-flight work, release partitions, deregister."""
        self._stopping = True
        for owner in self._owners.values():
            await owner.stop_pulling()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.drain()
        # Cancel/pause broadcasts must still reach the handlers that are draining.
        finished = await self._mailboxes.join(drain_timeout)
        for sub in self._control_subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if not finished:
            # Unfinished messages are not acked: JetStream hands them to the next owner.
            await self._mailboxes.cancel()
        for owner in self._owners.values():
            await owner.release_all()
        await self._upkeep.stop()
        self._intake.recent_replies.close()
        with contextlib.suppress(Exception):
            await self.connection.registry.remove_worker(self.worker_id)
        for interceptor in reversed(self.app.interceptors):
            try:
                await interceptor.stop()
            except Exception:  # one interceptor's failure to stop must not keep the others open
                log.exception("interceptor %s failed to stop", type(interceptor).__name__)
        if self._gc_held:
            self._gc_held = False
            GcThresholds.release()

    # -- intake ---------------------------------------------------------------------------------------
    async def _dispatch_durable(self, partition: int, msg: Msg, done: Callable[[], None]) -> None:
        queued = False
        try:
            work = await self._intake.read(msg, durable=True)
            if work is not None:
                work.done = done
                work.partition = partition
                self._unacked.add(work)
                self._mailboxes.put(work.agent_id, work)
                queued = True
        finally:
            if not queued:  # in `finally`: whatever happened, the message's slot is never leaked
                self._inflight.release()
                done()

    async def _on_ephemeral(self, msg: Msg) -> None:
        work = await self._intake.read(msg, durable=False)
        if work is not None:
            self._mailboxes.put(work.agent_id, work)

    async def _dlq_copy(self, msg: Msg, reason: str, detail: str, env: Envelope | None) -> bool:
        return await self._intake.dlq_copy(msg, reason, detail, env)

    # -- handling -------------------------------------------------------------------------------------
    async def _run_one(self, agent_id: AgentId, work: Work) -> None:
        settlement = LEAVE
        try:
            settlement = await (self._steps if work.durable else self._core_steps)(work)
        finally:
            try:
                await self._settle(work, settlement)
            finally:
                if work.durable:
                    self._inflight.release()
                    self._unacked.discard(work)
                    work.done()

    async def _settle(self, work: Work, settlement: Settlement) -> None:
        """Carry out how the message ended: the only place a handled message is acked, naked or
        dead-lettered."""
        outcome = settlement.outcome
        if outcome is Outcome.ACK:
            await self._ack(work)
        elif outcome is Outcome.RETRY_AFTER:
            if work.durable:  # (core NATS work is not redelivered: nothing to do)
                self._unacked.discard(work)  # first: no keep-alive may follow the nak (see `_keep_alive`)
                await work.msg.nak(delay=settlement.delay_s)
        elif outcome is Outcome.DEAD_LETTER:
            if not await self._dlq_copy(work.msg, settlement.reason, settlement.detail, work.env):
                return  # not acked: redelivered and dead-lettered again once the DLQ takes it
            if settlement.error is not None:  # (None: the caller has its answer already)
                reply = Reply(id=work.env.id, ok=False, error=settlement.error.to_wire())
                await self._intake.reply(work.env, work.msg, reply)
            await self._ack(work)
        # LEAVE: not acked; JetStream redelivers it to the partition's owner after ack_wait

    def _before_takeover(self, work: Work) -> bool:
        owner, p = self._owners.get(work.agent_type.name), work.partition  # (None for core NATS work)
        return owner is not None and p is not None and owner.stored_before_taken(p, work.delivery[1])

    def _may_start(self, work: Work) -> bool:
        """Whether `work` may (still) start here: its partition's lease is certainly ours."""
        owner = self._owners.get(work.agent_type.name) if work.durable else None
        if owner is None or work.partition is None:
            return True
        return not work.lease_lost and owner.may_start(work.partition)

    def _lease_gate(self, ctx: Context) -> Awaitable[None] | None:
        """None while `ctx`'s handler may act (not durable work, or its lease certainly ours), else the
        question to the store (`_confirm_lease`)."""
        work = self._starting.get(id(ctx))
        return None if work is None else self._work_gate(work)

    def _work_gate(self, work: Work) -> Awaitable[None] | None:
        """None while durable `work` may act (its lease certainly ours), else the store's answer to await."""
        return None if self._may_start(work) else self._confirm_lease(work)

    def _lease_left(self, work: Work) -> float | None:
        """Seconds `work`'s partition lease is still certainly ours (at least a millisecond: a commit that
        asks this has just passed the gate); None for work without a lease."""
        owner = self._owners.get(work.agent_type.name) if work.durable else None
        if owner is None or work.partition is None:
            return None
        return max(owner.fresh_until.get(work.partition, 0.0) - time.monotonic(), 0.001)

    async def _confirm_lease(self, work: Work) -> None:
        owner = self._owners.get(work.agent_type.name)
        p = work.partition
        if not work.lease_lost and owner is not None and p is not None and await owner.confirm(p):
            return
        # Lost (or no answer): the new owner runs the message; this handler acts no more, commits nothing.
        work.lease_lost = True
        raise LeaseLost(f"{work.agent_id}: the lease on its partition ({p}) is no longer certainly ours")

    def _holds_partition(self, work: Work) -> bool:
        """Whether this worker still owns `work`'s partition (False for core NATS work)."""
        owner = self._owners.get(work.agent_type.name) if work.durable else None
        return owner is not None and work.partition is not None and owner.may_start(work.partition)

    async def _handle(self, work: Work) -> Settlement:
        env, agent_type, agent_id = work.env, work.agent_type, work.agent_id
        activation = await self._activations.activate(agent_id, agent_type)
        seen, stored_reply = activation.reply_for(env.id)
        if RESEND in env.metadata and stored_reply is None:
            await self._intake.answer_unkept_resend(work, seen)
            return ACK
        redelivered = work.durable and work.delivery[0] > 1  # (core NATS work is never redelivered)
        if redelivered and metrics_enabled():
            INSTRUMENTS.redeliveries.add(1, {"agent_type": agent_type.name})
        # A message in `activation.logged` is a half-commit (logged, never checkpointed): its log entry does
        # not mean it was committed, so it runs again. One this agent does not remember may still have been
        # committed by an earlier delivery whose ack was lost: redelivered by this consumer, or stored
        # before this worker took the partition (the previous owner's consumer is gone, ours counts 1).
        if not seen and env.id not in activation.logged and (redelivered or self._before_takeover(work)):
            published = work.msg.metadata.timestamp
            if published is not None and await self._committer.committed(agent_id, env.id, published):
                log.warning(
                    "%s: %s was committed already (its ack was lost); not run again", agent_id, env.id
                )
                seen = True
        if seen:  # redelivered after a crash between commit and ack: answer from the checkpoint
            if stored_reply is None:
                return ACK
            return await self._end_run_then_reply(work, decode_reply(stored_reply), stored_reply)
        ctx = Context(
            agent_id=agent_id,
            message_id=env.id,
            sender=AgentId.parse(env.sender) if env.sender else None,
            topic=None,
            run=env.run,
            is_rpc=work.reply_to is not None,
            attempt=env.attempt,
            _backend=self._backend,
        )
        self._backend.bind(ctx, activation)
        if work.durable:
            self._starting[id(ctx)] = work
        try:
            reply = await self._execute(activation, work, ctx)
        finally:
            self._backend.unbind(ctx)
            self._starting.pop(id(ctx), None)
        if work.lease_lost:
            raise LeaseLost()
        if not reply.ok and work.durable:
            # A failed handling leaves no half-applied state: the agent goes back to its last commit (as a
            # Dapr actor's or a Temporal workflow's would); its error reply is still committed, so a
            # redelivery is answered instead of run again.
            activation.agent.load_state(msgspec.json.decode(activation.saved_state))
        # A run's entry message keeps its reply even without a caller: a redelivery re-sends the run's end.
        encoded = encode_reply(reply) if work.reply_to or _is_run_entry(env) else None
        max_payload = self.connection.nc.max_payload
        if encoded is not None and len(encoded) > max_payload:
            # Undeliverable as is (the publish would fail and the caller time out): answer a typed error.
            too_large = PayloadTooLargeError(len(encoded), max_payload)
            reply = Reply(id=env.id, ok=False, error=too_large.to_wire(), handled_by=self.worker_id)
            encoded = encode_reply(reply)
        if work.durable:
            await self._committer.commit(activation, work, ctx, reply, encoded)
        return await self._end_run_then_reply(work, reply, encoded)

    async def _end_run_then_reply(self, work: Work, reply: Reply, encoded: bytes | None) -> Settlement:
        """Report the end of `work`'s run (if it started one), then send its `encoded` reply; settled as the
        report says (`_runend.py`): ACK, RETRY_AFTER when the orchestrator did not take it (the redelivery
        is answered from the checkpoint and reports again), DEAD_LETTER when it refused it.

        The report comes before the caller hears of the run's end: it frees the run's spawn slot, and a
        parent that spawns its next child on this reply must find that slot free."""
        settlement = await self._run_end.report(work, reply)
        if encoded is not None and work.reply_to:
            await self._intake.publish_reply(work.reply_to, encoded)
        return settlement

    async def _execute(self, activation: Activation, work: Work, ctx: Context) -> Reply:
        env = work.env
        try:
            blocks = await self.connection.artifacts.resolve(work.blocks)
            handle = self._chains.for_envelope(env)(
                HandleInput(
                    agent=activation.agent,
                    agent_type=work.agent_type,
                    blocks=blocks,
                    ctx=ctx,
                    envelope=env,
                    delivery=_JsDelivery(work.msg, self.config.ack_wait_s) if work.durable else None,
                    headers=dict(work.msg.headers or {}),
                )
            )
            result = await run_stoppable(work, handle) if work.durable else await handle
            payload = payload_from_blocks(await self.connection.artifacts.offload(result or []))
            return Reply(
                id=env.id,
                ok=True,
                payload=payload,
                handled_by=self.worker_id,
                awaiting=ctx.awaiting,
                suspension=ctx.suspension,
            )
        except RetriesExhausted as exhausted:  # keep the message with its context, then tell the orchestrator
            # Not a DEAD_LETTER settlement: the copy must exist before the crash report and the run's failure
            # can be seen (a settlement is carried out after the commit and the run-end report), and the
            # error reply is committed, so a redelivery is answered from the checkpoint and acked.
            await self._dlq_copy(work.msg, "retries_exhausted", str(exhausted.error), env)
            await exhausted.report()
            return Reply(id=env.id, ok=False, error=exhausted.error.to_wire(), handled_by=self.worker_id)
        except KernelError as exc:
            if is_nats_outage(exc) and time.monotonic() < work.outage_until:
                raise  # the orchestrator did not answer (e.g. for a spawn): run again, see below
            return Reply(id=env.id, ok=False, error=exc.to_wire(), handled_by=self.worker_id)
        except Exception as exc:
            if is_nats_outage(exc) and time.monotonic() < work.outage_until:
                # The handler met an outage through its context (a progress publish, a spawn with no stream
                # leader): the cluster's failure, not the handler's. `CommitRetry` runs it again.
                raise
            error = HandlerError(str(exc), type(exc).__name__, str(work.agent_id))
            return Reply(id=env.id, ok=False, error=error.to_wire(), handled_by=self.worker_id)

    async def _invoke(self, inp: HandleInput) -> list[BaseBlock] | None:
        work = self._starting.get(id(inp.ctx))
        if work is not None and not self._may_start(work):
            # The last look before the handler's code: the process may have been frozen (SIGSTOP, a stalled
            # VM) since the start check, past its lease; the new owner runs the message, this handler must
            # not begin (its commit would be fenced, its other effects would not). Ends as a lost lease.
            work.lease_lost = True
            return None
        result = await inp.agent.on_message(inp.blocks, inp.ctx)
        await self._backend.progress_stored(inp.ctx)  # its progress is stored before its result counts
        return result

    async def _ack(self, work: Work) -> None:
        if work.durable:
            await work.msg.ack()
