"""The NATS micro-service front of the orchestrator: endpoints ``start``, ``spawn``, ``finished``,
``crashed``, ``cancel``, ``get`` and ``approve`` under ``<prefix>.<ns>.orch.<verb>`` (queue group ``q``,
so replicas share the load; discoverable through ``$SRV.PING|INFO|STATS``).

A request either gets the JSON reply of its verb or a micro error reply whose body is the
`KernelError.to_wire()` dict (headers ``Nats-Service-Error``/``-Code``). No input can crash the service:
undecodable bodies and invalid fields are `InvalidRunRequest`, unexpected failures are answered as
`HandlerError` and logged; state is only ever changed by compare-and-swap, so a failed request leaves
the run as it was.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointStats, Service
from opentelemetry import propagate, trace

from plexus.core import (
    AgentNotFoundError,
    BudgetExhaustedError,
    CancellationError,
    HandlerError,
    KernelError,
    SpawnDenied,
)
from plexus.runtime import InvalidScheduleError, ServiceUnavailableError
from plexus.runtime.kernel import escape_token, is_unavailable
from plexus.runtime.orchestration import (
    ORCH_SERVICE_NAME,
    SCHEDULE_VERBS,
    ApproveRequest,
    CancelRequest,
    CrashReport,
    FinishedReport,
    GetRunRequest,
    InvalidRunRequest,
    RunNotFoundError,
    RunSchedule,
    RunStateError,
    ScheduleNotFoundError,
    ScheduleRef,
    SpawnRequest,
    StartRunRequest,
    TooManySchedulesError,
    TriggerRequest,
    orch_subject,
)

from ._engine import Engine
from ._schedule_api import ScheduledRunsApi
from ._validate import decode_request

__all__ = ["VERBS", "OrchestratorService", "error_code"]

log = logging.getLogger("plexus.orchestrator")

SERVICE_VERSION = "0.1.0"
VERBS = (
    "start",
    "spawn",
    "finished",
    "crashed",
    "cancel",
    "get",
    "approve",
    *SCHEDULE_VERBS,
)

_CODES: tuple[tuple[type[KernelError], str], ...] = (
    (InvalidRunRequest, "400"),
    (InvalidScheduleError, "400"),
    (RunNotFoundError, "404"),
    (ScheduleNotFoundError, "404"),
    (TooManySchedulesError, "429"),
    (AgentNotFoundError, "404"),
    (RunStateError, "409"),
    (CancellationError, "409"),
    (BudgetExhaustedError, "409"),
    (SpawnDenied, "429"),
)
_ENCODER = msgspec.json.Encoder()


def error_code(error: KernelError) -> str:
    """The micro error code of a typed failure (HTTP-like: 400 bad input, 404 unknown run or agent type,
    409 state, 429 spawn budget, 500 our fault)."""
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return "500"


_tracer = trace.get_tracer("plexus.orchestrator")


class OrchestratorService:
    """Registers the endpoints on a connection and turns each request into an `Engine` call."""

    def __init__(
        self,
        nc: NATS,
        engine: Engine,
        prefix: str,
        namespace: str | None = None,
        schedules: ScheduledRunsApi | None = None,
    ) -> None:
        self.nc = nc
        self.engine = engine
        self.schedules = schedules
        self.prefix = prefix
        # None serves every namespace: the run state is keyed by run id, not by namespace.
        self.namespace_token = "*" if namespace is None else escape_token(namespace)
        self.service: Service | None = None
        self.errors: dict[str, Counter[str]] = {verb: Counter() for verb in VERBS}

    async def start(self) -> Service:
        routes: dict[str, tuple[type[Any], Callable[[Any], Awaitable[Any]]]] = {
            "start": (StartRunRequest, self.engine.start),
            "spawn": (SpawnRequest, self.engine.spawn),
            "finished": (FinishedReport, self.engine.finished),
            "crashed": (CrashReport, self.engine.crashed),
            "cancel": (CancelRequest, self.engine.cancel),
            "get": (GetRunRequest, self.engine.get),
            "approve": (ApproveRequest, self.engine.approve),
        }
        if self.schedules is not None:
            sched = self.schedules
            routes.update(
                {
                    "sched_put": (RunSchedule, sched.put),
                    "sched_get": (ScheduleRef, sched.get),
                    "sched_list": (ScheduleRef, sched.list),
                    "sched_pause": (ScheduleRef, sched.pause),
                    "sched_resume": (ScheduleRef, sched.resume),
                    "sched_trigger": (TriggerRequest, sched.trigger),
                    "sched_rm": (ScheduleRef, sched.delete),
                }
            )
        service = await add_service(
            self.nc,
            name=ORCH_SERVICE_NAME,
            version=SERVICE_VERSION,
            description="Plexus run trees: budgets, spawn slots, retries, cancellation, deadlines",
            metadata={"prefix": self.prefix, "namespace": self.namespace_token},
            stats_handler=self._stats,
        )
        for verb, (kind, call) in routes.items():
            await service.add_endpoint(
                name=verb,
                subject=orch_subject(self.prefix, self.namespace_token, verb),
                handler=self._handler(verb, kind, call),
            )
        self.service = service
        return service

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
            self.service = None

    def _stats(self, endpoint: EndpointStats) -> dict[str, Any]:
        # Our handlers answer errors themselves (to send the typed body), so micro's own error count stays
        # 0; the typed counts go into each endpoint's `data`.
        errors = self.errors.get(endpoint.name, Counter())
        return {"errors": sum(errors.values()), "by_type": dict(errors)}

    def _handler(
        self, verb: str, kind: type[Any], call: Callable[[Any], Awaitable[Any]]
    ) -> Callable[[Request], Awaitable[None]]:
        async def handle(request: Request) -> None:
            # The caller's trace context (OrchestratorClient sends it): this request and the decisions it
            # makes are spans of the run tree's trace.
            parent = propagate.extract(dict(request.headers or {}))
            with _tracer.start_as_current_span(
                f"plexus.orchestrator {verb}", context=parent, kind=trace.SpanKind.SERVER
            ):
                await serve(request)

        async def serve(request: Request) -> None:
            try:
                body = decode_request(verb, request.data, kind)
                result = await call(body)
                data = _ENCODER.encode(result)
            except KernelError as exc:
                await self._fail(verb, request, exc)
                return
            except Exception as exc:
                if is_unavailable(exc):  # our store did not answer (a leader election): the caller retries
                    log.warning("orchestrator %s: the store is unavailable: %r", verb, exc)
                    await self._fail(verb, request, ServiceUnavailableError("orchestrator store"))
                    return
                log.exception("orchestrator %s failed", verb)
                await self._fail(
                    verb, request, HandlerError(str(exc), type(exc).__name__, f"{ORCH_SERVICE_NAME}/{verb}")
                )
                return
            try:
                await request.respond(data)
            except Exception:
                log.debug("could not answer a %s request (no reply subject?)", verb, exc_info=True)

        return handle

    async def _fail(self, verb: str, request: Request, error: KernelError) -> None:
        self.errors[verb][error.error_type] += 1
        try:
            description = str(error).replace("\r", " ").replace("\n", " ")[:500]
            await request.respond_error(error_code(error), description, data=_ENCODER.encode(error.to_wire()))
        except Exception:
            log.debug("could not answer a failed %s request", verb, exc_info=True)
