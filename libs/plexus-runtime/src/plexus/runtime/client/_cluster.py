"""The runtime's side of orchestration: a client for the orchestrator's endpoints, the run-control state a
worker learns from broadcasts, and `ClusterSupervisor`, which makes budgets and spawn slots cluster-wide.

Budget accounting does not go through the orchestrator: every reporter increments the run tree's JetStream
counters (`Nats-Incr`), which the server applies atomically, so the total can overshoot the limit only by
increments already in flight when it was crossed. The orchestrator watches the same counters and fails the
run for agents that never report again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from opentelemetry import trace

from plexus.core import AgentId, BudgetExhaustedError, ExecutionBudget, KernelError, RunId, Usage
from plexus.runtime.ops._telemetry import trace_headers
from plexus.runtime.store._outage import ServiceUnavailableError
from plexus.runtime.wire._envelope import RunInfo
from plexus.runtime.wire._orchestration import (
    COST_SCALE,
    TERMINAL,
    CancelNotice,
    PauseNotice,
    RunRecord,
    SpawnReply,
    SpawnRequest,
    budget_counter_subject,
    limited_dimensions,
    orch_subject,
    run_counter_subject,
    run_key,
)
from plexus.runtime.wire._subjects import escape_token

from ._supervisor import LocalSupervisor

if TYPE_CHECKING:
    from plexus.runtime.store._connection import Connection

__all__ = ["ClusterSupervisor", "OrchestratorClient", "RunControl", "ServiceUnavailableError"]

R = TypeVar("R")


_tracer = trace.get_tracer("plexus.runtime")
log = logging.getLogger("plexus.client")
#: How long a budget increment's ack is awaited (an outage past it fails the consume, typed).
_INCREMENT_TIMEOUT_S = 5.0


class OrchestratorClient:
    """Typed requests to the orchestrator's micro-service endpoints."""

    def __init__(self, rt: Connection, timeout_s: float = 5.0) -> None:
        self.rt = rt
        self.timeout_s = timeout_s
        #: When a replica last answered this client (monotonic), None before the first answer.
        self._answered_at: float | None = None

    #: The first attempt's wait; each unanswered attempt doubles it up to `timeout_s`. Requests take
    #: milliseconds, so a longer silence means the replica that got it died (or froze) with it.
    FIRST_ATTEMPT_S = 0.5
    #: How long "no responders" (no replica subscribed at all) is retried when none answered this client in
    #: the last `RECENT_ANSWER_S`: most likely no orchestrator runs, and saying so (and how to start one) at
    #: once beats 15 s of silence. After a recent answer it is a replica restarting: retried to the deadline.
    NO_RESPONDERS_S = 1.0
    RECENT_ANSWER_S = 60.0

    def _unavailable(self) -> ServiceUnavailableError:
        url = self.rt.nc.connected_url
        # Scheme, host and port only: the URL may carry credentials.
        server = (
            f" --nats {url.scheme}://{url.hostname}:{url.port}" if url is not None and url.hostname else ""
        )
        prefix = f" --prefix {self.rt.prefix}" if self.rt.prefix != "px" else ""
        return ServiceUnavailableError(
            "orchestrator", f"Start one with `plexus orchestrator{server}{prefix}`."
        )

    async def call(self, verb: str, body: Any, reply_type: type[R], namespace: str | None = None) -> R:
        """One request, traced: the orchestrator's span and the decisions it makes join the caller's trace."""
        with _tracer.start_as_current_span(f"plexus.orchestrator.call {verb}", kind=trace.SpanKind.CLIENT):
            return await self._call(verb, body, reply_type, namespace, trace_headers() or None)

    async def _call(
        self, verb: str, body: Any, reply_type: type[R], namespace: str | None, headers: dict[str, str] | None
    ) -> R:
        """One request; retried while no replica answers (every request is idempotent: ids are chosen by
        the caller), so losing one orchestrator replica mid-request costs a short retry, not the request
        (nor the full timeout: attempts wait 0.5 s, 1 s, 2 s, … up to `timeout_s`). With no replica running
        at all the request fails within ~`NO_RESPONDERS_S`, naming the command that starts one."""
        ns = escape_token(namespace or self.rt.namespace)
        subject = orch_subject(self.rt.prefix, ns, verb)
        data = body if isinstance(body, bytes) else msgspec.json.encode(body)
        started = time.monotonic()
        deadline = started + self.timeout_s * 3
        recent = self._answered_at is not None and started - self._answered_at <= self.RECENT_ANSWER_S
        nobody_until = deadline if recent else min(deadline, started + self.NO_RESPONDERS_S)
        wait = min(self.FIRST_ATTEMPT_S, self.timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            try:
                msg = await self.rt.nc.request(
                    subject, data, timeout=max(min(wait, remaining), 0.05), headers=headers
                )
            except NoRespondersError:
                if time.monotonic() >= nobody_until:
                    raise self._unavailable() from None
                await asyncio.sleep(0.2)
                continue
            except (NatsTimeoutError, TimeoutError):
                if time.monotonic() >= deadline:
                    raise self._unavailable() from None
                wait = min(wait * 2, self.timeout_s)
                continue
            self._answered_at = time.monotonic()
            headers = msg.headers or {}
            if "Nats-Service-Error-Code" not in headers:
                return msgspec.json.decode(msg.data, type=reply_type)
            try:
                wire = json.loads(msg.data)
            except ValueError:
                wire = {"error_type": "KernelError", "message": headers.get("Nats-Service-Error", "error")}
            error = KernelError.from_wire(wire)
            # A replica that could not reach its store (a leader election) answers ServiceUnavailableError:
            # asked again like a replica that did not answer at all.
            if not isinstance(error, ServiceUnavailableError) or time.monotonic() >= deadline:
                raise error
            await asyncio.sleep(0.2)


class RunControl:
    """What this process knows about run trees: cancelled roots (with the error to raise) and paused runs."""

    def __init__(self, rt: Connection, memory: int = 10_000) -> None:
        self.rt = rt
        self._memory = memory
        self.cancelled: OrderedDict[str, KernelError] = OrderedDict()
        self._resume: dict[str, asyncio.Event] = {}
        self._status_cache: dict[str, tuple[float, RunRecord | None]] = {}
        self._listeners: list[Any] = []

    def on_cancel(self, notice: CancelNotice) -> KernelError:
        error = KernelError.from_wire(notice.error) if notice.error else _cancelled(notice.reason)
        self.cancelled[notice.root_id] = error
        while len(self.cancelled) > self._memory:
            self.cancelled.popitem(last=False)
        return error

    def on_pause(self, notice: PauseNotice) -> None:
        if len(self._resume) > self._memory:  # pauses of runs that ended elsewhere: forget the oldest
            self._resume.pop(next(iter(self._resume)))
        event = self._resume.setdefault(notice.run_id, asyncio.Event())
        if notice.paused:
            event.clear()
        else:
            event.set()
            self._resume.pop(notice.run_id, None)

    async def wait_if_paused(self, run_id: str) -> None:
        """Cooperative pause: a preempted agent parks here (at its next consume/check) until resumed.

        The resume broadcast is best effort, so while parked the run's record is re-read every second: a
        run that is no longer SUSPENDED (resume missed, or the tree ended) goes on and meets its fate.
        """
        event = self._resume.get(run_id)
        while event is not None and not event.is_set():
            try:
                await asyncio.wait_for(event.wait(), 1.0)
            except TimeoutError:
                record = await self._record(run_id)
                if record is None or record.status != "suspended":
                    self._resume.pop(run_id, None)
                    return

    async def terminal_error(self, run: RunInfo) -> KernelError | None:
        """The error an agent of a finished (failed/cancelled) tree must see, from broadcasts or the store."""
        known = self.cancelled.get(run.root_id)
        if known is not None:
            return known
        record = await self._record(run.root_id)
        if record is None or record.status not in TERMINAL or record.status == "completed":
            return None
        error = (
            KernelError.from_wire(record.error) if record.error else _cancelled(record.reason or "run ended")
        )
        self.cancelled[run.root_id] = error
        return error

    async def _record(self, run_id: str) -> RunRecord | None:
        # A short cache: intake checks stay cheap under load; broadcasts cover the live case anyway.
        now = time.monotonic()
        cached = self._status_cache.get(run_id)
        if cached is not None and now - cached[0] < 0.5:
            return cached[1]
        try:
            # From the stream's leader, not a KV get: on R3 a direct get may be answered by a follower
            # that has not applied the orchestrator's last write yet, and a preempted agent that read
            # "running" there went on working while suspended (found by the e2e suite on R3).
            bucket = self.rt.topology.names.runs_bucket
            entry = await self.rt.gets.kv_entry(bucket, run_key(escape_token(run_id)))
            record = msgspec.json.decode(entry.data, type=RunRecord) if entry and entry.data else None
        except Exception:
            record = None
        if len(self._status_cache) > self._memory:
            self._status_cache.clear()
        self._status_cache[run_id] = (now, record)
        return record


def _cancelled(reason: str) -> KernelError:
    from plexus.core import CancellationError

    return CancellationError(reason)


def _counter_value(read: Any) -> int | None:
    """A budget counter's total from its last message, None when there is none to enforce (the counter was
    never incremented, or its read failed: the increments that move it enforce it anyway)."""
    if isinstance(read, BaseException):
        if not isinstance(read, Exception):
            raise read  # a cancellation, say: not a counter that was never incremented
        return None
    try:
        return int(json.loads(read.data or b"{}")["val"])
    except (ValueError, KeyError, TypeError):
        return None


class ClusterSupervisor:
    """Cluster-wide budgets (JetStream counters) and spawn slots (orchestrator) for orchestrated runs;
    runs not started through the orchestrator fall back to the process-local supervisor."""

    def __init__(self, rt: Connection, control: RunControl, client: OrchestratorClient | None = None) -> None:
        self.rt = rt
        self.control = control
        self.client = client or OrchestratorClient(rt)
        self.local = LocalSupervisor()
        #: Run tree root -> when the last read that found its whole budget within limits was sent
        #: (monotonic), or None once one found it exhausted.
        self._verified: OrderedDict[str, float | None] = OrderedDict()
        self._memory = 10_000

    def _verdict(self, run: RunInfo, totals: dict[str, int], read_at: float) -> None:
        """Enforce ``totals`` (read at ``read_at``) and remember the verdict for checks that accept an age."""
        try:
            self._enforce(run, totals)
        except BudgetExhaustedError:
            # Never within limits again (the counters only grow): no later answer, even one read before
            # this one and processed after it, may let a check skip the server.
            self._verified[run.root_id] = None
            raise
        previous = self._verified.get(run.root_id, 0.0)
        if previous is None:
            return
        self._verified[run.root_id] = max(read_at, previous)
        self._verified.move_to_end(run.root_id)
        while len(self._verified) > self._memory:
            self._verified.popitem(last=False)

    def _verified_within(self, root_id: str, max_age_s: float) -> bool:
        at = self._verified.get(root_id)
        return at is not None and time.monotonic() - at <= max_age_s

    def _counter(self, run: RunInfo, dimension: str) -> str:
        return budget_counter_subject(
            self.rt.prefix, escape_token(self.rt.namespace), escape_token(run.root_id), dimension
        )

    def _own_counter(self, run: RunInfo, dimension: str) -> str:
        return run_counter_subject(
            self.rt.prefix, escape_token(self.rt.namespace), escape_token(run.run_id), dimension
        )

    async def consume(self, run: RunInfo, agent_id: AgentId, usage: Usage, turns: int) -> None:
        if not run.orchestrated:
            await self.local.consume(run, agent_id, usage, turns)
            return
        deltas = {
            "tokens": usage.total_tokens,
            "cost_micros": round((usage.cost.amount if usage.cost else 0.0) * COST_SCALE),
            "turns": turns,
        }
        # One round trip for all dimensions: the increments are independent (each is atomic on its own), and
        # the budgeted dimensions this call does not move are read alongside, so a consume checks the whole
        # budget as `check` does (a caller may skip its next check on the strength of it).
        moved = [(dimension, delta) for dimension, delta in deltas.items() if delta]
        unmoved = [d for d in limited_dimensions(run.budget) if not deltas[d]]
        stream = self.rt.topology.names.counters_stream
        read_at = time.monotonic()
        acks = self.rt.acks  # an increment is a JetStream publish whose ack carries the new total
        # An end this process knows already (a broadcast, an earlier read) is raised at once, not after the
        # acks nor instead of a send's error; the usage is still sent, since it was spent.
        known = self.control.cancelled.get(run.root_id)
        increments: list[asyncio.Future[dict[str, Any]]] = []
        try:
            for dimension, delta in moved:
                increments.append(
                    await acks.publish(self._counter(run, dimension), b"", {"Nats-Incr": str(delta)})
                )
            # The run's own counters after the tree's (whose acks come first in `increments`): its record's
            # usage, never a budget; awaited with them (one round trip): a consume that returns counted both.
            for dimension, delta in moved:
                increments.append(
                    await acks.publish(self._own_counter(run, dimension), b"", {"Nats-Incr": str(delta)})
                )
        except Exception:
            if known is None:
                acks.forget(increments)
                raise
        if known is not None:
            acks.forget(increments)
            raise known
        try:
            # The run's end is read alongside (not first: a turn that ends after its model call, which a
            # cached record of the run no longer covers, would wait for two round trips). Usage spent in a
            # tree that has ended is still counted: it was spent.
            ended, *results = await asyncio.gather(
                self.control.terminal_error(run),
                *(acks.answer(f, _INCREMENT_TIMEOUT_S, NatsTimeoutError) for f in increments),
                *(self.rt.gets.get_last_msg(stream, self._counter(run, d)) for d in unmoved),
                return_exceptions=True,
            )
        finally:
            acks.forget(increments)
        if ended is not None:
            raise ended  # the tree's end (returned) or its read's failure (raised), before any budget verdict
        totals: dict[str, int] = {}
        for (dimension, _), answer in zip(moved, results, strict=False):
            if isinstance(answer, BaseException):
                raise answer  # an increment that failed: the usage is not counted
            totals[dimension] = int(answer["val"])
        for (dimension, _), answer in zip(moved, results[len(moved) : 2 * len(moved)], strict=True):
            if isinstance(answer, BaseException):
                # The budget counted it (above); failing the turn for the record's figure would be worse.
                log.warning(
                    "run %s: its own %s counter missed an increment: %r", run.run_id, dimension, answer
                )
        for dimension, read in zip(unmoved, results[2 * len(moved) :], strict=True):
            total = _counter_value(read)
            if total is not None:
                totals[dimension] = total
        self._verdict(run, totals, read_at)
        await self.control.wait_if_paused(run.run_id)

    async def check(self, run: RunInfo, max_age_s: float = 0.0) -> None:
        if not run.orchestrated:
            await self.local.check(run)
            return
        if max_age_s > 0 and self._verified_within(run.root_id, max_age_s):
            # The budget as verified moments ago (the caller accepts that age); the tree's end and a
            # preemption are what this process knows now (broadcasts), as on the full path.
            known = self.control.cancelled.get(run.root_id)
            if known is not None:
                raise known
            await self.control.wait_if_paused(run.run_id)
            return
        stream = self.rt.topology.names.counters_stream
        # Only the dimensions the budget limits, read together with the run's end (a first check of a run
        # reads its record): one round trip, not one per read (a check runs before every model call).
        names = limited_dimensions(run.budget)
        read_at = time.monotonic()
        ended, *found = await asyncio.gather(
            self.control.terminal_error(run),
            *(self.rt.gets.get_last_msg(stream, self._counter(run, d)) for d in names),
            return_exceptions=True,
        )
        if isinstance(ended, BaseException):  # the run's end (returned) or its read's failure (raised)
            raise ended
        totals: dict[str, int] = {}
        for dimension, msg in zip(names, found, strict=True):
            total = _counter_value(msg)
            if total is not None:
                totals[dimension] = total
        self._verdict(run, totals, read_at)
        await self.control.wait_if_paused(run.run_id)

    async def _raise_if_ended(self, run: RunInfo) -> None:
        error = await self.control.terminal_error(run)
        if error is not None:
            raise error

    def _enforce(self, run: RunInfo, totals: dict[str, int]) -> None:
        if run.budget is None:
            return
        budget = ExecutionBudget.model_validate(run.budget)
        if budget.max_tokens is not None and totals.get("tokens", 0) > budget.max_tokens:
            raise BudgetExhaustedError("tokens", totals["tokens"], budget.max_tokens)
        if (
            budget.max_cost_usd is not None
            and totals.get("cost_micros", 0) > budget.max_cost_usd * COST_SCALE
        ):
            raise BudgetExhaustedError("cost", totals["cost_micros"] / COST_SCALE, budget.max_cost_usd)
        if budget.max_turns is not None and totals.get("turns", 0) > budget.max_turns:
            raise BudgetExhaustedError("turns", totals["turns"], budget.max_turns)

    async def spawn(
        self,
        parent: RunInfo,
        parent_agent: AgentId,
        child: AgentId,
        priority: int | None,
        run_id: str | None = None,
    ) -> RunInfo:
        if not parent.orchestrated:
            return await self.local.spawn(parent, parent_agent, child, priority, run_id)
        await self._raise_if_ended(parent)
        reply = await self.client.call(
            "spawn",
            SpawnRequest(
                parent_run_id=parent.run_id,
                root_id=parent.root_id,
                parent_agent=str(parent_agent),
                child_agent=str(child),
                priority=priority,
                child_run_id=run_id or str(RunId.new()),  # chosen here: a retried request is idempotent
            ),
            SpawnReply,
            namespace=parent_agent.namespace,
        )
        return reply.run_info()

    async def finished(self, run: RunInfo, status: str) -> None:
        # The worker that handled the child's run-entry message reports it (it knows the output).
        return None
