"""Runs that wait for decisions (``awaiting_approval``): recording the wait, and delivering each decision.

A handler that ends with `Context.await_approval(ids)` reports its run as awaiting those ids instead of
completed. The run keeps its spawn slot and its deadline but needs no host meanwhile (nothing runs). A
decision (`Runtime.approve`) is checked here against what the run waits for and delivered to the run's agent
as a message inside the run, so the agent's next answer ends (or again suspends) the same run. Decisions
already sent are remembered (`RunRecord.decided`): an agent that reports the wait again before it has read
them does not reopen them, and a second decision on the same id is refused.

Ids recur (a model reusing ``call_0`` every turn), so an agent may name each wait (`RunRecord.suspension`):
a report of a new suspension starts its decisions afresh (its ids are undecided, though an earlier one
decided the same ids), and a decision names the suspension it is for, in its message and its message id.
A suspension, once replaced, has ended (`RunRecord.ended_suspensions`): a late report of it changes nothing.
"""

from __future__ import annotations

import hashlib
import time

import msgspec

from plexus.core import AgentStep, RunId, RunSuspended, content_block_to_dict
from plexus.runtime.kernel import Envelope, RunInfo, Subjects, encode_envelope, make_headers, trace_headers
from plexus.runtime.orchestration import (
    TERMINAL,
    ApproveRequest,
    FinishedReport,
    RunRecord,
    RunStateError,
    RunStatus,
    approval_blocks,
)

from . import _validate as v
from ._endings import EngineCore
from ._events import RunDecision

__all__ = ["Approvals"]

AWAITING = "awaiting_approval"

#: How many ended suspensions a run remembers (`RunRecord.ended_suspensions`): a late report comes within
#: seconds (the worker's report retries, a redelivery), far fewer suspensions than this apart.
ENDED_KEPT = 32


class Approvals(EngineCore):
    async def awaiting(self, record: RunRecord, rep: FinishedReport) -> RunRecord:
        """The run's handler returned waiting for `rep.awaiting`: record the wait (the run stays open)."""
        ids = [v.parse_text("finished", "awaiting", i) for i in rep.awaiting]
        suspension = v.parse_text("finished", "suspension", rep.suspension) if rep.suspension else None
        output = msgspec.Raw(v.parse_payload("finished", rep.output)) if rep.output is not None else None

        def wait(rec: RunRecord) -> bool:
            if rec.status in TERMINAL:
                return False
            if suspension is not None and suspension in rec.ended_suspensions:
                # A late report of a wait that has ended (a slow replica took the request after the worker's
                # retry was answered; a redelivered message reported again): the newer wait stands.
                return False
            if suspension is not None and suspension != rec.suspension:
                # A new wait: what the run decided before was for the earlier one, even for the same ids.
                if rec.suspension is not None:
                    rec.ended_suspensions = [*rec.ended_suspensions, rec.suspension][-ENDED_KEPT:]
                rec.suspension = suspension
                rec.decided = []
            pending = [i for i in ids if i not in rec.decided]
            # Everything it reports is already decided and on its way to it: it runs again, not waits.
            rec.status = RunStatus.AWAITING_APPROVAL if pending else RunStatus.RUNNING
            rec.awaiting = pending
            rec.output = output
            rec.updated_at = time.time()
            return True

        changed = await self.store.update_run(record.run_id, wait)
        if changed.written and changed.record.status == RunStatus.AWAITING_APPROVAL:
            text = f"run {record.run_id} awaits approval of {', '.join(changed.record.awaiting)}"
            entry = RunSuspended(run_id=RunId(record.run_id), agent_id=record.agent_id, reason=AWAITING)
            await self._log(
                changed.record, AWAITING, entry, AgentStep.PAUSED, text, awaiting=changed.record.awaiting
            )
        return changed.record

    async def approve(self, req: ApproveRequest) -> RunRecord:
        """Deliver one decision to the awaiting run's agent (RunStateError if it waits for no such id)."""
        run_id = v.parse_run_id("approve", "run_id", req.run_id)
        decision_id = v.parse_text("approve", "id", req.id)
        reason = v.parse_text("approve", "reason", req.reason)
        named = v.parse_text("approve", "suspension", req.suspension) if req.suspension else None
        decided_by = v.parse_text("approve", "decided_by", req.decided_by) if req.decided_by else None
        record, _ = await self.store.require_run(run_id)
        if record.status != RunStatus.AWAITING_APPROVAL or decision_id not in record.awaiting:
            raise RunStateError(run_id, str(record.status), f"decide {decision_id!r}")
        if named is not None and named != record.suspension:
            # The decision was for a wait that has ended (a retry after the next turn reused the id).
            raise RunStateError(run_id, str(record.status), f"decide {decision_id!r} of suspension {named!r}")
        agent = v.parse_agent("approve", "agent_id", record.agent_id)
        root, _ = await self.store.require_run(record.root_id)
        suspension = record.suspension
        # Fixed per call of a suspension (not per verdict): a repeated approve (answer lost), or a racing
        # second decision, publishes one message (JetStream dedupe); the first decision stands. A later
        # suspension's decision on the same id is a new message.
        key = decision_id if suspension is None else f"{suspension}\n{decision_id}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        blocks = approval_blocks(decision_id, req.approved, reason, suspension, decided_by)
        env = Envelope(
            id=f"approve-{run_id}-{digest}",
            kind="send",
            target=record.agent_id,
            payload=msgspec.Raw(msgspec.json.encode([content_block_to_dict(b) for b in blocks])),
            run=RunInfo(
                run_id=run_id,
                root_id=record.root_id,
                parent_id=record.parent_id,
                depth=record.depth,
                priority=record.priority,
                session_id=record.session_id,
                deadline=root.deadline,
                budget=root.budget,
                orchestrated=True,
                retry=record.retry,
            ),
            sent_at=time.time(),
            deadline=root.deadline,
        )
        # Delivered first, recorded second: a failure between them leaves the decision open to a retry,
        # whose message the inbox stream drops as a duplicate.
        subject = Subjects(namespace=agent.namespace, prefix=self.config.prefix).inbox(agent.type, agent.key)
        await self.js.publish(subject, encode_envelope(env), headers=make_headers(env, trace_headers()))

        def decide(rec: RunRecord) -> bool:
            if (
                rec.status != RunStatus.AWAITING_APPROVAL
                or decision_id not in rec.awaiting
                or rec.suspension != suspension
            ):
                return False
            rec.awaiting = [i for i in rec.awaiting if i != decision_id]
            rec.decided = [*rec.decided, decision_id]
            rec.status = RunStatus.AWAITING_APPROVAL if rec.awaiting else RunStatus.RUNNING
            rec.updated_at = time.time()
            return True

        changed = await self.store.update_run(run_id, decide)
        if changed.written:
            verdict = "approved" if req.approved else "denied"
            by = f" by {decided_by}" if decided_by else ""
            text = f"{decision_id} {verdict}{by} for run {run_id}" + (f": {reason}" if reason else "")
            entry = RunDecision(run_id=RunId(run_id), agent_id=record.agent_id, decision=verdict)
            await self._log(changed.record, verdict, entry, AgentStep.STARTED, text, decided=decision_id)
        return changed.record
