"""The interceptor chain: each cross-cutting feature wraps "handle one envelope", "send" or "publish".

Each interception point takes ONE frozen input dataclass and a `call_next`; adding a field to an input never
breaks an interceptor. The worker and client know nothing of time limits, keep-alives or tracing: those are
interceptors here (and budgets/retries come from the orchestrator the same way).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from plexus.core import AgentId, BaseBlock, CancellationError, TopicId

if TYPE_CHECKING:
    from ._agent import Agent, AgentType
    from ._context import Context
    from ._envelope import Envelope

__all__ = [
    "DeadlineInterceptor",
    "Delivery",
    "HandleInput",
    "Interceptor",
    "PublishInput",
    "SendInput",
    "TracingInterceptor",
    "chain",
]


class Delivery(Protocol):
    """What the transport lets a handler do to its in-flight message."""

    async def in_progress(self) -> None: ...

    @property
    def ack_wait_s(self) -> float: ...


@dataclass(frozen=True)
class HandleInput:
    agent: Agent
    agent_type: AgentType
    blocks: list[BaseBlock]
    ctx: Context
    envelope: Envelope
    delivery: Delivery | None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SendInput:
    blocks: list[BaseBlock]
    recipient: AgentId
    sender: AgentId | None
    message_id: str
    timeout_s: float
    headers: dict[str, str]
    run: Any = None
    kind: str = "send"


@dataclass(frozen=True)
class PublishInput:
    blocks: list[BaseBlock]
    topic: TopicId
    sender: AgentId | None
    message_id: str
    headers: dict[str, str]
    run: Any = None


HandleNext = Callable[[HandleInput], Awaitable[list[BaseBlock] | None]]
SendNext = Callable[[SendInput], Awaitable[list[BaseBlock]]]
PublishNext = Callable[[PublishInput], Awaitable[None]]


class Interceptor:
    """Base interceptor: every hook delegates to `call_next` unless overridden."""

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        return await call_next(inp)

    async def send(self, inp: SendInput, call_next: SendNext) -> list[BaseBlock]:
        return await call_next(inp)

    async def publish(self, inp: PublishInput, call_next: PublishNext) -> None:
        return await call_next(inp)


def chain(interceptors: Sequence[Interceptor], hook: str, terminal: Callable[[Any], Awaitable[Any]]) -> Any:
    """Compose `interceptors` around `terminal` for one hook; the first interceptor is the outermost."""
    call: Callable[[Any], Awaitable[Any]] = terminal
    for interceptor in reversed(interceptors):
        method = getattr(interceptor, hook)
        call = _bind(method, call)
    return call


def _bind(
    method: Callable[[Any, Any], Awaitable[Any]], nxt: Callable[[Any], Awaitable[Any]]
) -> Callable[[Any], Awaitable[Any]]:
    async def step(inp: Any) -> Any:
        return await method(inp, nxt)

    return step


class DeadlineInterceptor(Interceptor):
    """Enforces the earlier of the envelope's deadline and the agent type's time limit.

    The handler's cancellation token fires first (cooperative); if the handler ignores it, the handler task
    is cancelled after a short grace and the caller gets `CancellationError("deadline")`.
    """

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        remaining = inp.agent_type.time_limit_s
        deadline = inp.envelope.deadline
        if deadline is not None:
            left = deadline - time.time()
            remaining = left if remaining is None else min(remaining, left)
        if remaining is None:
            return await call_next(inp)
        if remaining <= 0:
            raise CancellationError("deadline")
        expiry = _Expiry(inp.ctx, remaining)
        try:
            return await call_next(inp)
        except asyncio.CancelledError:
            if expiry.close():
                raise CancellationError("deadline") from None
            raise
        finally:
            expiry.close()


#: How long a handler may run on after its cancellation token fired before its task is cancelled.
_GRACE_S = 0.05


class _Expiry:
    """One loop timer per message (every send carries a deadline, so this is on the hot path).

    A timer plus `asyncio.timeout` cost ≈ 7.5 µs per message; the second timer is only created when the
    first one fires. The hard cancel follows `asyncio.timeout`'s rules: it is undone by `uncancel()` and
    reported only when nobody else cancelled the task meanwhile.
    """

    __slots__ = ("_cancelled", "_cancelling", "_ctx", "_loop", "_task", "_timer")

    def __init__(self, ctx: Context, delay: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a running task")
        self._ctx = ctx
        self._task = task
        self._loop = asyncio.get_running_loop()
        self._cancelling = task.cancelling()
        self._cancelled = 0
        self._timer = self._loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self._ctx._controller.cancel("deadline")
        self._timer = self._loop.call_later(_GRACE_S, self._cancel_task)

    def _cancel_task(self) -> None:
        self._cancelled += 1
        self._task.cancel()
        # Re-cancel until disarmed: nats-py swallows a CancelledError that lands inside its publish path.
        self._timer = self._loop.call_later(0.1, self._cancel_task)

    def close(self) -> bool:
        """Disarm (idempotent); True when this expiry cancelled the task and no one else did."""
        self._timer.cancel()
        if not self._cancelled:
            return False
        remaining = self._task.cancelling()
        for _ in range(self._cancelled):
            remaining = self._task.uncancel()
        self._cancelled = 0
        return remaining <= self._cancelling


_tracer = trace.get_tracer("plexus.runtime")
#: Providers whose spans are all no-ops: the API's defaults (no SDK installed).
_NOOP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


class _TracingState:
    """Whether spans would record, and which headers carry trace context; each cached per global object.

    Looked up on every message because a provider (or propagator) may be installed after import, but the
    isinstance test and the propagator's field set are computed once per object.
    """

    def __init__(self) -> None:
        self._provider: object = None
        self._recording = False
        self._textmap: object = None
        self._fields: tuple[str, ...] = ()

    def recording(self) -> bool:
        provider = trace.get_tracer_provider()
        if provider is not self._provider:
            self._recording = not isinstance(provider, _NOOP_PROVIDERS)
            self._provider = provider
        return self._recording

    def carries_context(self, headers: Mapping[str, str]) -> bool:
        textmap = propagate.get_global_textmap()
        if textmap is not self._textmap:
            self._fields = tuple(textmap.fields)
            self._textmap = textmap
        return any(name in headers for name in self._fields)


_tracing = _TracingState()


class TracingInterceptor(Interceptor):
    """OpenTelemetry spans for send / publish / handle; W3C trace context travels in NATS headers.

    Without an SDK tracer provider every span is a no-op costing ≈ 6 µs, so a hook skips it when there is
    also no trace context to pass on (none received, none current); otherwise it runs as usual, which with
    the no-op tracer forwards an incoming ``traceparent`` to the messages the handler sends.
    """

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        if (
            not _tracing.recording()
            and not otel_context.get_current()
            and not _tracing.carries_context(inp.headers)
        ):
            return await call_next(inp)
        parent = propagate.extract(dict(inp.headers))
        with _tracer.start_as_current_span(
            f"plexus.handle {inp.agent_type.name}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={"plexus.agent_id": str(inp.agent.id), "plexus.message_id": inp.envelope.id},
        ):
            return await call_next(inp)

    async def send(self, inp: SendInput, call_next: SendNext) -> list[BaseBlock]:
        if not _tracing.recording() and not otel_context.get_current():
            return await call_next(inp)
        with _tracer.start_as_current_span(
            f"plexus.send {inp.recipient.type}",
            kind=trace.SpanKind.PRODUCER,
            attributes={"plexus.agent_id": str(inp.recipient), "plexus.message_id": inp.message_id},
        ):
            propagate.inject(inp.headers)
            return await call_next(inp)

    async def publish(self, inp: PublishInput, call_next: PublishNext) -> None:
        if not _tracing.recording() and not otel_context.get_current():
            await call_next(inp)
            return
        with _tracer.start_as_current_span(
            f"plexus.publish {inp.topic.type}",
            kind=trace.SpanKind.PRODUCER,
            attributes={"plexus.topic": str(inp.topic), "plexus.message_id": inp.message_id},
        ):
            propagate.inject(inp.headers)
            await call_next(inp)
