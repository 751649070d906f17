"""`RunsClient`: progress and token streams, and orchestrated runs (start, get, wait, result, approve, cancel,
export, fork), all of which go through the orchestrator or the runs bucket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection, Sequence
from typing import TypeVar, overload

import msgspec
from nats.aio.msg import Msg
from nats.js import api as js_api
from pydantic import BaseModel

from plexus.core import (
    AgentId,
    AgentProgress,
    BaseBlock,
    ExecutionBudget,
    KernelError,
    Priority,
    ReplyTimeoutError,
    RetryPolicy,
    RunId,
    SpawnBudget,
    StreamEvent,
    stream_event_from_json,
)
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._follow import Follower
from plexus.runtime.store._outage import is_unavailable
from plexus.runtime.wire._envelope import blocks_from_payload, payload_from_blocks
from plexus.runtime.wire._orchestration import (
    TERMINAL,
    ApproveRequest,
    CancelRequest,
    GetRunRequest,
    RunRecord,
    RunStatus,
    StartRunReply,
    StartRunRequest,
    run_key,
)
from plexus.runtime.wire._recording import Recording
from plexus.runtime.wire._subjects import escape_token

from ._export import export_run
from ._fork import ForkEdit, ForkPoint, fork_run
from ._typed import typed_reply

__all__ = ["RunsClient"]

#: While a run is awaited its record is read again this often (seconds), in case a write's message was lost.
_REREAD_S = 2.0
#: After a notice that the run ended, the first wait before reading the stream again (a write in flight).
_SOON_S = 0.02


class _Status(msgspec.Struct):
    status: str = ""


_STATUS = msgspec.json.Decoder(type=_Status)


def _status_of(data: bytes) -> str | None:
    """The status a notice's record claims (None when it is not a record: read the stream anyway)."""
    try:
        return _STATUS.decode(data).status
    except msgspec.DecodeError:
        return None


_T = TypeVar("_T", bound=BaseModel)


