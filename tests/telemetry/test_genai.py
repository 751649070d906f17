"""Issue 41, item 4: an orchestrated LLM run tree exported over OTLP/HTTP as OpenTelemetry GenAI spans.

A real orchestrator and a real `plexus worker` process, configured by the standard OTLP variables, export
to a collector on loopback (protobuf, decoded with opentelemetry-proto); the agents call the fake OpenAI
server through the official SDK. ``triage`` hands off to ``billing``, whose tool spawns ``clerk``: the
``invoke_agent`` / ``chat`` / ``execute_tool`` spans carry the conventions' attributes and stay one tree
through both hops. Message content is on the spans only with
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as gm

from plexus.core import AgentId, SpawnBudget, TextBlock
from plexus.gateway import hash_token
from plexus.runtime import NatsServer, Runtime
from tests.llm.fake_providers import Answer, FakeProvider, Sse, openai_frames

REPO = Path(__file__).resolve().parents[2]
APP = "tests.telemetry.genai_app:app"
CONTENT = (ga.GEN_AI_INPUT_MESSAGES, ga.GEN_AI_OUTPUT_MESSAGES, ga.GEN_AI_SYSTEM_INSTRUCTIONS)
TOOL_CONTENT = (ga.GEN_AI_TOOL_CALL_ARGUMENTS, ga.GEN_AI_TOOL_CALL_RESULT)

pytestmark = pytest.mark.timeout(150)


class Collector:
    """Spans (with attributes) and metric names received over OTLP/HTTP."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.metric_names: set[str] = set()
        self.lock = threading.Lock()

    def take(self, path: str, body: bytes) -> None:
        with self.lock:
            if path == "/v1/traces":
                for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            self.spans.append(
                                {
                                    "name": span.name,
                                    "kind": span.kind,
                                    "trace": span.trace_id.hex(),
                                    "id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(),
                                    "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                                }
                            )
            elif path == "/v1/metrics":
                for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
                    for sm in rm.scope_metrics:
                        self.metric_names.update(m.name for m in sm.metrics)


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    store = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            store.take(self.path, self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield store, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _respond(body: dict[str, Any]) -> Answer:
    """The fake's answers, by the asking agent's system prompt."""
    system = json.dumps(body["messages"][0])
    if "Liaison." in system:
        answered = [m["content"] for m in body["messages"] if m.get("tool_call_id") == "call_l1"]
        if answered:
            return Sse(openai_frames(f"The clerk says: {answered[0]}"))
        return Sse(openai_frames("", [("call_l1", "clerk", '{"message": "invoice 7?"}')]))
    if "Triage." in system:
        return Sse(openai_frames("Over to billing.", [("call_t1", "transfer_to_billing", "{}")]))
    if "Billing." in system:
        if any(m.get("tool_call_id") == "call_b1" for m in body["messages"]):
            return Sse(openai_frames("Invoice 42 is paid."))
        return Sse(openai_frames("", [("call_b1", "ask_clerk", '{"question": "invoice 42?"}')]))
    return Sse(openai_frames("Paid on Monday."))


@pytest.mark.parametrize("capture", ["", "true"], ids=["no-content", "content-opted-in"])
async def test_a_run_tree_is_exported_as_genai_spans_through_handoff_and_spawn(
    nats_server: NatsServer, tmp_path: Path, collector: tuple[Collector, str], capture: str
) -> None:
    store, endpoint = collector
    async with FakeProvider(_respond) as fake:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "FAKE_OPENAI_URL": fake.base_url,
        }
        env.pop("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", None)
        if capture:
            env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = capture
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - test setup: real processes
                [sys.executable, "-m", "plexus.runtime.cli", *argv, "--nats", nats_server.url],
                stdout=(tmp_path / f"{argv[0]}.log").open("wb"),
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
            for argv in (["orchestrator"], ["worker", APP])
        ]
        try:
            rt = await Runtime.connect(nats_server.url)
            try:
                await rt.get("triage", lazy=False, timeout=60)  # the worker hosts the types
                run_id = await rt.start_run(
                    AgentId("triage", "alice"),
                    [TextBlock(text="Is invoice 42 paid?")],
                    spawn_budget=SpawnBudget(max_agents=4),
                )
                record = await rt.wait_run(run_id, timeout=60)
                assert record.status == "completed", record
                reply = await rt.run_result(run_id)
                assert [b.text for b in reply if isinstance(b, TextBlock)] == ["Invoice 42 is paid."]
            finally:
                await rt.close()

            def arrived() -> bool:
                names = {s["name"] for s in store.spans}
                return (
                    "invoke_agent clerk" in names
                    and "execute_tool ask_clerk" in names
                    and {
                        gm.GEN_AI_CLIENT_TOKEN_USAGE,
                        gm.GEN_AI_CLIENT_OPERATION_DURATION,
                    }
                    <= store.metric_names
                )

            async with asyncio.timeout(30):  # the worker's span batches and a metrics export arrive
                while not arrived():  # noqa: ASYNC110 - filled by the collector's thread
                    await asyncio.sleep(0.1)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)

    root = next(s for s in store.spans if s["name"] == "invoke_agent triage")
    tree = [s for s in store.spans if s["trace"] == root["trace"]]
    by_id = {s["id"]: s for s in tree}

    def ancestors(span: dict[str, Any]) -> list[str]:
        names = []
        while span["parent"] in by_id:
            span = by_id[span["parent"]]
            names.append(span["name"])
        return names

    def one(name: str) -> dict[str, Any]:
        found = [s for s in tree if s["name"] == name]
        assert len(found) == 1, (name, [s["name"] for s in tree])
        return found[0]

    # The agent loops: invoke_agent under the worker's handler span; each agent's name and id.
    for agent in ("triage", "billing", "clerk"):
        span = one(f"invoke_agent {agent}")
        assert by_id[span["parent"]]["name"] == f"plexus.handle {agent}"
        a = span["attributes"]
        assert a[ga.GEN_AI_OPERATION_NAME] == "invoke_agent"
        assert (a[ga.GEN_AI_AGENT_NAME], a[ga.GEN_AI_AGENT_ID]) == (agent, f"{agent}/alice")
        assert (a[ga.GEN_AI_PROVIDER_NAME], a[ga.GEN_AI_REQUEST_MODEL]) == ("openai", "fake-model")
    # The handoff hop: billing's loop is inside triage's; the spawn hop: clerk's inside billing's tool.
    assert "invoke_agent triage" in ancestors(one("invoke_agent billing"))
    clerk_path = ancestors(one("invoke_agent clerk"))
    assert clerk_path.index("execute_tool ask_clerk") < clerk_path.index("invoke_agent billing")
    assert clerk_path.index("invoke_agent billing") < clerk_path.index("invoke_agent triage")

    # Model calls: one chat span per call, a child of its agent's invoke_agent span (CLIENT kind = 3).
    chats = [s for s in tree if s["name"] == "chat fake-model"]
    assert len(chats) == 4  # triage 1, billing 2, clerk 1
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for chat in chats:
        by_agent.setdefault(by_id[chat["parent"]]["name"], []).append(chat["attributes"])
        assert chat["kind"] == 3
    assert {k: len(v) for k, v in by_agent.items()} == {
        "invoke_agent triage": 1,
        "invoke_agent billing": 2,
        "invoke_agent clerk": 1,
    }
    for a in (attrs for group in by_agent.values() for attrs in group):
        assert a[ga.GEN_AI_OPERATION_NAME] == "chat"
        assert a[ga.GEN_AI_PROVIDER_NAME] == "openai"
        assert a[ga.GEN_AI_REQUEST_MODEL] == a[ga.GEN_AI_RESPONSE_MODEL] == "fake-model"
        assert a[ga.GEN_AI_RESPONSE_ID] == "chatcmpl-fake"
        assert (a[ga.GEN_AI_USAGE_INPUT_TOKENS], a[ga.GEN_AI_USAGE_OUTPUT_TOKENS]) == (12, 7)
    triage_chat = by_agent["invoke_agent triage"][0]
    assert triage_chat[ga.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]
    assert (triage_chat[ga.GEN_AI_REQUEST_TEMPERATURE], triage_chat[ga.GEN_AI_REQUEST_MAX_TOKENS]) == (
        0.2,
        200,
    )
    assert by_agent["invoke_agent clerk"][0][ga.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
    assert ga.GEN_AI_REQUEST_TEMPERATURE not in by_agent["invoke_agent clerk"][0]

    # The tool execution.
    tool = one("execute_tool ask_clerk")
    assert by_id[tool["parent"]]["name"] == "invoke_agent billing"
    t = tool["attributes"]
    assert (t[ga.GEN_AI_OPERATION_NAME], t[ga.GEN_AI_TOOL_NAME], t[ga.GEN_AI_TOOL_CALL_ID]) == (
        "execute_tool",
        "ask_clerk",
        "call_b1",
    )

    # Content: only when opted in.
    everything = {key for s in tree for key in s["attributes"]}
    if not capture:
        assert not everything & {*CONTENT, *TOOL_CONTENT}
        return
    clerk_chat = by_agent["invoke_agent clerk"][0]
    assert json.loads(clerk_chat[ga.GEN_AI_SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "Clerk."}]
    assert json.loads(clerk_chat[ga.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "invoice 42?"}]}
    ]
    assert json.loads(clerk_chat[ga.GEN_AI_OUTPUT_MESSAGES]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Paid on Monday."}],
            "finish_reason": "stop",
        }
    ]
    assert json.loads(t[ga.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"question": "invoice 42?"}
    assert json.loads(t[ga.GEN_AI_TOOL_CALL_RESULT]) == [{"type": "text", "content": "Paid on Monday."}]


async def test_an_a2a_hop_keeps_the_tree_one_trace(
    nats_server: NatsServer, tmp_path: Path, collector: tuple[Collector, str]
) -> None:
    """``liaison``'s tool is the clerk served over A2A by a gateway: the A2A request carries the tool span's
    ``traceparent``, the gateway starts the clerk's run under it, so the clerk's spans are in the caller's
    trace, below its ``execute_tool`` span."""
    store, endpoint = collector
    token = "a2a-hop-token-0123456789"
    async with FakeProvider(_respond) as fake:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "FAKE_OPENAI_URL": fake.base_url,
            "A2A_GATEWAY_TOKEN": token,
        }
        cli = [sys.executable, "-m", "plexus.runtime.cli"]
        gateway = subprocess.Popen(  # noqa: ASYNC220 - test setup: real processes
            [*cli, "gateway", "--nats", nats_server.url, "--port", "0", "--token-hash", hash_token(token),
             "--a2a-type", "clerk"],
            stdout=subprocess.PIPE, stderr=(tmp_path / "gateway.log").open("wb"), env=env, cwd=REPO,
        )  # fmt: skip
        procs = [gateway]
        try:
            assert gateway.stdout is not None
            line = (await asyncio.to_thread(gateway.stdout.readline)).decode()
            env["A2A_GATEWAY_URL"] = line.split()[3]
            procs += [
                subprocess.Popen(  # noqa: ASYNC220 - test setup: real processes
                    [*cli, *argv, "--nats", nats_server.url],
                    stdout=(tmp_path / f"{argv[0]}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=REPO,
                )
                for argv in (["orchestrator"], ["worker", APP])
            ]
            rt = await Runtime.connect(nats_server.url)
            try:
                await rt.get("liaison", lazy=False, timeout=60)
                run_id = await rt.start_run(AgentId("liaison", "bob"), [TextBlock(text="Is invoice 7 paid?")])
                record = await rt.wait_run(run_id, timeout=60)
                assert record.status == "completed", record
                reply = await rt.run_result(run_id)
                assert [b.text for b in reply if isinstance(b, TextBlock)] == [
                    "The clerk says: Paid on Monday."
                ]
            finally:
                await rt.close()

            def arrived() -> bool:
                names = {s["name"] for s in store.spans}
                return {"invoke_agent clerk", "execute_tool clerk", "invoke_agent liaison"} <= names

            async with asyncio.timeout(30):  # the worker's span batches arrive
                while not arrived():  # noqa: ASYNC110 - filled by the collector's thread
                    await asyncio.sleep(0.1)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)

    root = next(s for s in store.spans if s["name"] == "invoke_agent liaison")
    by_id = {s["id"]: s for s in store.spans if s["trace"] == root["trace"]}
    clerk = [s for s in by_id.values() if s["name"] == "invoke_agent clerk"]
    assert len(clerk) == 1, sorted(s["name"] for s in by_id.values())
    path = []
    span = clerk[0]
    while span["parent"] in by_id:
        span = by_id[span["parent"]]
        path.append(span["name"])
    # The remote run's loop is below the tool span that made the A2A call, itself in liaison's loop.
    assert path.index("execute_tool clerk") < path.index("invoke_agent liaison"), path
    assert clerk[0]["attributes"][ga.GEN_AI_AGENT_NAME] == "clerk"
