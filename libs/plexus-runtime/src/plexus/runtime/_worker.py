"""The worker: hosts an App's agent types, pulls their inboxes and runs handlers.

The worker loop only decodes, routes to per-key mailboxes, runs the interceptor chain and commits
(EventLog → checkpoint → reply → ack). Everything else — time limits, tracing, budgets, retries — is an
interceptor; partition ownership lives in `_partitions.py`; activations in `_activation.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any, Literal

import msgspec
from nats.aio.msg import Msg

from plexus.core import (
    AgentId,
    BaseBlock,
    ConcurrentAppendError,
    HandlerError,
    KernelError,
    ProtocolError,
    ReplyMessage,
    RunMessageReceived,
)

from ._activation import Activation, ActivationTable
from ._agent import AgentType, App
from ._artifacts import PayloadTooLargeError
from ._backend import WorkerBackend
from ._checkpoints import CheckpointConflictError, CheckpointStore
from ._client import Runtime
from ._cluster import ClusterSupervisor, OrchestratorClient, RunControl
from ._context import Context
from ._control import RetryInterceptor, RunControlInterceptor
from ._deadletter import dead_letter
from ._envelope import (
    HDR_MSG_ID,
    Envelope,
    Reply,
    WireError,
    blocks_from_payload,
    decode_envelope,
    decode_reply,
    encode_reply,
    payload_from_blocks,
)
from ._interceptors import (
    DeadlineInterceptor,
    HandleInput,
    TracingInterceptor,
    chain,
)
from ._leases import LeaseManager
from ._orchestration import CancelNotice, FinishedReport, PauseNotice
from ._partitions import PartitionOwner
from ._registry import AgentTypeInfo, WorkerInfo
from ._subjects import SubjectTooLongError, checkpoint_key, escape_token, inbox_partition
from ._supervisor import new_root_run
from ._work import WorkerConfig, _envelope_problem, _is_run_entry, _JsDelivery, _reply_text, _Work

__all__ = ["Worker", "WorkerConfig"]


log = logging.getLogger("plexus.worker")


class Worker:
    """Serves `app` on an existing runtime connection. `start()`, then `stop()` (graceful) or `kill`."""

    def __init__(self, app: App, runtime: Runtime, config: WorkerConfig | None = None) -> None:
        self.app = app
        self.rt = runtime
        self.config = config or WorkerConfig()
        self.worker_id = self.config.worker_id or f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.started_at = time.time()
        self._inflight = asyncio.Semaphore(self.config.concurrency * 4)
        from ._mailbox import Mailboxes

        self._mailboxes: Mailboxes[AgentId, _Work] = Mailboxes(self._run_one, self.config.concurrency)
        self._activations = ActivationTable(
            CheckpointStore(runtime.topology.checkpoints),
            lambda aid: checkpoint_key(aid.namespace, aid.type, aid.key),
            lambda aid: runtime.event_log(aid).last_seq(),
        )
        self._owners: dict[str, PartitionOwner] = {}
        self._unacked: set[_Work] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[Any] = []
        self._control_subs: list[Any] = []
        self.control = RunControl(runtime)
        self.orchestrator = OrchestratorClient(runtime)
        self._backend = WorkerBackend(self, ClusterSupervisor(runtime, self.control, self.orchestrator))
        self._run_control = RunControlInterceptor(self.control)
        # Outermost first: the trace spans everything; run control races the whole retry loop against
        # the tree's cancellation; retries wrap each attempt, which the deadline bounds.
        interceptors = [
            TracingInterceptor(),
            self._run_control,
            RetryInterceptor(self.orchestrator, self._backend.reload),
            DeadlineInterceptor(),
            *app.interceptors,
        ]
        self._handle_chain = chain(interceptors, "handle", self._invoke)
        self._stopping = False
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        for agent_type in self.app.types.values():
            await self.rt.registry.register_type(
                AgentTypeInfo(
                    namespace=agent_type.namespace,
                    type=agent_type.name,
                    description=agent_type.description,
                    capabilities=list(agent_type.capabilities),
                    durable=agent_type.durable,
                    partitions=self.rt.partitions,
                    metadata=dict(agent_type.metadata),
                )
            )
        await self._heartbeat()
        leases = LeaseManager(self.rt.topology.leases, self.worker_id, self.config.lease_ttl_s)
        for agent_type in self.app.types.values():
            if agent_type.durable:
                self._owners[agent_type.name] = PartitionOwner(
                    js=self.rt.js,
                    leases=leases,
                    subjects=self.rt.subjects_for(agent_type.namespace),
                    stream=self.rt.topology.names.inbox_stream,
                    agent_type=agent_type.name,
                    partitions=self.rt.partitions,
                    worker_id=self.worker_id,
                    live_workers=self._live_worker_ids(agent_type),
                    dispatch=self._dispatch_durable,
                    slots=self._inflight,
                    ack_wait_s=self.config.ack_wait_s,
                    max_ack_pending=self.config.concurrency * 8,
                    on_lost=self._partition_lost(agent_type.name),
                    on_taken=self._partition_taken(agent_type.name),
                )
            else:
                subjects = self.rt.subjects_for(agent_type.namespace)
                sub = await self.rt.nc.subscribe(
                    subjects.ephemeral_wildcard(agent_type.name),
                    queue=subjects.ephemeral_queue(agent_type.name),
                    cb=self._on_ephemeral,
                )
                self._subs.append(sub)
        for owner in self._owners.values():
            await owner.rebalance()
        ns = escape_token(self.app.namespace)
        self._subs.append(
            await self.rt.nc.subscribe(f"{self.rt.prefix}.{ns}.ctl.cancel.*", cb=self._on_cancel)
        )
        self._subs.append(await self.rt.nc.subscribe(f"{self.rt.prefix}.{ns}.ctl.pause.*", cb=self._on_pause))
        self._tasks.append(asyncio.create_task(self._maintain(), name="worker-maintain"))
        self._tasks.append(asyncio.create_task(self._keep_alive(), name="worker-keepalive"))

    def _live_worker_ids(self, agent_type: AgentType) -> Any:
        ns_type = f"{agent_type.namespace}/{agent_type.name}"

        async def live() -> list[str]:
            return [w.worker_id for w in await self.rt.registry.live_workers(ns_type)]

        return live

    async def _heartbeat(self) -> None:
        await self.rt.registry.heartbeat(
            WorkerInfo(
                worker_id=self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                started_at=self.started_at,
                heartbeat_at=time.time(),
                types=[f"{t.namespace}/{t.name}" for t in self.app.types.values()],
                concurrency=self.config.concurrency,
            )
        )

    async def _maintain(self) -> None:
        """Heartbeats, lease renewal/rebalancing and passivation, on one timer."""
        period = min(self.config.heartbeat_s, self.config.lease_ttl_s / 3)
        # Runs on through a graceful stop (which ends it at the end): the leases of partitions whose
        # in-flight work is still draining must stay renewed, or another worker would run that work again.
        # It stops on a flag, not only on cancel: nats-py can swallow a CancelledError inside a publish.
        while not self._closed:
            await asyncio.sleep(period)
            try:
                await self._heartbeat()
                for owner in self._owners.values():
                    await owner.rebalance()
                await self._passivate()
            except Exception:  # keep maintaining through transient NATS errors
                log.exception("worker maintenance round failed")

    def _forget_partition(self, agent_type: str, partition: int) -> None:
        for activation in self._activations.of_type(agent_type):
            if inbox_partition(activation.agent_id.key, self.rt.partitions) == partition:
                self._activations.drop(activation.agent_id)

    def _partition_taken(self, agent_type: str) -> Callable[[int], None]:
        return lambda partition: self._forget_partition(agent_type, partition)

    def _partition_lost(self, agent_type: str) -> Callable[[int], None]:
        def lost(partition: int) -> None:
            # Another worker owns it now: queued work of it is skipped (not acked; the owner's fresh consumer
            # has it) and cached activations are dropped, so no second activation lives on here.
            log.warning(
                "partition %s/%d lost; dropping its activations and queued work", agent_type, partition
            )
            self._forget_partition(agent_type, partition)

        return lost

    async def _keep_alive(self) -> None:
        """Every ack_wait/3, tell JetStream that every fetched, unacked message (queued in a mailbox or
        running) is still being worked on, so a long handler or a long queue is never redelivered while this
        worker lives. One sweeper for all messages: no task per message on the hot path."""
        interval = max(self.config.ack_wait_s / 3.0, 0.05)
        while not self._closed:
            await asyncio.sleep(interval)
            for work in list(self._unacked):
                with contextlib.suppress(Exception):  # acked meanwhile, or reconnecting: next round
                    await work.msg.in_progress()

    async def _on_cancel(self, msg: Msg) -> None:
        try:
            notice = msgspec.json.decode(msg.data, type=CancelNotice)
        except msgspec.DecodeError:
            log.warning("ignoring a malformed cancel notice on %s", msg.subject)
            return
        self.control.on_cancel(notice)
        self._run_control.cancel_tree(notice.root_id, notice.reason)

    async def _on_pause(self, msg: Msg) -> None:
        try:
            self.control.on_pause(msgspec.json.decode(msg.data, type=PauseNotice))
        except msgspec.DecodeError:
            log.warning("ignoring a malformed pause notice on %s", msg.subject)

    async def _passivate(self) -> None:
        busy = self._mailboxes.busy_keys
        victims = self._activations.idle(self.config.idle_passivate_s, busy)
        excess = len(self._activations) - self.config.max_activations
        if excess > 0:
            victims += self._activations.oldest(excess, busy)
        for activation in victims:
            with contextlib.suppress(Exception):
                await activation.agent.on_passivate()
            self._activations.drop(activation.agent_id)

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
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        with contextlib.suppress(Exception):
            await self.rt.registry.remove_worker(self.worker_id)

    # -- intake ---------------------------------------------------------------------------------------
    async def _dispatch_durable(self, partition: int, msg: Msg, done: Callable[[], None]) -> None:
        work = await self._intake(msg, durable=True)
        if work is None:
            self._inflight.release()
            done()
            return
        work.done = done
        work.partition = partition
        self._unacked.add(work)
        self._mailboxes.put(work.agent_id, work)

    async def _on_ephemeral(self, msg: Msg) -> None:
        work = await self._intake(msg, durable=False)
        if work is not None:
            self._mailboxes.put(work.agent_id, work)

    async def _intake(self, msg: Msg, *, durable: bool) -> _Work | None:
        """Decode and route; bad input is dead-lettered (and answered when a reply address is known)."""
        try:
            env = decode_envelope(msg.data, msg.headers)
        except WireError as exc:
            await self._dead_letter(msg, exc.reason, str(exc), None)
            return None
        try:
            agent_id = AgentId.parse(env.target)
        except ValueError as exc:
            await self._dead_letter(msg, "target", str(exc), env)
            return None
        agent_type = self.app.get(agent_id.type)
        if agent_type is None or agent_type.namespace != agent_id.namespace:
            from plexus.core import AgentNotFoundError

            await self._dead_letter(msg, "unregistered", f"no agent type {agent_id.type!r} here", env)
            await self._reply(
                env, msg, Reply(id=env.id, ok=False, error=AgentNotFoundError(agent_id).to_wire())
            )
            return None
        if not self._arrived_for(msg.subject, agent_id, durable):
            # Running it would activate the agent from another key's partition: two activations at once.
            await self._dead_letter(msg, "target", f"{env.target!r} arrived on {msg.subject!r}", env)
            return None
        try:
            checkpoint_key(agent_id.namespace, agent_id.type, agent_id.key)
        except SubjectTooLongError as exc:  # its activation could never load or save a checkpoint
            await self._dead_letter(msg, "target", str(exc), env)
            return None
        problem = _envelope_problem(env)
        if problem is not None:
            # Caught here, not when the EventLog entry fails to validate at commit: that would leave the
            # message unacked and redeliver it forever.
            await self._dead_letter(msg, "schema", problem, env)
            return None
        if env.run is None:  # a foreign sender may omit it: the message starts a run, as a client's does
            env = msgspec.structs.replace(env, run=new_root_run())
        return _Work(msg=msg, env=env, agent_type=agent_type, agent_id=agent_id, durable=durable)

    def _arrived_for(self, subject: str, agent_id: AgentId, durable: bool) -> bool:
        """Whether `subject` is the inbox of `agent_id` (the one its partition and mailbox follow)."""
        subjects = self.rt.subjects_for(agent_id.namespace)
        try:
            if durable:
                agent_type, key, _ = subjects.parse_partitioned(subject)
            else:
                agent_type, key = subjects.parse_ephemeral(subject)
        except ValueError:
            return False
        return (agent_type, key) == (agent_id.type, agent_id.key)

    async def _dead_letter(self, msg: Msg, reason: str, detail: str, env: Envelope | None) -> None:
        if not await self._dlq_copy(msg, reason, detail, env):
            return
        error = ProtocolError(f"message rejected ({reason}): {detail}")
        if env is not None and reason != "unregistered":
            await self._reply(env, msg, Reply(id=env.id, ok=False, error=error.to_wire()))
        elif env is None and msg.reply and not msg.reply.startswith("$JS."):
            # A core request names its reply address outside the body: answer even undecodable bytes.
            msg_id = (msg.headers or {}).get(HDR_MSG_ID, "")
            await self._publish_reply(
                msg.reply, encode_reply(Reply(id=msg_id, ok=False, error=error.to_wire()))
            )
        if msg.reply and msg.reply.startswith("$JS.ACK"):
            await msg.ack()

    async def _dlq_copy(self, msg: Msg, reason: str, detail: str, env: Envelope | None) -> bool:
        """Publish a copy of `msg` with the reason to the dead-letter stream; False if that failed."""
        return await dead_letter(
            self.rt, self.rt.subjects_for(self.app.namespace), self.worker_id, msg, reason, detail, env
        )

    # -- handling -------------------------------------------------------------------------------------
    async def _run_one(self, agent_id: AgentId, work: _Work) -> None:
        try:
            owner = self._owners.get(work.agent_type.name) if work.durable else None
            if owner is not None and work.partition is not None and not owner.serves(work.partition):
                return  # its partition moved on while it was queued: the new owner runs it, we must not
            await self._handle_in_order(work)
        except (ConcurrentAppendError, CheckpointConflictError) as exc:
            # Another activation of this agent committed first: we are a zombie. Drop our copy and leave
            # the message unacked; the partition's owner handles it.
            log.warning("fenced %s: %s", agent_id, exc)
            self._activations.drop(agent_id)
        finally:
            if work.durable:
                self._inflight.release()
                self._unacked.discard(work)
                work.done()

    async def _handle_in_order(self, work: _Work, attempts: int = 3) -> None:
        """Handle `work`, retrying a failed commit in place (the key's next message waits: FIFO holds); after
        `attempts` the message is dead-lettered (`commit_failed`), answered with a typed error and acked, so
        a poison message never loops forever."""
        for attempt in range(1, attempts + 1):
            try:
                await self._handle(work)
                return
            except (ConcurrentAppendError, CheckpointConflictError):
                raise
            except Exception as exc:
                log.warning("handling %s failed (attempt %d/%d): %r", work.env.id, attempt, attempts, exc)
                self._activations.drop(work.agent_id)  # the next attempt starts from the last checkpoint
                if attempt == attempts or self._stopping:
                    if not work.durable or self._stopping:
                        return  # not acked: redelivered to whoever runs next
                    error = (
                        exc if isinstance(exc, KernelError) else HandlerError(str(exc), type(exc).__name__)
                    )
                    if await self._dlq_copy(work.msg, "commit_failed", repr(exc), work.env):
                        await self._reply(
                            work.env, work.msg, Reply(id=work.env.id, ok=False, error=error.to_wire())
                        )
                        await self._ack(work)
                    return
                await asyncio.sleep(0.2 * 2 ** (attempt - 1))

    async def _handle(self, work: _Work) -> None:
        env, agent_type, agent_id = work.env, work.agent_type, work.agent_id
        activation = await self._activations.activate(agent_id, agent_type)
        seen, stored_reply = activation.reply_for(env.id)
        if seen:  # redelivered after a crash between commit and ack: answer from the checkpoint
            if stored_reply is not None and work.reply_to:
                await self._publish_reply(work.reply_to, stored_reply)
            if stored_reply is not None and not await self._report_finished(env, decode_reply(stored_reply)):
                return  # not acked: redelivered later, when the orchestrator may be back
            await self._ack(work)
            return
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
        try:
            reply = await self._execute(activation, work, ctx)
        finally:
            self._backend.unbind(ctx)
        # A run's entry message keeps its reply even without a caller: a redelivery re-sends the run's end.
        encoded = encode_reply(reply) if work.reply_to or _is_run_entry(env) else None
        if encoded is not None and len(encoded) > self.rt.nc.max_payload:
            # Undeliverable as is (the publish would fail and the caller time out): answer a typed error.
            too_large = PayloadTooLargeError(len(encoded), self.rt.nc.max_payload)
            reply = Reply(id=env.id, ok=False, error=too_large.to_wire(), handled_by=self.worker_id)
            encoded = encode_reply(reply)
        if work.durable:
            await self._commit(activation, work, ctx, reply, encoded)
        if encoded is not None and work.reply_to:
            await self._publish_reply(work.reply_to, encoded)
        if not await self._report_finished(env, reply):
            return  # not acked: redelivered after ack_wait and answered from the checkpoint, report included
        await self._ack(work)

    async def _report_finished(self, env: Envelope, reply: Reply) -> bool:
        """Tell the orchestrator a run ended, when this message was a run's entry (its spawn or start).

        False when the report could not be delivered: the caller must not ack, so the run's end is never
        lost with the message."""
        run = env.run
        if run is None or not _is_run_entry(env):
            return True
        error_type = (reply.error or {}).get("error_type")
        status: Literal["completed", "failed", "cancelled"] = (
            "completed" if reply.ok else "cancelled" if error_type == "CancellationError" else "failed"
        )
        report = FinishedReport(run_id=run.run_id, status=status, output=reply.payload, error=reply.error)
        try:
            await self.orchestrator.call("finished", report, dict, namespace=self.app.namespace)
        except KernelError as exc:
            log.warning("could not report the end of run %s (will retry on redelivery): %s", run.run_id, exc)
            return False
        return True

    async def _execute(self, activation: Activation, work: _Work, ctx: Context) -> Reply:
        env = work.env
        try:
            blocks = await self.rt.artifacts.resolve(blocks_from_payload(env.payload))
            result = await self._handle_chain(
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
            payload = payload_from_blocks(await self.rt.artifacts.offload(result or []))
            return Reply(id=env.id, ok=True, payload=payload, handled_by=self.worker_id)
        except KernelError as exc:
            if getattr(exc, "dead_letter", False):  # retries exhausted: keep the message with its context
                await self._dlq_copy(work.msg, "retries_exhausted", str(exc), env)
                await exc.crash_report()  # type: ignore[attr-defined]
            return Reply(id=env.id, ok=False, error=exc.to_wire(), handled_by=self.worker_id)
        except Exception as exc:
            error = HandlerError(str(exc), type(exc).__name__, str(work.agent_id))
            return Reply(id=env.id, ok=False, error=error.to_wire(), handled_by=self.worker_id)

    async def _invoke(self, inp: HandleInput) -> list[BaseBlock] | None:
        return await inp.agent.on_message(inp.blocks, inp.ctx)

    async def _commit(
        self, activation: Activation, work: _Work, ctx: Context, reply: Reply, encoded: bytes | None
    ) -> None:
        """EventLog, then checkpoint (CAS), so the ack below only follows durable effects."""
        env = work.env
        run_id = env.run.run_id if env.run else env.id
        entries: list[Any] = [
            RunMessageReceived(
                run_id=run_id, agent_id=str(work.agent_id), message_id=env.id, sender=env.sender
            ),
            *ctx.pending_entries,
        ]
        if reply.ok and reply.payload is not None:
            text = _reply_text(reply)
            if text is not None:
                entries.append(ReplyMessage(text=text))
        async with activation.log_lock:
            activation.log_seq = await self._backend.event_log_for(work.agent_id).append(
                entries, expected_seq=activation.log_seq
            )
        activation.remember(env.id, encoded, reply_budget=self.rt.nc.max_payload // 4)
        await self._activations.save(activation)

    async def _ack(self, work: _Work) -> None:
        if work.durable:
            await work.msg.ack()

    async def _reply(self, env: Envelope, msg: Msg, reply: Reply) -> None:
        # The same preference as `_Work.reply_to`: a core requester waits on msg.reply, not on the body's.
        core = None if (msg.reply or "").startswith("$JS.") else msg.reply
        target = core or env.reply_to
        if target:
            await self._publish_reply(target, encode_reply(reply))

    async def _publish_reply(self, target: str, data: bytes) -> None:
        with contextlib.suppress(Exception):  # a caller that went away is not our failure
            await self.rt.nc.publish(target, data)
