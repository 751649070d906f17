"""`LoggingInterceptor`: one line per failed handler on the ``plexus.worker`` logger.

A handler that succeeds costs a try block and nothing else: the line (and every field of it) is built only
in the ``except`` branch. It sits inside the retry loop, so each failed attempt is one line. Typed outcomes
that are decisions rather than faults are quieter: a cancellation (every agent of a cancelled tree ends with
one; the orchestrator logs the tree's end once) at DEBUG, a spent budget, a spawn denial, a middleware's
termination or a callee's `ApprovalRequired` passed on (a delegated send parked) at INFO; everything else at
WARNING.
"""

from __future__ import annotations

import logging

from plexus.core import (
    BaseBlock,
    BudgetExhaustedError,
    CancellationError,
    KernelError,
    MiddlewareTermination,
    SpawnDenied,
)
from plexus.runtime.interceptors._interceptors import HandleInput, HandleNext, Interceptor
from plexus.runtime.wire._orchestration import ApprovalRequired

__all__ = ["LoggingInterceptor"]

log = logging.getLogger("plexus.worker")


class LoggingInterceptor(Interceptor):
    """Logs ``handler failed`` (at the level its error calls for) with ``agent_id``, ``run_id`` (None
    outside a run), ``message_id``, ``error_type`` and ``error`` (the message) as fields, then re-raises."""

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        try:
            return await call_next(inp)
        except Exception as exc:
            _log_failure(inp, exc)
            raise


_DECISIONS = (BudgetExhaustedError, SpawnDenied, MiddlewareTermination, ApprovalRequired)


def _level(exc: Exception) -> int:
    if isinstance(exc, CancellationError):
        return logging.DEBUG
    return logging.INFO if isinstance(exc, _DECISIONS) else logging.WARNING


def _log_failure(inp: HandleInput, exc: Exception) -> None:
    level = _level(exc)
    if not log.isEnabledFor(level):
        return
    error_type = exc.error_type if isinstance(exc, KernelError) else type(exc).__name__
    run = inp.envelope.run
    run_id = run.run_id if run is not None else None
    agent_id = str(inp.agent.id)
    log.log(
        level,
        "handler failed: agent %s run %s: %s: %s",
        agent_id,
        run_id or "-",
        error_type,
        exc,
        extra={
            "agent_id": agent_id,
            "run_id": run_id,
            "message_id": inp.envelope.id,
            "error_type": error_type,
            "error": str(exc),
        },
    )
