"""Reporting a run's end to the orchestrator, when a handled message was a run's entry (its spawn or start).

The report frees the run's spawn slot and records its outcome, so the worker sends it before the reply
(a parent that spawns its next child on the reply must find the slot free) and acks the message only once
the orchestrator has it. "No replica answered" is transient (the message stays unacked and the redelivery,
answered from the checkpoint, reports again); an answer that refuses the report (an unknown run: a forged
or foreign envelope) is final: the message is dead-lettered, never redelivered forever.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
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

from ._work import _is_run_entry, _Work

__all__ = ["RunEndReporter"]

#: A run's end status by the error type of its reply (anything else failed).
_STATUS_OF_ERROR: dict[str | None, Literal["cancelled", "guardrail_tripped"]] = {
    "CancellationError": "cancelled",
    "MiddlewareTermination": "guardrail_tripped",
}

log = logging.getLogger("plexus.worker")

#: ``dead_letter(work, reason, detail) -> whether the copy was stored``
DeadLetter = Callable[[_Work, str, str], Awaitable[bool]]


class RunEndReporter:
    def __init__(self, orchestrator: OrchestratorClient, namespace: str, dead_letter: DeadLetter) -> None:
        self.orchestrator = orchestrator
        self.namespace = namespace
        self.dead_letter = dead_letter

    async def report(self, work: _Work, reply: Reply) -> bool:
        """Report the end of `work`'s run if it started one; False: do not ack (report again later)."""
        env = work.env
        run = env.run
        if run is None or not _is_run_entry(env):
            return True
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
        )
        # The report joins the trace the message came with (its handler's span has ended by now).
        token = otel_context.attach(propagate.extract(dict(work.msg.headers or {})))
        try:
            await self.orchestrator.call("finished", report, dict, namespace=self.namespace)
        except (RunNotFoundError, InvalidRunRequest, RunStateError) as exc:
            log.warning("the orchestrator refused the end of run %s: %s", run.run_id, exc)
            if not work.durable:
                return True
            return await self.dead_letter(work, "report_rejected", f"{type(exc).__name__}: {exc}")
        except KernelError as exc:  # no replica answered, or one failed: the report may succeed later
            log.warning("could not report the end of run %s (will retry on redelivery): %s", run.run_id, exc)
            return False
        finally:
            otel_context.detach(token)
        return True
