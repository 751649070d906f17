"""The spawn request's helpers: the child's record, the reply, the protected ancestors, the tree's limits
checked at the spawn (`Engine.spawn` makes the decision)."""

from __future__ import annotations

import time

from plexus.core import CancellationError, RunId
from plexus.runtime.orchestration import InvalidRunRequest, RunRecord, RunStatus, SpawnReply

from ._budget import budget_error
from ._endings import DEADLINE
from ._preemption import Preemption

__all__ = ["SpawnSupport"]


class SpawnSupport(Preemption):
    """What a spawn reads and builds before and after its slot decision."""

    async def _child_record(
        self, wanted: str | None, parent: RunRecord, root: RunRecord, agent: str, priority: int
    ) -> tuple[RunRecord, int]:
        if wanted is not None:
            found = await self.store.get_run(wanted)
            if found is not None:
                if found[0].parent_id != parent.run_id or found[0].agent_id != agent:
                    raise InvalidRunRequest(
                        "spawn", f"run {wanted} exists and is not {agent} under {parent.run_id}"
                    )
                return found
        now = time.time()
        record = RunRecord(
            run_id=wanted or str(RunId.new()),
            root_id=root.run_id,
            parent_id=parent.run_id,
            depth=parent.depth + 1,
            agent_id=agent,
            session_id=root.session_id,
            status=RunStatus.PENDING,  # until admitted; a denied child is deleted again
            priority=priority,
            budget=root.budget,
            spawn_budget=root.spawn_budget,
            retry=root.retry,
            deadline=root.deadline,
            created_at=now,
            updated_at=now,
        )
        revision = await self.store.create_run(record)
        if revision is None:  # the same retried spawn raced with itself
            return await self._child_record(record.run_id, parent, root, agent, priority)
        return record, revision

    def _spawn_reply(self, child: RunRecord, root: RunRecord, preempted: str | None) -> SpawnReply:
        assert child.parent_id is not None
        return SpawnReply(
            run_id=child.run_id,
            root_id=root.run_id,
            parent_id=child.parent_id,
            depth=child.depth,
            priority=child.priority,
            session_id=root.session_id,
            deadline=root.deadline,
            budget=root.budget,
            retry=root.retry,
            preempted=preempted,
        )

    async def _ancestors(self, run: RunRecord) -> set[str]:
        chain = {run.run_id, run.root_id}
        current = run
        while current.parent_id is not None and current.parent_id not in chain - {run.run_id}:
            chain.add(current.parent_id)
            found = await self.store.get_run(current.parent_id)
            if found is None:
                break
            current = found[0]
        return chain

    async def _enforce_now(self, root: RunRecord) -> None:
        """Spawning is a natural check point: end the tree here if the sweeper has not got to it yet."""
        if root.deadline is not None and time.time() >= root.deadline:
            await self.enforce_deadline(root.run_id)
            raise CancellationError(DEADLINE)
        if root.budget:
            tree = await self.store.get_tree(root.run_id)
            error = budget_error(root.budget, await self.usage(root, tree[0] if tree else None))
            if error is not None:
                await self.check_budget(root.run_id)
                raise error
