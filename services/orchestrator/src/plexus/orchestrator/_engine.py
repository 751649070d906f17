"""The orchestrator's decisions: start (`_starting.py`), spawn, finish, crash, cancel, and the tree-wide
endings (budget, deadline, cancellation).

Nothing here is kept between calls: each operation reads `plexus_runs`, decides, and writes by
compare-and-swap, so any replica can take any request and a replica killed mid-operation leaves either the
old state or the new one. Operations are ordered so that a half-finished one is visible and repairable
(`Sweeper` finishes it): the root's terminal state is written first, then the rest of the tree, then the
announcements, and only then is the tree's slot table cleared.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec

from plexus.core import (
    AgentCrashError,
    AgentStep,
    CancellationError,
    KernelError,
    RunChildSpawned,
    RunId,
    SpawnBudget,
    SpawnDenied,
)
from plexus.runtime.orchestration import (
    TERMINAL,
    CancelRequest,
    CrashReport,
    FinishedReport,
    GetRunRequest,
    InvalidRunRequest,
    RunRecord,
    RunStatus,
    SpawnReply,
    SpawnRequest,
    TreeRecord,
)

from . import _validate as v
from ._budget import budget_error
from ._endings import (
    Ending,
    EngineConfig,
    TreeReading,
    apply_ending,
    deadline_caused,
    deadline_ending,
    tree_error,
)
from ._events import RunDecision
from ._settle import catch_up_run, settle_usage
from ._spawn import admit
from ._spawning import SpawnSupport
from ._starting import RootStarts

__all__ = ["Engine", "EngineConfig", "tree_error"]

log = logging.getLogger("plexus.orchestrator")


class Engine(RootStarts, SpawnSupport):
    """All state transitions of run trees (see the module docstring)."""

    # -- spawn ----------------------------------------------------------------------------------------
    async def spawn(self, req: SpawnRequest) -> SpawnReply:
        parent_id = v.parse_run_id("spawn", "parent_run_id", req.parent_run_id)
        root_id = v.parse_run_id("spawn", "root_id", req.root_id)
        parent_agent = str(v.parse_agent("spawn", "parent_agent", req.parent_agent))
        child_id = v.parse_agent("spawn", "child_agent", req.child_agent)
        v.check_dispatchable("spawn", self.config.prefix, child_id)  # before it takes a slot
        child_agent = str(child_id)
        priority = v.parse_priority("spawn", req.priority)
        wanted = v.parse_run_id("spawn", "child_run_id", req.child_run_id) if req.child_run_id else None
        parent, parent_revision = await self.store.require_run(parent_id)
        if parent.root_id != root_id:
            raise InvalidRunRequest(
                "spawn", f"run {parent_id} belongs to tree {parent.root_id}, not {root_id}"
            )
        if parent.agent_id != parent_agent:
            raise InvalidRunRequest(
                "spawn", f"run {parent_id} is run by {parent.agent_id}, not {parent_agent}"
            )
        root = await self._root_of(parent)
        self._refuse_if_ended(root, parent, "spawn a child")
        await self._enforce_now(root)
        child_priority = priority if priority is not None else parent.priority

        child, revision = await self._child_record(wanted, parent, root, child_agent, child_priority)
        if child.status != RunStatus.PENDING:
            return self._spawn_reply(child, root, None)  # a retried spawn that was admitted before
        protected = await self._ancestors(parent)
        await self.ensure_tree(root)
        outcome: list[Any] = []

        def take_slot(tree: TreeRecord) -> bool:
            outcome[:] = [admit(tree, child.run_id, child.agent_id, child.priority, protected)]
            return bool(outcome[0].changed)

        await self.store.update_tree(root.run_id, take_slot)
        admission = outcome[0]
        if not admission.admitted:
            await self.store.delete_run(child.run_id, revision)
            budget = root.spawn_budget or SpawnBudget().model_dump(mode="json")
            denied = SpawnDenied(parent.run_id, budget)
            await self._log(
                parent,
                "spawn_denied",
                RunDecision(
                    run_id=RunId(parent.run_id),
                    agent_id=parent.agent_id,
                    decision="spawn_denied",
                    detail=f"{child_agent}: {denied}",
                ),
                AgentStep.ERROR,
                str(denied),
                child_agent=child_agent,
            )
            raise denied

        def admitted(rec: RunRecord) -> bool:
            if rec.status != RunStatus.PENDING:
                return False
            rec.status = RunStatus.RUNNING
            rec.attempts = max(rec.attempts, 1)
            rec.updated_at = time.time()
            return True

        # Both CAS from the revisions read above (a stale one, e.g. a sibling spawned meanwhile, re-reads).
        child = (await self.store.update_run(child.run_id, admitted, known=(child, revision))).record

        def adopt(rec: RunRecord) -> bool:
            if child.run_id in rec.children:
                return False
            rec.children.append(child.run_id)
            rec.updated_at = time.time()
            return True

        await self.store.update_run(parent.run_id, adopt, known=(parent, parent_revision))
        # The tree may have ended between our check and the admission: then the child ends with it.
        latest_root = (await self.store.require_run(root.run_id))[0]
        if latest_root.status in TERMINAL:
            await self.close_tree(latest_root)
            self._refuse_if_ended(latest_root, parent, "spawn a child")
        if admission.preempted:
            await self._pause(root, admission.preempted, child.run_id)
        await self._log(
            parent,
            "spawned",
            RunChildSpawned(
                run_id=RunId(parent.run_id),
                agent_id=parent.agent_id,
                child_run_id=RunId(child.run_id),
                child_agent_id=child.agent_id,
            ),
            AgentStep.HANDOFF,
            f"spawned {child.agent_id} as run {child.run_id}",
            child_run_id=child.run_id,
            preempted=admission.preempted,
        )
        return self._spawn_reply(child, root, admission.preempted)

    # -- reports --------------------------------------------------------------------------------------
    async def finished(self, rep: FinishedReport) -> RunRecord:
        run_id = v.parse_run_id("finished", "run_id", rep.run_id)
        error = v.parse_error("finished", rep.error)
        output = msgspec.Raw(v.parse_payload("finished", rep.output)) if rep.output is not None else None
        record, revision = await self.store.require_run(run_id)
        if record.status in TERMINAL:
            # A repeated or late report: the first one decided. Its replica may have died before freeing
            # the slot, though, and the reporter retries exactly then. A run the tree's end stopped may
            # have spent more since: its agent has stopped now, so the records catch up.
            await self._settle_slot(record)
            caught_up = await catch_up_run(self, record)
            if record.parent_id is not None:
                await self.settle_usage(record.root_id)
            return caught_up
        status = RunStatus(rep.status)
        if status == RunStatus.AWAITING_APPROVAL:
            return await self.awaiting(record, rep)
        reading = None
        if status == RunStatus.COMPLETED and record.parent_id is None and record.budget:
            # A tree over its budget fails whoever notices first: the budget watcher (after its window) or
            # this report, from a root that caught its children's BudgetExhaustedError and returned. Every
            # dimension is read: the totals the ending below records are these (not read a second time).
            reading = await self.read_tree(record)
            error_now = budget_error(record.budget, reading.usage)
            if error_now is not None:
                over = Ending(RunStatus.FAILED, "budget_exceeded", error_now.to_wire())
                ended = await self.end_tree(run_id, over, (record, revision), reading)
                return ended if ended is not None else (await self.store.require_run(run_id))[0]
        if status == RunStatus.CANCELLED and deadline_caused(record, error):
            # The worker's deadline interceptor may report before the sweeper fails the tree: the outcome of
            # a missed deadline is one thing whoever reports first (FAILED, CancellationError("deadline")).
            return await self._end_run(record, deadline_ending())
        if status != RunStatus.COMPLETED and error is None:
            error = (
                CancellationError("cancelled") if status == RunStatus.CANCELLED else KernelError("run failed")
            ).to_wire()
        decision = {
            RunStatus.COMPLETED: "completed",
            RunStatus.CANCELLED: "cancelled",
            RunStatus.GUARDRAIL_TRIPPED: "guardrail_tripped",
        }.get(status, "failed")
        if decision == "failed" and error is not None and error.get("error_type") == "BudgetExhaustedError":
            decision = "budget_exceeded"  # its agent ran out (a consume, a callee): as the watcher says
        ending = Ending(status, decision, error if status != RunStatus.COMPLETED else None, output)
        return await self._end_run(record, ending, revision, reading)

    async def crashed(self, rep: CrashReport) -> RunRecord:
        run_id = v.parse_run_id("crashed", "run_id", rep.run_id)
        agent = str(v.parse_agent("crashed", "agent_id", rep.agent_id))
        if rep.attempt < 1 or rep.backoff_s < 0:
            raise InvalidRunRequest("crashed", "attempt must be >= 1 and backoff_s >= 0")
        record, _ = await self.store.require_run(run_id)
        if record.agent_id != agent:
            raise InvalidRunRequest("crashed", f"run {run_id} is run by {record.agent_id}, not {agent}")
        if record.status in TERMINAL:
            await self._settle_slot(record)
            return record
        if rep.decision == "exhausted":
            error = AgentCrashError(run_id, agent).to_wire()
            return await self._end_run(record, Ending(RunStatus.FAILED, "crash_exhausted", error))
        failed = f"failed with {rep.cause}" if rep.cause else "crashed"
        reason = f"attempt {rep.attempt - 1} {failed}; attempt {rep.attempt} in {rep.backoff_s:g}s"

        def retry(rec: RunRecord) -> bool:
            if rec.status in TERMINAL or rec.attempts >= rep.attempt:
                return False  # terminal, or this crash was reported already
            now = time.time()
            rec.status = RunStatus.PENDING
            rec.attempts = rep.attempt
            rec.reason = reason
            rec.retry_at = now + rep.backoff_s
            rec.updated_at = now
            return True

        changed = await self.store.update_run(run_id, retry)
        if changed.written:
            await self._log(
                changed.record,
                "retry_scheduled",
                RunDecision(run_id=RunId(run_id), agent_id=agent, decision="retry_scheduled", detail=reason),
                AgentStep.ERROR,
                f"run {run_id}: {reason}",
                attempt=rep.attempt,
                backoff_s=rep.backoff_s,
            )
        return changed.record

    async def retry_started(self, run_id: str) -> None:
        """A crashed run's backoff has elapsed: its next attempt is running (PENDING → RUNNING)."""

        def run(rec: RunRecord) -> bool:
            if rec.status != RunStatus.PENDING or rec.retry_at is None or rec.retry_at > time.time():
                return False
            rec.status = RunStatus.RUNNING
            rec.retry_at = None
            rec.updated_at = time.time()
            return True

        changed = await self.store.update_run(run_id, run)
        if changed.written:
            record = changed.record
            await self._log(
                record,
                "retry_started",
                RunDecision(run_id=RunId(run_id), agent_id=record.agent_id, decision="retry_started"),
                AgentStep.STARTED,
                f"run {run_id}: attempt {record.attempts} started",
                attempt=record.attempts,
            )

    async def abandon_spawn(self, child: RunRecord) -> RunRecord:
        """Fail an admitted child whose spawn never completed (its spawner got no answer)."""
        error = KernelError(f"spawn of {child.agent_id} was interrupted and not retried").to_wire()
        return await self._end_run(child, Ending(RunStatus.FAILED, "spawn_abandoned", error))

    async def _settle_slot(self, record: RunRecord) -> None:
        """Free the slot of an ended child if it still holds one (idempotent)."""
        if record.parent_id is not None and record.status in TERMINAL:
            await self.release_slots(record.root_id, [record.run_id])

    async def _end_run(
        self,
        record: RunRecord,
        ending: Ending,
        revision: int | None = None,
        reading: TreeReading | None = None,
    ) -> RunRecord:
        """End one run; ``revision``: the one ``record`` was read at (its CAS then starts from it);
        ``reading``: a root's totals as just read (see `end_tree`)."""
        known = (record, revision) if revision is not None else None
        if record.parent_id is None:
            ended = await self.end_tree(record.run_id, ending, known, reading)
            # Lost to another ending (a replica, the watcher): the stored record is theirs.
            return ended if ended is not None else (await self.store.require_run(record.run_id))[0]
        # Its agent has stopped (it reported) or never runs again: its own counters are final.
        ending.own = await self.own_usage(record.agent_id, record.run_id)
        changed = await self.store.update_run(
            record.run_id, lambda rec: apply_ending(rec, ending), known=known
        )
        if changed.written:
            await self._log_ending(changed.record, ending)
            await self.release_slots(record.root_id, [record.run_id])
        return changed.record

    async def cancel(self, req: CancelRequest) -> RunRecord:
        run_id = v.parse_run_id("cancel", "run_id", req.run_id)
        reason = v.parse_text("cancel", "reason", req.reason) or "cancelled"
        record, _ = await self.store.require_run(run_id)
        root = await self._root_of(record)
        if root.status not in TERMINAL:
            error = CancellationError(reason).to_wire()
            await self.end_tree(root.run_id, Ending(RunStatus.CANCELLED, "cancelled", error, reason=reason))
        return (await self.store.require_run(run_id))[0]

    async def get(self, req: GetRunRequest) -> RunRecord:
        run_id = v.parse_run_id("get", "run_id", req.run_id)
        record, _ = await self.store.require_run(run_id)
        if record.status not in TERMINAL:  # live figures: the record's are written when the run ends
            own = self.own_usage(record.agent_id, run_id)
            if record.parent_id is None:
                tree = await self.store.get_tree(run_id)
                record.usage, record.own_usage = await asyncio.gather(
                    self.usage(record, tree[0] if tree else None), own
                )
            else:
                record.own_usage = record.usage = await own
        return record

    async def settle_usage(
        self, root_id: str, force: bool = False, ended: RunRecord | None = None
    ) -> RunRecord | None:
        """Catch an ended tree's records up with its counters (see `_settle.py`)."""
        return await settle_usage(self, root_id, force, ended)
