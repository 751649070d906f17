"""End to end against a real nats-server: one trace spans the client's send, agent A's handler, A's own
`ctx.send` and agent B's handler; the W3C trace context travels in NATS headers between them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from plexus.core import AgentId, MessageId, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.wire._envelope import Envelope, encode_envelope, payload_from_blocks

from .apps_misc import DEADLINE, build_app
from .conftest import StartWorker


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans of this process, collected in memory.

    The global tracer provider can be set once per process: reuse an SDK provider another module installed,
    else install ours. Plexus's tracer is a proxy, so it picks the provider up even though it was created at
    import time.
    """
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        pytest.skip("a non-SDK global tracer provider is installed; spans cannot be captured here")
    memory = InMemorySpanExporter()
    processor = SimpleSpanProcessor(memory)
    provider.add_span_processor(processor)
    try:
        yield memory
    finally:
        processor.shutdown()  # the provider keeps it, but it exports nothing more


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


async def finished(exporter: InMemorySpanExporter, names: Sequence[str]) -> dict[str, ReadableSpan]:
    """Wait (with a deadline) until a span of each name has ended; returns them by name."""
    deadline = time.monotonic() + DEADLINE
    while True:
        by_name = {s.name: s for s in exporter.get_finished_spans() if s.name in names}
        if len(by_name) == len(names):
            return by_name
        if time.monotonic() > deadline:
            pytest.fail(f"spans {sorted(set(names) - set(by_name))} never ended; got {sorted(by_name)}")
        await asyncio.sleep(0.02)


def _ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def assert_child(child: ReadableSpan, parent: ReadableSpan, *, remote: bool) -> None:
    """`child` is a direct child of `parent` in the same trace; `remote` when the link crossed NATS."""
    assert child.parent is not None, f"{child.name} has no parent"
    trace_id, span_id = _ids(parent)
    assert child.parent.trace_id == trace_id
    assert child.parent.span_id == span_id, f"{child.name} is not a child of {parent.name}"
    assert child.parent.is_remote is remote


@pytest.mark.parametrize(
    ("a", "b"), [("relay-a", "relay-b"), ("relay-a-eph", "relay-b-eph")], ids=["durable", "ephemeral"]
)
async def test_one_trace_across_two_hops(
    runtime: Runtime, start_worker: StartWorker, spans: InMemorySpanExporter, a: str, b: str
) -> None:
    await start_worker(build_app())
    durable = not a.endswith("-eph")
    wire_subject = runtime.subjects.inbox(a, "k") if durable else runtime.subjects.ephemeral(a, "k")
    spy = await runtime.nc.subscribe(wire_subject)
    tracer = trace.get_tracer("tests.tracing")
    try:
        with tracer.start_as_current_span("caller") as caller:
            reply = await runtime.send_message([TextBlock(text="hop")], AgentId(a, "k"), timeout=DEADLINE)
        wire = await spy.next_msg(timeout=DEADLINE)
    finally:
        await spy.unsubscribe()
    assert reply == [TextBlock(text="a saw b"), TextBlock(text="hop")]

    got = await finished(
        spans, ["caller", f"plexus.send {a}", f"plexus.handle {a}", f"plexus.send {b}", f"plexus.handle {b}"]
    )
    root, send_a, handle_a = got["caller"], got[f"plexus.send {a}"], got[f"plexus.handle {a}"]
    send_b, handle_b = got[f"plexus.send {b}"], got[f"plexus.handle {b}"]

    assert len({_ids(s)[0] for s in got.values()}) == 1, "every hop must share the caller's trace"
    assert _ids(root)[0] == caller.get_span_context().trace_id
    assert_child(send_a, root, remote=False)
    assert_child(handle_a, send_a, remote=True)  # crossed NATS in the headers
    assert_child(send_b, handle_a, remote=False)  # A's ctx.send runs inside A's handle span
    assert_child(handle_b, send_b, remote=True)

    assert send_a.kind is trace.SpanKind.PRODUCER
    assert handle_a.kind is trace.SpanKind.CONSUMER
    assert send_a.attributes is not None
    assert handle_a.attributes is not None
    assert send_a.attributes["plexus.message_id"] == handle_a.attributes["plexus.message_id"]
    assert handle_a.attributes["plexus.agent_id"] == f"{a}/k"
    assert handle_b.attributes is not None
    assert handle_b.attributes["plexus.agent_id"] == f"{b}/k"

    # The W3C header on the wire names the send span as parent.
    trace_id, span_id = _ids(send_a)
    assert wire.headers is not None
    version, wire_trace, wire_parent, flags = wire.headers["traceparent"].split("-")
    assert (version, wire_trace, wire_parent) == ("00", f"{trace_id:032x}", f"{span_id:016x}")
    assert int(flags, 16) & 0x01, "sampled"


async def test_separate_sends_make_separate_traces(
    runtime: Runtime, start_worker: StartWorker, spans: InMemorySpanExporter
) -> None:
    await start_worker(build_app())
    for key in ("one", "two"):
        await runtime.send_message([TextBlock(text=key)], AgentId("relay-a", key), timeout=DEADLINE)
    deadline = time.monotonic() + DEADLINE
    while len(handles := [s for s in spans.get_finished_spans() if s.name == "plexus.handle relay-b"]) < 2:
        assert time.monotonic() < deadline, "B's handle spans never ended"
        await asyncio.sleep(0.02)
    assert len(handles) == 2
    assert _ids(handles[0])[0] != _ids(handles[1])[0]


@pytest.mark.parametrize("agent_type", ["echo", "echo-eph"])
async def test_message_without_trace_context_starts_its_own_trace(
    runtime: Runtime, start_worker: StartWorker, spans: InMemorySpanExporter, agent_type: str
) -> None:
    """No traceparent: the handle span is a root, never a child of whatever the worker ran before."""
    await start_worker(build_app())
    # Something traced first, so a leaked context would have a parent to leak.
    await runtime.send_message([TextBlock(text="warm")], AgentId(agent_type, "k"), timeout=DEADLINE)
    spans.clear()

    env = Envelope(
        id=str(MessageId.new()),
        kind="send",
        target=f"{agent_type}/k",
        payload=payload_from_blocks([TextBlock(text="bare")]),
        sent_at=time.time(),
    )
    headers = {"Nats-Msg-Id": env.id, "Plexus-V": "1"}
    if agent_type == "echo":
        await runtime.js.publish(
            runtime.subjects.inbox(agent_type, "k"), encode_envelope(env), headers=headers
        )
    else:
        await runtime.nc.request(
            runtime.subjects.ephemeral(agent_type, "k"),
            encode_envelope(env),
            timeout=DEADLINE,
            headers=headers,
        )
    got = await finished(spans, [f"plexus.handle {agent_type}"])
    handle = got[f"plexus.handle {agent_type}"]
    assert handle.attributes is not None
    assert handle.attributes["plexus.message_id"] == env.id
    assert handle.parent is None
