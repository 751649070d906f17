"""`MetricsInterceptor`: handled messages, handler latency and tokens charged, as OpenTelemetry metrics.

Records only while a metrics exporter is installed (`configure_telemetry`); otherwise each hook is one
boolean check. The other instruments (redeliveries, dead letters, activations, orchestrator decisions) are
recorded where those events happen; all are listed in `_telemetry.INSTRUMENTS` and docs/operations.md.
"""

from __future__ import annotations

import time

from plexus.core import BaseBlock, BudgetExhaustedError
from plexus.runtime.interceptors._interceptors import (
    HandleInput,
    HandleNext,
    Interceptor,
    UsageInput,
    UsageNext,
)
from plexus.runtime.ops._telemetry import INSTRUMENTS, metrics_enabled

__all__ = ["MetricsInterceptor"]


class MetricsInterceptor(Interceptor):
    """``plexus.messages`` {agent_type, outcome}, ``plexus.handler.duration`` {agent_type} and
    ``plexus.budget.tokens`` {agent_type}."""

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        if not metrics_enabled():
            return await call_next(inp)
        attributes = {"agent_type": inp.agent_type.name}
        outcome = "error"
        start = time.perf_counter()
        try:
            result = await call_next(inp)
            outcome = "ok"
            return result
        finally:
            INSTRUMENTS.handler_duration.record(time.perf_counter() - start, attributes)
            INSTRUMENTS.messages.add(1, {**attributes, "outcome": outcome})

    async def usage(self, inp: UsageInput, call_next: UsageNext) -> None:
        # The worker's `WorkerBackend` runs this innermost in `ctx.usage`'s chain while metrics are enabled
        # (the handle chain's instance is never called for usage): it counts what the run tree was charged,
        # including the call that exhausted the budget (its tokens were added before the refusal).
        try:
            await call_next(inp)
        except BudgetExhaustedError:
            self._count(inp)
            raise
        self._count(inp)

    @staticmethod
    def _count(inp: UsageInput) -> None:
        if metrics_enabled() and inp.usage.total_tokens:
            INSTRUMENTS.budget_tokens.add(inp.usage.total_tokens, {"agent_type": inp.ctx.agent_id.type})
