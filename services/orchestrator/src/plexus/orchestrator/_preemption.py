"""Preemption inside a run tree: a higher-priority spawn pauses a running sibling, a released slot resumes it.

The tree's slot table (`TreeRecord.active`) says which runs hold a slot and which are paused for whom; each
run's record says whether it is SUSPENDED. Both are written by compare-and-swap on their own keys, so the
pause re-reads the tree around its own write (see `Preemption._pause`), and workers parked on a paused run
re-read its record.
"""

from __future__ import annotations

import logging
import time

from plexus.core import AgentStep, KernelError, RunId, RunSuspended
from plexus.runtime.orchestration import RunRecord, RunStatus, TreeRecord

from ._approvals import Approvals
from ._events import RunDecision, namespace_of
from ._spawn import release
from ._store import Changed

__all__ = ["Preemption"]

log = logging.getLogger("plexus.orchestrator")


class Preemption(Approvals):
    """Pausing preempted runs and resuming them when a slot is released."""

    async def _pause(self, root: RunRecord, run_id: str, by: str) -> None:
        """Suspend the run ``by`` preempted and tell its worker, unless its slot was given back meanwhile.

        The tree and the run are two keys: a `release_slots` on another replica can resume the victim in the
        tree after our admission, and its `_resume` only wakes a SUSPENDED record. So the tree is re-read
        before suspending and again after announcing; whichever of us goes second sees the other's write,
        and the record (which a parked worker re-reads) never stays SUSPENDED on a slot that is not paused.
        """
        if not await self._preempted(root.run_id, run_id, by):
            return  # resumed (or ended) already: suspending now would park it for good
        reason = f"preempted by run {by}"

        def suspend(rec: RunRecord) -> bool:
            if rec.status == RunStatus.SUSPENDED and rec.reason != reason:
                # Still suspended by an earlier preemption whose undo has not run yet: the slot is ours
                # now, so claim the suspension and that undo (which wakes only its own) leaves it alone.
                rec.reason = reason
                rec.updated_at = time.time()
                return True
            if rec.status not in (RunStatus.RUNNING, RunStatus.PENDING):
                return False
            rec.status = RunStatus.SUSPENDED
            rec.reason = reason
            rec.updated_at = time.time()
            return True

        changed = await self.store.update_run(run_id, suspend)
        victim = changed.record
        if victim.status != RunStatus.SUSPENDED:
            return  # it ended meanwhile: nothing to pause
        namespace = namespace_of(victim.agent_id)
        await self.announce.pause(namespace, root.run_id, run_id, paused=True)
        if changed.written:
            await self._log(
                victim,
                "preempted",
                RunSuspended(run_id=RunId(run_id), agent_id=victim.agent_id, reason=reason),
                AgentStep.PAUSED,
                f"run {run_id} ({victim.agent_id}) paused: {reason}",
                preempted_by=by,
            )
        if not await self._preempted(root.run_id, run_id, by):
            # Released while we suspended: the resumer may have found the record still RUNNING (and so
            # skipped it), or its resume notice may have overtaken our pause notice. Undo both, unless a
            # newer preemption has claimed the suspension meanwhile.
            woken = await self._wake(run_id, only_reason=reason)
            if woken.written or woken.record.status != RunStatus.SUSPENDED:
                await self.announce.pause(namespace, root.run_id, run_id, paused=False)

    async def _preempted(self, root_id: str, run_id: str, by: str) -> bool:
        """Whether the tree (read fresh) still has ``run_id``'s slot paused for ``by``."""
        found = await self.store.get_tree(root_id)
        slot = found[0].active.get(run_id) if found is not None else None
        return slot is not None and slot.paused and slot.preempted_by == by

    async def _resume(self, root_id: str, run_id: str) -> None:
        woken = await self._wake(run_id)
        if woken.written:
            # Only when our write applied: a skipped write means the run is not suspended, and a notice
            # now could overtake a pause still being announced and let the run work while suspended.
            await self.announce.pause(namespace_of(woken.record.agent_id), root_id, run_id, paused=False)

    async def _wake(self, run_id: str, only_reason: str | None = None) -> Changed[RunRecord]:
        """SUSPENDED → RUNNING (only if suspended for ``only_reason``, when given); logs the decision."""

        def wake(rec: RunRecord) -> bool:
            if rec.status != RunStatus.SUSPENDED or (only_reason is not None and rec.reason != only_reason):
                return False
            rec.status = RunStatus.RUNNING
            rec.reason = None
            rec.updated_at = time.time()
            return True

        changed = await self.store.update_run(run_id, wake)
        if changed.written:
            record = changed.record
            await self._log(
                record,
                "resumed",
                RunDecision(run_id=RunId(run_id), agent_id=record.agent_id, decision="resumed"),
                AgentStep.STARTED,
                f"run {run_id} ({record.agent_id}) resumed: a slot was released",
            )
        return changed

    async def release_slots(self, root_id: str, run_ids: list[str]) -> None:
        resumed: list[str] = []

        def free(tree: TreeRecord) -> bool:
            changed, woken = release(tree, run_ids)
            resumed[:] = woken
            return changed

        try:
            await self.store.update_tree(root_id, free)
        except KernelError:
            return  # no tree record: nothing held a slot
        for run_id in resumed:
            try:
                await self._resume(root_id, run_id)
            except KernelError:
                log.warning("resumed run %s has no record", run_id)
