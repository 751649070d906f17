"""Reporting a run's end to the orchestrator, when a handled message was a run's entry (its spawn or start).

The report frees the run's spawn slot and records its outcome, so the worker sends it before the reply
(a parent that spawns its next child on the reply must find the slot free) and acks the message only once
the orchestrator has it. The report's answer is the message's `Settlement`: ACK once taken; RETRY_AFTER
when no replica answered or one failed (transient: the message is redelivered `REPORT_RETRY_S` later and
the redelivery, answered from the checkpoint, reports again); DEAD_LETTER (`report_rejected`, no error
reply: the caller has its answer) when an answer refuses it (an unknown run: a forged or foreign envelope),
which is final: such a message is never redelivered forever.
"""

from __future__ import annotations

import logging
from typing import Literal

from opentelemetry import context as otel_context
from opentelemetry import propagate

from plexus.core import KernelError
from plexus.runtime.client._cluster import OrchestratorClient
from plexus.runtime.wire._envelope import Reply
from plexus.runtime.wire._orchestration import (
    FinishedReport,
    InvalidRunRequest,
    RunNotFoundError,
    RunStateError,
)

from ._work import _is_run_entry
from .pipeline._work import ACK, Settlement, Work, dead_letter_with, retry_after

__all__ = ["REPORT_RETRY_S", "RunEndReporter"]

#: A run's end status by the error type of its reply (anything else failed).
_STATUS_OF_ERROR: dict[str | None, Literal["cancelled", "guardrail_tripped"]] = {
    "CancellationError": "cancelled",
    "MiddlewareTermination": "guardrail_tripped",
}

log = logging.getLogger("plexus.worker")

#: How long after a report the orchestrator did not take its message is redelivered (a delayed nak), to
#: report again. Not ack_wait (30 s): the run's end, and the spawn slot it frees, would wait that long after
#: an orchestrator replica is back. Not at once: each report already waits up to 3 x the client's timeout
#: for a replica to answer, and a replica that failed the report gets a moment before it is asked again.
REPORT_RETRY_S = 2.0


class RunEndReporter:
    def __init__(self, orchestrator: OrchestratorClient, namespace: str) -> None:
        self.orchestrator = orchestrator
        self.namespace = namespace

    async def report(self, work: Work, reply: Reply) -> Settlement:
        """Report the end of `work`'s run if it started one; how the message ends, as far as that goes."""
        env = work.env
        run = env.run
        if run is None or not _is_run_entry(env):
            return ACK
        error_type = (reply.error or {}).get("error_type")
        status: Literal["completed", "failed", "cancelled", "guardrail_tripped", "awaiting_approval"]
        status = "awaiting_approval" if reply.awaiting else "completed"
        if not reply.ok:
            status = _STATUS_OF_ERROR.get(error_type, "failed")
        report = FinishedReport(
            run_id=run.run_id,
            status=status,
            output=reply.payload,
            error=reply.error,
            awaiting=list(reply.awaiting or []) if reply.ok else [],
            suspension=reply.suspension if reply.ok else None,
        )
        # The report joins the trace the message came with (its handler's span has ended by now).
        token = otel_context.attach(propagate.extract(dict(work.msg.headers or {})))
        try:
            await self.orchestrator.call("finished", report, dict, namespace=self.namespace)
        except (RunNotFoundError, InvalidRunRequest, RunStateError) as exc:
            log.warning("the orchestrator refused the end of run %s: %s", run.run_id, exc)
            if not work.durable:
                return ACK
            return dead_letter_with("report_rejected", f"{type(exc).__name__}: {exc}", None)
        except KernelError as exc:  # no replica answered, or one failed: the report may succeed later
            log.warning(
                "could not report the end of run %s (retried on redelivery in %ss): %s",
                run.run_id,
                REPORT_RETRY_S,
                exc,
            )
            return retry_after(REPORT_RETRY_S)
        finally:
            otel_context.detach(token)
        return ACK
