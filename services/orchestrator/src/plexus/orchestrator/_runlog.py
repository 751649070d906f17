"""One log line per ended run, on the ``plexus.orchestrator.runs`` logger: INFO for a completed run, WARNING
for any other ending. Called from the one place a run's ending is announced (`EngineCore._log_ending`), so
every ending is logged exactly once by the replica that wrote it."""

from __future__ import annotations

import logging
from typing import Any

from plexus.runtime.orchestration import RunRecord, RunStatus

__all__ = ["log_run_end"]

log = logging.getLogger("plexus.orchestrator.runs")


def log_run_end(record: RunRecord, decision: str) -> None:
    """Log ``record``'s ending (``decision``: why, as the run's events name it)."""
    level = logging.INFO if record.status == RunStatus.COMPLETED else logging.WARNING
    if not log.isEnabledFor(level):
        return
    error: dict[str, Any] = record.error or {}
    error_type = error.get("error_type")
    message = error.get("message")
    usage = record.usage
    why = ""
    if record.status != RunStatus.COMPLETED:
        why = f" ({decision}): {error_type}: {message}" if error_type else f" ({decision}): {record.reason}"
    log.log(
        level,
        "run %s %s: agent %s root %s%s; usage tokens=%d cost_micros=%d turns=%d",
        record.run_id,
        record.status,
        record.agent_id,
        record.root_id,
        why,
        usage.tokens,
        usage.cost_micros,
        usage.turns,
        extra={
            "run_id": record.run_id,
            "root_id": record.root_id,
            "agent_id": record.agent_id,
            "status": str(record.status),
            "decision": decision,
            "reason": record.reason,
            "error_type": error_type,
            "error": message,
            "usage": {"tokens": usage.tokens, "cost_micros": usage.cost_micros, "turns": usage.turns},
        },
    )
