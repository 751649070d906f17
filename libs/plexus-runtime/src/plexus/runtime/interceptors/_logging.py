"""`LoggingInterceptor`: one WARNING line per failed handler on the ``plexus.worker`` logger.

A handler that succeeds costs a try block and nothing else: the line (and every field of it) is built only
in the ``except`` branch. It sits inside the retry loop, so each failed attempt is one line.
"""

from __future__ import annotations

import logging

from plexus.core import BaseBlock, KernelError

from ._interceptors import HandleInput, HandleNext, Interceptor

__all__ = ["LoggingInterceptor"]

log = logging.getLogger("plexus.worker")


class LoggingInterceptor(Interceptor):
    """Logs ``handler failed`` with ``agent_id``, ``run_id`` (None outside a run), ``message_id``,
    ``error_type`` and ``error`` (the message) as structured fields, then re-raises."""

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        try:
            return await call_next(inp)
        except Exception as exc:
            _log_failure(inp, exc)
            raise


def _log_failure(inp: HandleInput, exc: Exception) -> None:
    if not log.isEnabledFor(logging.WARNING):
        return
    error_type = exc.error_type if isinstance(exc, KernelError) else type(exc).__name__
    run = inp.envelope.run
    run_id = run.run_id if run is not None else None
    agent_id = str(inp.agent.id)
    log.warning(
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
