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
    is cancelled and the caller gets `CancellationError("deadline")`.
    """

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        limits: list[float] = []
        if inp.envelope.deadline is not None:
            limits.append(inp.envelope.deadline - time.time())
        if inp.agent_type.time_limit_s is not None:
            limits.append(inp.agent_type.time_limit_s)
        if not limits:
            return await call_next(inp)
        remaining = min(limits)
        if remaining <= 0:
            raise CancellationError("deadline")
        loop = asyncio.get_running_loop()
        handle = loop.call_later(remaining, inp.ctx._controller.cancel, "deadline")
        try:
            async with asyncio.timeout(remaining + 0.05):  # a short grace for cooperative handlers
                return await call_next(inp)
        except TimeoutError:
            raise CancellationError("deadline") from None
        finally:
            handle.cancel()


_tracer = trace.get_tracer("plexus.runtime")


class TracingInterceptor(Interceptor):
    """OpenTelemetry spans for send / publish / handle; W3C trace context travels in NATS headers."""

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        parent = propagate.extract(dict(inp.headers))
        with _tracer.start_as_current_span(
            f"plexus.handle {inp.agent_type.name}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={"plexus.agent_id": str(inp.agent.id), "plexus.message_id": inp.envelope.id},
        ):
            return await call_next(inp)

    async def send(self, inp: SendInput, call_next: SendNext) -> list[BaseBlock]:
        with _tracer.start_as_current_span(
            f"plexus.send {inp.recipient.type}",
            kind=trace.SpanKind.PRODUCER,
            attributes={"plexus.agent_id": str(inp.recipient), "plexus.message_id": inp.message_id},
        ):
            propagate.inject(inp.headers)
            return await call_next(inp)

    async def publish(self, inp: PublishInput, call_next: PublishNext) -> None:
        with _tracer.start_as_current_span(
            f"plexus.publish {inp.topic.type}",
            kind=trace.SpanKind.PRODUCER,
            attributes={"plexus.topic": str(inp.topic), "plexus.message_id": inp.message_id},
        ):
            propagate.inject(inp.headers)
            await call_next(inp)