class RunsClient:
    """Progress and token streams, and orchestrated runs (start, get, wait, result, approve, cancel, export,
    fork): requests to the orchestrator and reads of the runs bucket. `Runtime` holds one and offers its
    methods as its own."""

    def __init__(self, connection: Connection, closed: asyncio.Event, identity: str | None = None) -> None:
        self.connection = connection
        #: Set when the NATS connection is closed for good: the streams end.
        self.closed = closed
        #: Who this connection acts as (its NATS user), recorded with its approval decisions; None: unknown.
        self.identity = identity

    # -- observation ----------------------------------------------------------------------------------
    async def progress(self, run_id: str) -> AsyncIterator[AgentProgress]:
        """Every progress event of the run tree rooted at `run_id`: replayed from its start, then live."""
        subject = self.connection.subjects.progress_tree(run_id)
        follower: Follower[Msg] = Follower(self.closed)
        sub = await self.connection.js.subscribe(
            subject,
            ordered_consumer=True,
            deliver_policy=js_api.DeliverPolicy.ALL,
            stream=self.connection.topology.names.progress_stream,
            cb=follower.deliver,
        )
        try:
            async for msg in follower:
                yield AgentProgress.model_validate_json(msg.data)
        finally:
            follower.end()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def stream(self, agent_id: AgentId) -> AsyncIterator[StreamEvent]:
        """Live token deltas of one agent (core NATS: no replay)."""
        follower: Follower[Msg] = Follower(self.closed)
        sub = await self.connection.nc.subscribe(
            self.connection.subjects_for(agent_id.namespace).stream(agent_id.type, agent_id.key),
            cb=follower.deliver,
        )
        try:
            async for msg in follower:
                yield stream_event_from_json(msg.data)
        finally:
            follower.end()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # -- orchestrated runs ---------------------------------------------------------------------------
    async def start_run(
        self,
        agent_id: AgentId,
        blocks: Sequence[BaseBlock],
        *,
        budget: ExecutionBudget | None = None,
        spawn_budget: SpawnBudget | None = None,
        retry: RetryPolicy | None = None,
        priority: int = int(Priority.NORMAL),
        session_id: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """Start a run tree rooted at `agent_id` under the orchestrator; returns the run id.

        Budgets, spawn slots, retries, cancellation and the deadline are enforced cluster-wide from then on.
        Passing the same `run_id` again is idempotent (the first run is returned).
        """
        request = StartRunRequest(
            agent_id=str(agent_id),
            payload=payload_from_blocks(await self.connection.artifacts.offload(list(blocks))),
            budget=budget.model_dump(mode="json") if budget else None,
            spawn_budget=(spawn_budget or SpawnBudget()).model_dump(mode="json"),
            retry=retry.model_dump(mode="json") if retry else None,
            priority=priority,
            session_id=session_id,
            run_id=run_id or str(RunId.new()),  # chosen here so a retried start is idempotent
        )
        reply = await self.connection.orchestrator.call(
            "start", request, StartRunReply, namespace=agent_id.namespace
        )
        return reply.run_id

    async def export_run(self, run_id: str, *, partial: bool = False) -> Recording:
        """The whole tree of ``run_id`` as a `Recording` (docs/timetravel.md); `RunNotEndedError` while it
        runs unless ``partial``. Reads only: the source run is not changed."""
        return await export_run(self.connection, run_id, partial=partial)

    async def fork_run(
        self,
        run_id: str,
        at: ForkPoint | int | None = None,
        edit: ForkEdit | str | None = None,
        *,
        budget: ExecutionBudget | None = None,
        spawn_budget: SpawnBudget | None = None,
        retry: RetryPolicy | None = None,
        priority: int | None = None,
    ) -> str:
        """Start a new run tree at a point of one agent's history in `run_id` (``at``: a `ForkPoint`, or a
        turn of the run's own agent), optionally edited (``edit``: a `ForkEdit`, or the new user message);
        returns the new root's run id. Its budgets are its own (the source root's limits unless given);
        the source is only read (docs/timetravel.md, "Fork")."""
        return await fork_run(
            self, run_id, at, edit, budget=budget, spawn_budget=spawn_budget, retry=retry, priority=priority
        )

    async def get_run(self, run_id: str) -> RunRecord:
        """The persisted state of one run (root or child): status, reason, tree links, usage, attempts."""
        return await self.connection.orchestrator.call("get", GetRunRequest(run_id=run_id), RunRecord)

    async def approve(
        self,
        run_id: str,
        decision_id: str,
        *,
        approved: bool = True,
        reason: str = "",
        wait: bool = False,
        timeout: float = 60.0,
        suspension: str | None = None,
        decided_by: str | None = None,
    ) -> RunRecord:
        """Decide one thing an ``awaiting_approval`` run waits for (a tool call id), from any process.

        Returns once the decision is durable: the orchestrator checked that the run waits for
        `decision_id`, stored the message that carries it in the agent's inbox stream (handled inside the
        run, on whichever worker owns the agent then, also one that starts later) and recorded it; the run
        is ``running`` again, or still ``awaiting_approval`` for its other ids. With ``wait=True`` it
        returns once the outcome is known instead: the run ended (`run_result` has its answer) or awaits
        decisions again. RunStateError when it waits for no such thing, or (``suspension``: the
        `RunRecord.suspension` the decision is for) not in that suspension: a retried decision never takes
        a later turn's call of the same id. ``decided_by`` (default: this connection's `identity`) is
        recorded with the decision by the agent that takes it."""
        request = ApproveRequest(
            run_id=run_id,
            id=decision_id,
            approved=approved,
            reason=reason,
            suspension=suspension,
            decided_by=decided_by if decided_by is not None else self.identity,
        )
        record = await self.connection.orchestrator.call("approve", request, RunRecord)
        if wait and record.status == RunStatus.RUNNING:
            until = {*TERMINAL, RunStatus.AWAITING_APPROVAL}
            record = await self.wait_run(run_id, timeout=timeout, until=until)
        return record

    async def deny(
        self,
        run_id: str,
        decision_id: str,
        reason: str = "",
        *,
        wait: bool = False,
        timeout: float = 60.0,
        suspension: str | None = None,
        decided_by: str | None = None,
    ) -> RunRecord:
        """`approve` with ``approved=False``: the agent sees the refusal (an error result for the call)."""
        return await self.approve(
            run_id,
            decision_id,
            approved=False,
            reason=reason,
            wait=wait,
            timeout=timeout,
            suspension=suspension,
            decided_by=decided_by,
        )

    async def cancel_run(self, run_id: str, reason: str = "cancelled") -> RunRecord:
        """Cancel the run tree; every agent of it on every worker sees CancellationError(reason)."""
        return await self.connection.orchestrator.call(
            "cancel", CancelRequest(run_id=run_id, reason=reason), RunRecord
        )

    async def wait_run(
        self, run_id: str, *, timeout: float = 60.0, until: Collection[str] = TERMINAL
    ) -> RunRecord:
        """Wait until the run's stored status is in `until` (default: ended). Event-driven: a core
        subscription to the run's KV subject notices every write of its record, and the record is then read
        back from the stream; it is also read once after subscribing (it may be there already) and every
        `_REREAD_S` while waiting (a core message can be lost on a reconnect). No consumer is created."""
        key = run_key(escape_token(run_id))
        bucket = self.connection.topology.names.runs_bucket
        notices: asyncio.Queue[bool] = asyncio.Queue()

        async def on_write(msg: Msg) -> None:
            # A notice, never the answer: the core message is seen as the write is published, before
            # the stream stored it (a replicated write may not be applied yet) or even when the stream
            # rejects it (a compare-and-set that lost), so only a read of the stream is believed.
            status = _status_of(msg.data) if msg.data else ""
            notices.put_nowait(status is None or status in until)

        sub = await self.connection.nc.subscribe(f"$KV.{bucket}.{key}", cb=on_write)
        try:
            async with asyncio.timeout(timeout):
                # > 0 while a notice said the run ended and the stream does not show it yet: read again
                # soon (doubling) rather than after `_REREAD_S`.
                soon = 0.0
                while True:
                    record = await self._stored_run(bucket, key)
                    if record is not None and record.status in until:
                        return record
                    ended = False
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(soon, _REREAD_S) if soon else _REREAD_S):
                            ended = await notices.get()
                    soon = soon * 2 if soon else (_SOON_S if ended else 0.0)
        except TimeoutError:
            raise ReplyTimeoutError(f"run/{run_id}", run_id, timeout) from None
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _stored_run(self, bucket: str, key: str) -> RunRecord | None:
        """The run's record as the stream stores it; None when absent or while its leader is elected."""
        try:
            stored = await self.connection.gets.kv_entry(bucket, key)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            return None  # a leader election: writes still arrive, and the read is retried
        if stored is None or not stored.data:
            return None
        return msgspec.json.decode(stored.data, type=RunRecord)

    @overload
    async def run_result(
        self, run_id: str, *, timeout: float = ..., output_type: None = None
    ) -> list[BaseBlock]: ...

    @overload
    async def run_result(self, run_id: str, *, timeout: float = ..., output_type: type[_T]) -> _T: ...

    async def run_result(
        self, run_id: str, *, timeout: float = 60.0, output_type: type[_T] | None = None
    ) -> list[BaseBlock] | _T:
        """The root's reply when the run completed; otherwise raise the run's typed error. ``output_type``:
        the reply's DataBlock validated into that pydantic model (`ReplyValidationError` otherwise)."""
        record = await self.wait_run(run_id, timeout=timeout)
        if record.status == RunStatus.COMPLETED:
            blocks = blocks_from_payload(record.output) if record.output is not None else []
            return blocks if output_type is None else typed_reply(blocks, output_type)
        raise KernelError.from_wire(
            record.error or {"error_type": "KernelError", "message": record.reason or ""}
        )
