"""Starting a root run: the start request, its tree's slot table, and the dispatch of its first envelope.

Input first, then the run, then its tree, then the envelope: a replica dying between steps leaves a PENDING
run that `Sweeper` dispatches later, never a run without its input (see `Engine` for the other decisions).
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from plexus.core import AgentId, AgentStep, RunId, RunStarted, SpawnBudget
from plexus.runtime.kernel import Envelope, RunInfo, Subjects, encode_envelope, make_headers, trace_headers
from plexus.runtime.orchestration import (
    TERMINAL,
    InvalidRunRequest,
    RunRecord,
    RunStateError,
    RunStatus,
    Slot,
    StartRunReply,
    StartRunRequest,
    TreeRecord,
)

from . import _validate as v
from ._endings import Ending, EngineCore

__all__ = ["RootStarts"]


class RootStarts(EngineCore):
    """The start of a run tree: its root's record, its tree record and its first envelope."""

    async def start(self, req: StartRunRequest) -> StartRunReply:
        agent = v.parse_agent("start", "agent_id", req.agent_id)
        v.check_dispatchable("start", self.config.prefix, agent)
        payload = v.parse_payload("start", req.payload)
        budget, spawn_budget, retry = v.budgets("start", req.budget, req.spawn_budget, req.retry)
        priority = v.parse_priority("start", req.priority)
        session_id = v.parse_session("start", req.session_id)
        run_id = v.parse_run_id("start", "run_id", req.run_id) if req.run_id else str(RunId.new())
        # Two independent reads, one round trip: is the type orchestratable, and was this run started before.
        existing = await self._start_reads(agent, run_id)
        if existing is not None:
            return await self._repeated_start(existing[0], str(agent))
        now = time.time()
        record = RunRecord(
            run_id=run_id,
            root_id=run_id,
            agent_id=str(agent),
            session_id=session_id,
            status=RunStatus.PENDING,
            priority=priority if priority is not None else 2,
            budget=budget.model_dump(mode="json") if budget else None,
            spawn_budget=spawn_budget.model_dump(mode="json"),
            retry=retry.model_dump(mode="json") if retry else None,
            deadline=now + budget.deadline_s if budget and budget.deadline_s is not None else None,
            created_at=now,
            updated_at=now,
            forked_from=v.parse_lineage("start", req.forked_from),
        )
        # Input first, then the run, then its slots: a replica dying between steps leaves a PENDING run the
        # sweeper can still dispatch, never a run without its input.
        await self.store.put_input(run_id, payload)
        revision = await self.store.create_run(record)
        if revision is None:
            raced = await self.store.require_run(run_id)
            return await self._repeated_start(raced[0], str(agent))
        await self.ensure_tree(record, new=True)
        # What was just written is handed on, not read back: three round trips less per start.
        started = await self.dispatch(run_id, fresh=(record, revision, payload))
        return StartRunReply(run_id=run_id, status=started.status if started else record.status)

    async def _start_reads(self, agent: AgentId, run_id: str) -> tuple[RunRecord, int] | None:
        """The run as stored (None: new), once the agent's type is known not to be stateless."""
        if self.hosts is None:
            return await self.store.get_run(run_id)
        refused, existing = await asyncio.gather(
            self.hosts.refuse_stateless(agent), self.store.get_run(run_id), return_exceptions=True
        )
        for outcome in (refused, existing):  # the type's refusal first, as when the reads were serial
            if isinstance(outcome, BaseException):
                raise outcome
        assert not isinstance(existing, BaseException)
        return existing

    async def _repeated_start(self, record: RunRecord, agent: str) -> StartRunReply:
        if record.parent_id is not None or record.agent_id != agent:
            raise RunStateError(record.run_id, str(record.status), f"start run {record.run_id} for {agent}")
        if record.status == RunStatus.PENDING and record.attempts == 0:
            dispatched = await self.dispatch(record.run_id)  # the first start died before dispatching
            if dispatched is not None:
                record = dispatched
        return StartRunReply(run_id=record.run_id, status=record.status)

    async def ensure_tree(self, root: RunRecord, *, new: bool = False) -> TreeRecord:
        """The root's tree record, created when missing. ``new``: the root was just created, so its tree
        most likely is missing too: create first, read only if that loses (a retried start)."""
        if not new:
            found = await self.store.get_tree(root.run_id)
            if found is not None:
                return found[0]
        spawn = SpawnBudget.model_validate(root.spawn_budget or {})
        tree = TreeRecord(
            root_id=root.run_id,
            max_agents=spawn.max_agents,
            allow_preempt=spawn.allow_preempt,
            active={},
            spawned_total=1,
        )
        if root.status not in TERMINAL:
            tree.active[root.run_id] = Slot(agent_id=root.agent_id, priority=root.priority)
        if await self.store.create_tree(tree) is None:
            again = await self.store.get_tree(root.run_id)
            assert again is not None
            return again[0]
        return tree

    async def dispatch(
        self, run_id: str, fresh: tuple[RunRecord, int, bytes] | None = None
    ) -> RunRecord | None:
        """Publish a PENDING root's first envelope and mark it RUNNING (idempotent: fixed message id).

        ``fresh``: the record, its revision and the input that `start` has just stored (not read again)."""
        payload: bytes | None = None
        if fresh is not None:
            record, revision, payload = fresh
        else:
            found = await self.store.get_run(run_id)
            if found is None:
                return None
            record, revision = found
        if record.status != RunStatus.PENDING or record.attempts != 0 or record.parent_id is not None:
            return record
        if payload is None:
            payload = await self.store.get_input(run_id)
        if payload is None:
            await self.end_tree(
                run_id,
                Ending(
                    RunStatus.FAILED,
                    "failed",
                    InvalidRunRequest("start", "the run's input is missing").to_wire(),
                ),
            )
            return (await self.store.require_run(run_id))[0]
        try:
            agent = v.parse_agent("start", "agent_id", record.agent_id)
            v.check_dispatchable("start", self.config.prefix, agent)
        except InvalidRunRequest as exc:  # stored before validation existed, or by a foreign writer
            await self.end_tree(run_id, Ending(RunStatus.FAILED, "failed", exc.to_wire()))
            return (await self.store.require_run(run_id))[0]
        now = time.time()
        env = Envelope(
            # Fixed per run: two replicas dispatching the same run publish one message (JetStream dedupe).
            id=f"start-{run_id}",
            kind="send",
            target=record.agent_id,
            payload=msgspec.Raw(payload),
            run=RunInfo(
                run_id=run_id,
                root_id=run_id,
                depth=0,
                priority=record.priority,
                session_id=record.session_id,
                deadline=record.deadline,
                budget=record.budget,
                orchestrated=True,
                retry=record.retry,
            ),
            sent_at=now,
            deadline=record.deadline,
        )
        subject = Subjects(namespace=agent.namespace, prefix=self.config.prefix).inbox(agent.type, agent.key)
        # The root's handler joins the trace of the request that started the run.
        await self.js.publish(subject, encode_envelope(env), headers=make_headers(env, trace_headers()))

        def running(rec: RunRecord) -> bool:
            if rec.status != RunStatus.PENDING or rec.attempts != 0:
                return False  # already finished or crashed meanwhile: that news is newer than ours
            rec.status = RunStatus.RUNNING
            rec.attempts = 1
            rec.updated_at = time.time()
            return True

        changed = await self.store.update_run(run_id, running, known=(record, revision))
        if changed.written:
            await self._log(
                changed.record,
                "started",
                RunStarted(run_id=RunId(run_id), agent_id=record.agent_id, root_run_id=RunId(run_id)),
                AgentStep.STARTED,
                f"run {run_id} started on {record.agent_id}",
            )
        return changed.record
