"""Retries of orchestrated runs by their `RetryPolicy`: crashed attempts, detected with a per-message
attempt counter, and handler exceptions and recoverable KernelErrors, retried in place.

Acts only on envelopes whose `RunInfo.orchestrated` is set; other messages pass straight through. It lives
with the worker, not in `interceptors/`, because it talks to the orchestrator (`client/_cluster.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from plexus.core import AgentCrashError, BaseBlock, KernelError, RetryPolicy
from plexus.runtime._context import Context
from plexus.runtime.client._cluster import OrchestratorClient
from plexus.runtime.interceptors._interceptors import HandleInput, HandleNext, Interceptor
from plexus.runtime.wire._orchestration import CrashReport, attempt_counter_subject
from plexus.runtime.wire._subjects import escape_token

from ._steps import FENCED_WRITES, LOST_OWNERSHIP

__all__ = ["RetriesExhausted", "RetryInterceptor", "retryable"]

log = logging.getLogger("plexus.worker")


class RetriesExhausted(Exception):
    """A message's crashed attempts used up its run's retries: the worker dead-letters it first, then calls
    `report` (so the DLQ copy exists before anyone can see the run fail) and answers with `error`."""

    def __init__(self, error: AgentCrashError, report: Callable[[], Awaitable[None]]) -> None:
        self.error = error
        self.report = report
        super().__init__(str(error))


def retryable(exc: KernelError) -> bool:
    """Whether a handler's typed error may be retried by the run's policy at all (the policy then decides).

    Only recoverable errors: a provider's 429 or 5xx, a store outage, a type with no live worker yet (a reply
    timeout too, though `DEFAULT_NON_RETRYABLE` keeps the default policy from retrying it). Typed outcomes
    (budget, cancellation, spawn denial, a guardrail, a bad request) fail the same way again. An
    `AgentCrashError` reaching a handler is a callee whose crash retries are spent already. A fenced write
    (`ConcurrentAppendError`, `CheckpointConflictError`) means this activation lost its agent: the same
    activation would be fenced again, so it goes to `Fencing`, never to the policy.
    """
    return exc.recoverable and not isinstance(exc, (AgentCrashError, *FENCED_WRITES))


class RetryInterceptor(Interceptor):
    """Retries by the run's RetryPolicy.

    One counter per durable orchestrated message (`Nats-Incr`, atomic) numbers its attempts of both kinds,
    so `max_retries` bounds them together (at most ``max_retries + 1`` runs of the handler) and every
    report's ``attempt`` is higher than the last one's (the orchestrator ignores one it has seen).

    - Crashed attempts: each delivery that starts the handler counts one attempt. A count above 1 on a
      delivery means the attempt before it never ended: it died with its worker (or lost its lease). Within
      `max_retries` the handler runs again after the backoff, from the agent's last checkpoint; beyond it the
      worker dead-letters the message and the caller gets AgentCrashError.
    - Handler exceptions (HandlerError) and recoverable KernelErrors (`retryable`) are retried in place if
      the policy allows it, after the backoff and after the agent's state is restored from its checkpoint;
      each retry counts one attempt and is reported to the orchestrator (the run's ``attempts``).
    """

    def __init__(
        self,
        client: OrchestratorClient,
        reload: Callable[[Context], Awaitable[None]],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.reload = reload
        self.sleep = sleep

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        run = inp.envelope.run
        if run is None or not run.orchestrated or inp.delivery is None:
            return await call_next(inp)
        policy = RetryPolicy.model_validate(run.retry) if run.retry else RetryPolicy()
        attempt = await self._next_attempt(inp)
        if attempt > 1:  # the attempt before this one never ended: it crashed
            if not policy.should_retry("AgentCrashError", attempt - 1):
                raise RetriesExhausted(
                    AgentCrashError(run.run_id, inp.agent.id),
                    lambda: self._report(inp, attempt, "exhausted", 0.0),
                )
            backoff = policy.backoff(attempt - 1)
            await self._report(inp, attempt, "retry", backoff)
            await self.sleep(backoff)
        while True:
            try:
                return await call_next(inp)
            except LOST_OWNERSHIP:
                # A lost lease or a fenced write (the activation's log_seq or checkpoint revision is stale):
                # `Fencing` drops the activation and asks who owns the partition; retrying this activation
                # here would be fenced every time while holding the key's mailbox.
                raise
            except KernelError as exc:  # attempts 1..attempt have all failed: `attempt` failures so far
                if not retryable(exc) or not policy.should_retry(exc, attempt):
                    raise
                cause = exc.error_type
            except Exception as exc:
                if not policy.should_retry("HandlerError", attempt):
                    raise
                cause = type(exc).__name__
            backoff = policy.backoff(attempt)
            # The retry is an attempt of the same counter: a crash during it (or its backoff) is seen by the
            # next delivery as the attempt after it, and max_retries bounds both kinds together.
            attempt = await self._next_attempt(inp)
            log.info("retrying %s after %s (attempt %d)", inp.agent.id, cause, attempt)
            await self._report(inp, attempt, "retry", backoff, cause)
            await self.sleep(backoff)
            await self.reload(inp.ctx)

    async def _next_attempt(self, inp: HandleInput) -> int:
        """Count one more attempt of the message (atomic `Nats-Incr` on its counter); its number, from 1."""
        rt = self.client.rt
        subject = attempt_counter_subject(
            rt.prefix, escape_token(rt.namespace), escape_token(inp.envelope.id)
        )
        reply = await rt.nc.request(subject, b"", headers={"Nats-Incr": "1"}, timeout=5)
        return int(json.loads(reply.data)["val"])

    async def _report(
        self, inp: HandleInput, attempt: int, decision: str, backoff: float, cause: str = ""
    ) -> None:
        run = inp.envelope.run
        assert run is not None
        report = CrashReport(
            run_id=run.run_id,
            agent_id=str(inp.agent.id),
            message_id=inp.envelope.id,
            attempt=attempt,
            decision=decision,  # type: ignore[arg-type]
            backoff_s=backoff,
            cause=cause,
        )
        with contextlib.suppress(KernelError):  # visibility only: the decision stands without the service
            await self.client.call("crashed", report, dict, namespace=inp.agent.id.namespace)
