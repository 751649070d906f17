"""Making decisions visible: the tree's EventLog, its progress stream, and the cancel/pause broadcasts.

Every decision is appended to the run tree's orchestrator log (``Subjects.evlog("orchestrator", root)``,
fenced appends, so replicas never interleave half-written batches) and then published as `AgentProgress`
on ``Subjects.progress(root, "orchestrator", run)`` with the log sequence as ``seq`` — one sequence for both
views, monotonic across replicas. Visibility is best effort: the KV state is the truth and is written
first, so a failed announcement is logged, never allowed to undo or block a decision.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Literal

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import trace

from plexus.core import AgentId, AgentProgress, AgentStep, RunEvent, RunId, TextBlock, register_message_type
from plexus.runtime.kernel import INSTRUMENTS, EventLog, Subjects, escape_token, metrics_enabled
from plexus.runtime.orchestration import (
    CancelNotice,
    PauseNotice,
    RunRecord,
    cancel_subject,
    pause_subject,
)

__all__ = ["ORCHESTRATOR_TYPE", "Announcer", "RunDecision", "namespace_of"]

log = logging.getLogger("plexus.orchestrator")
_tracer = trace.get_tracer("plexus.orchestrator")

#: The agent type the orchestrator's log and progress subjects use (``orchestrator/<run>``).
ORCHESTRATOR_TYPE = "orchestrator"
#: How many trees' last log sequences a replica remembers (a forgotten one costs a read, or a conflict).
_LOG_SEQS_KEPT = 4096


@register_message_type
class RunDecision(RunEvent):
    """An orchestrator decision that has no dedicated run event: retry scheduled or started, spawn denied,
    a paused run resumed. ``decision`` is a stable label; ``detail`` says why in words."""

    type: Literal["orch.decision"] = "orch.decision"
    decision: str
    detail: str = ""
    child_run_id: RunId | None = None


def namespace_of(agent_id: str) -> str:
    """The namespace of an `AgentId` string; unparseable ids (never stored by us) count as the default."""
    try:
        return AgentId.parse(agent_id).namespace
    except ValueError:
        return AgentId("x", "x").namespace


class Announcer:
    """Writes decisions to the log and the progress stream, and sends the tree broadcasts."""

    def __init__(self, nc: NATS, js: JetStreamContext, prefix: str, events_stream: str) -> None:
        self.nc = nc
        self.js = js
        self.prefix = prefix
        self.events_stream = events_stream
        # The last sequence this replica wrote to each tree's log: the next decision's append tries it
        # first instead of reading (another replica's write in between costs one conflict and a retry).
        self._log_seqs: OrderedDict[str, int] = OrderedDict()

    def _subjects(self, namespace: str) -> Subjects:
        return Subjects(namespace=namespace, prefix=self.prefix)

    async def decision(
        self,
        record: RunRecord,
        root_namespace: str,
        decision: str,
        entry: RunEvent,
        step: AgentStep,
        text: str,
        **metadata: Any,
    ) -> int:
        """Append ``entry`` to the tree's log and publish the matching progress event; returns the seq."""
        with _tracer.start_as_current_span(
            f"plexus.decision {decision}",
            attributes={"plexus.run_id": record.run_id, "plexus.agent_id": record.agent_id},
        ):
            if metrics_enabled():
                INSTRUMENTS.decisions.add(1, {"decision": decision})
            subjects = self._subjects(root_namespace)
            seq = 0
            try:
                log_ = EventLog(
                    self.js, subjects.evlog(ORCHESTRATOR_TYPE, record.root_id), stream=self.events_stream
                )
                seq = await log_.append_with_retry(
                    lambda _last: [entry], attempts=10, expected=self._log_seqs.pop(record.root_id, 0)
                )
                self._log_seqs[record.root_id] = seq
                if len(self._log_seqs) > _LOG_SEQS_KEPT:
                    self._log_seqs.popitem(last=False)
            except Exception:
                log.exception("could not log %s of run %s", decision, record.run_id)
            try:
                event = AgentProgress(
                    agent_id=f"{ORCHESTRATOR_TYPE}/{record.run_id}",
                    step=step,
                    content=[TextBlock(text=text)],
                    run_id=RunId(record.run_id),
                    root_id=RunId(record.root_id),
                    parent_id=RunId(record.parent_id) if record.parent_id else None,
                    depth=record.depth,
                    seq=seq,
                    ts=time.time(),
                    metadata={"decision": decision, "status": str(record.status), **metadata},
                )
                subject = subjects.progress(record.root_id, ORCHESTRATOR_TYPE, record.run_id)
                await self.js.publish(subject, event.model_dump_json().encode())
            except Exception:
                log.exception("could not publish progress for %s of run %s", decision, record.run_id)
            return seq

    async def cancel(
        self, namespaces: Iterable[str], root_id: str, reason: str, error: dict[str, Any] | None
    ) -> None:
        """Tell every agent of the tree, in every namespace it spans, to stop with ``error``."""
        notice = msgspec.json.encode(
            CancelNotice(root_id=root_id, run_id=root_id, reason=reason, error=error)
        )
        root_tok = escape_token(root_id)
        for namespace in sorted(set(namespaces)):
            subject = cancel_subject(self.prefix, escape_token(namespace), root_tok)
            try:
                await self.nc.publish(subject, notice)
            except Exception:
                log.exception("could not broadcast the cancellation of %s", root_id)
        # Push it out now rather than at the client's next flush tick: "within 1 s" includes our buffer.
        try:
            await self.nc.flush(timeout=2)
        except Exception:
            log.warning("flush after the cancellation of %s failed", root_id)

    async def pause(self, namespace: str, root_id: str, run_id: str, paused: bool) -> None:
        notice = msgspec.json.encode(PauseNotice(root_id=root_id, run_id=run_id, paused=paused))
        subject = pause_subject(self.prefix, escape_token(namespace), escape_token(root_id))
        try:
            await self.nc.publish(subject, notice)
            await self.nc.flush(timeout=2)
        except Exception:
            log.exception("could not broadcast the pause notice of %s", run_id)
