"""The interceptor chain: each cross-cutting feature wraps one interception point.

Points: ``handle`` (one envelope), ``send`` / ``publish`` (from a client, or from a handler through
``ctx.send`` / ``ctx.publish``), and the other `Context` calls a handler makes: ``usage``, ``spawn`` and
``emit_progress``. Each takes ONE frozen input dataclass and a `call_next`; adding a field to an input never
breaks an interceptor. An interceptor that does not override a point is left out of that point's chain, so
features nobody configured cost nothing. Interceptors also get a lifecycle (`start` / `stop`, with the
worker) and declare the agent-type options they read (`options`, as dramatiq's middleware declares
``actor_options``): registering a type with an option no installed interceptor declares is an error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from plexus.core import AgentId, AgentStep, BaseBlock, TopicId, Usage

if TYPE_CHECKING:
    from plexus.runtime._agent import Agent, AgentType
    from plexus.runtime._context import Context
    from plexus.runtime.store._connection import Connection
    from plexus.runtime.wire._envelope import Envelope

__all__ = [
    "Delivery",
    "HandleInput",
    "Interceptor",
    "ProgressInput",
    "PublishInput",
    "SendInput",
    "SpawnInput",
    "TracingInterceptor",
    "UsageInput",
    "chain",
    "compose",
    "overrides",
]

_In = TypeVar("_In")
_Out = TypeVar("_Out")


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


@dataclass(frozen=True)
class UsageInput:
    """``ctx.usage(...)``: consumption reported by a handler (the terminal charges the tree budget)."""

    ctx: Context
    usage: Usage
    turns: int


@dataclass(frozen=True)
class SpawnInput:
    """``ctx.spawn(...)``: a child run started by a handler."""

    ctx: Context
    child: AgentId
    blocks: list[BaseBlock]
    priority: int | None
    timeout_s: float


@dataclass(frozen=True)
class ProgressInput:
    """``ctx.emit_progress(...)``: a progress event on the run tree's subject."""

    ctx: Context
    step: AgentStep
    content: list[BaseBlock]
    metadata: Mapping[str, Any]


HandleNext = Callable[[HandleInput], Awaitable[list[BaseBlock] | None]]
SendNext = Callable[[SendInput], Awaitable[list[BaseBlock]]]
PublishNext = Callable[[PublishInput], Awaitable[None]]
UsageNext = Callable[[UsageInput], Awaitable[None]]
SpawnNext = Callable[[SpawnInput], Awaitable[list[BaseBlock]]]
ProgressNext = Callable[[ProgressInput], Awaitable[None]]


class Interceptor:
    """Base interceptor: every hook delegates to `call_next` unless overridden.

    `options` names the agent-type options (``App.register(..., options={...})``) this interceptor reads
    from ``inp.agent_type.options``; `start` and `stop` run when a worker hosting it starts and stops.
    """

    options: ClassVar[frozenset[str]] = frozenset()

    async def start(self, connection: Connection, worker_id: str) -> None:
        """Called once when the worker starts, before any message is handled."""

    async def stop(self) -> None:
        """Called once when the worker has stopped handling messages (after its drain)."""

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        return await call_next(inp)

    async def send(self, inp: SendInput, call_next: SendNext) -> list[BaseBlock]:
        return await call_next(inp)

    async def publish(self, inp: PublishInput, call_next: PublishNext) -> None:
        return await call_next(inp)

    async def usage(self, inp: UsageInput, call_next: UsageNext) -> None:
        return await call_next(inp)

    async def spawn(self, inp: SpawnInput, call_next: SpawnNext) -> list[BaseBlock]:
        return await call_next(inp)

    async def emit_progress(self, inp: ProgressInput, call_next: ProgressNext) -> None:
        return await call_next(inp)


def overrides(interceptor: Interceptor, hook: str) -> bool:
    """Whether `interceptor` does something at `hook` (the base class only passes the call on)."""
    return getattr(type(interceptor), hook) is not getattr(Interceptor, hook)


def chain(interceptors: Sequence[Interceptor], hook: str, terminal: Callable[[Any], Awaitable[Any]]) -> Any:
    """Compose `interceptors` around `terminal` for one hook; the first interceptor is the outermost.

    Interceptors that do not override `hook` are skipped: with none left, the terminal itself is returned.
    """
    return compose([getattr(i, hook) for i in interceptors if overrides(i, hook)], terminal)


def compose(
    wrappers: Sequence[Callable[[_In, Callable[[_In], Awaitable[_Out]]], Awaitable[_Out]]],
    terminal: Callable[[_In], Awaitable[_Out]],
) -> Callable[[_In], Awaitable[_Out]]:
    """`wrappers` around `terminal`, the first one outermost: each is called with the input and the rest.

    The one composition of the runtime: the interceptor chains (`chain`) and the worker's message steps
    (`worker/pipeline/`) are both built with it.
    """
    call = terminal
    for wrapper in reversed(wrappers):
        call = _bind(wrapper, call)
    return call


def _bind(
    wrapper: Callable[[_In, Callable[[_In], Awaitable[_Out]]], Awaitable[_Out]],
    nxt: Callable[[_In], Awaitable[_Out]],
) -> Callable[[_In], Awaitable[_Out]]:
    # A plain function handing back the wrapper's own awaitable: no coroutine of its own per call (seven
    # interceptors and steps wrap every message's handler).
    def link(inp: _In) -> Awaitable[_Out]:
        return wrapper(inp, nxt)

    return link


_tracer = trace.get_tracer("plexus.runtime")
#: Providers whose spans are all no-ops: the API's defaults (no SDK installed).
_NOOP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_UNKNOWN = object()


class _TracingState:
    """Whether spans would record, and which headers carry trace context; each cached per global object.

    Looked up on every message because a provider (or propagator) may be installed after import, but the
    isinstance test and the propagator's field set are computed once per object.
    """

    def __init__(self) -> None:
        self._provider: object = None
        self._recording = False
        self._textmap: object = None
        self._fields: frozenset[str] = frozenset()

    def recording(self) -> bool:
        # `get_tracer_provider()` looks in os.environ on every call while none is set (≈ 1 µs, on every
        # message): the global it fills is read directly once a first call has settled the environment's
        # say. An opentelemetry without that global gets the public call every time.
        provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
        if provider is None and self._provider is not None and not self._recording:
            return False  # still none set
        if provider is None or provider is _UNKNOWN:
            provider = trace.get_tracer_provider()
        if provider is not self._provider:
            self._recording = not isinstance(provider, _NOOP_PROVIDERS)
            self._provider = provider
        return self._recording

    def carries_context(self, headers: Mapping[str, str]) -> bool:
        textmap = propagate.get_global_textmap()
        if textmap is not self._textmap:
            self._fields = frozenset(textmap.fields)
            self._textmap = textmap
        return not self._fields.isdisjoint(headers)  # (a set test in C: runs on every handled message)


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
