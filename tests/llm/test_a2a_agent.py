"""Issue 41, item 2: remote A2A agents as tools and as handoff targets. The remote agent is a second Plexus
stack on loopback — its own nats-server, orchestrator, worker (`tests.gateway.apps`) and gateway serving A2A —
reached through the official a2a-sdk client. The local agents run in a real `plexus worker` process (killed
with SIGKILL in the crash test) against the fake OpenAI server, or in-process with a ScriptedModel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from plexus.core import AgentId, BaseBlock, ErrorBlock, Item, ItemKind, TextBlock, ToolResultBlock
from plexus.gateway import Gateway, GatewayConfig, hash_token
from plexus.llm import (
    A2AAgent,
    A2ATaskAccepted,
    LLMAgent,
    ScriptedModel,
    ScriptedTurn,
)
from plexus.llm._a2a import conversation_text
from plexus.orchestrator import Orchestrator, OrchestratorConfig
from plexus.runtime import App, NatsServer, Runtime, Worker, WorkerConfig
from tests.gateway.apps import app as remote_app
from tests.orchestrator.conftest import FAST, until_serving

from .fake_providers import Answer, FakeProvider, Sse, openai_frames

TOKEN = "remote-token-0123456789"
pytestmark = pytest.mark.timeout(180)


@dataclass
class RemoteStack:
    url: str  # the gateway's base URL; agents at <url>/a2a/<type>
    client: httpx.AsyncClient


@pytest.fixture
async def remote(tmp_path: Path) -> AsyncIterator[RemoteStack]:
    """A second Plexus cluster on loopback serving echo, leaf, failing and gatekeeper over A2A."""
    server = NatsServer(store_dir=tmp_path / "remote-nats")
    server.start()
    orch = worker = worker_rt = rt = gateway = client = None
    try:
        orch = await Orchestrator.connect(server.url, OrchestratorConfig(sweeper=FAST))
        await orch.start()
        worker_rt = await Runtime.connect(server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
        worker = Worker(remote_app, worker_rt, WorkerConfig(lease_ttl_s=3.0, heartbeat_s=0.5, ack_wait_s=5.0))
        await worker.start()
        rt = await Runtime.connect(server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
        await until_serving(rt.nc)
        config = GatewayConfig(
            token_hashes=frozenset({hash_token(TOKEN)}),
            heartbeat_s=1.0,
            a2a_types=("echo", "leaf", "failing", "gatekeeper"),
        )
        gateway = Gateway(rt, config, port=0)
        await gateway.start()
        client = httpx.AsyncClient(
            base_url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30.0
        )
        yield RemoteStack(gateway.url, client)
    finally:
        for step in (
            client.aclose() if client else None,
            gateway.stop() if gateway else None,
            worker.stop(drain_timeout=2) if worker else None,
            worker_rt.close() if worker_rt else None,
            orch.stop() if orch else None,
            rt.close() if rt else None,
        ):
            if step is not None:
                with contextlib.suppress(Exception):
                    await step
        server.stop()


async def _remote_runs(remote: RemoteStack, agent_type: str) -> list[dict[str, Any]]:
    page = (await remote.client.get("/v1/runs", params={"agent_type": agent_type})).json()
    runs: list[dict[str, Any]] = page["runs"]
    return runs


def _text(blocks: list[BaseBlock]) -> str:
    return " ".join(b.text for b in blocks if isinstance(b, TextBlock))


# -- across a worker kill -9 ---------------------------------------------------------------------------
def _caller_turns(body: dict[str, Any]) -> Answer:
    """Turn 1 asks the remote leaf for a long task; turn 2 repeats what the tool answered."""
    results = [m for m in body["messages"] if m["role"] == "tool"]
    system = json.dumps(body["messages"][0])
    if "Router." in system:
        return Sse(openai_frames("", [("call_h1", "transfer_to_echo", "{}")]))
    if not results:
        ask = json.dumps({"message": json.dumps({"steps": 16, "sleep": 0.5})})
        return Sse(openai_frames("asking", [("call_a1", "leaf", ask)]))
    return Sse(openai_frames(f"remote said: {results[0]['content']}"))


async def _kill(proc: Any) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL


async def test_a_remote_agent_answers_as_a_tool_across_a_worker_kill_9(
    runtime: Runtime, worker_process: Any, remote: RemoteStack
) -> None:
    """The remote task's id is journaled once the remote accepted it: the worker that takes over after the
    crash follows that task (resubscribe) and the remote runs it once; the reply is its answer."""
    async with FakeProvider(_caller_turns) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url, "REMOTE_A2A_URL": remote.url, "REMOTE_A2A_TOKEN": TOKEN}
        first = worker_process("tests.llm.apps_a2a:app", "--worker-id", "w1", env=env)
        await runtime.get("caller", lazy=False, timeout=60)
        reply_task = asyncio.ensure_future(
            runtime.send_message(
                [TextBlock(text="ask the leaf")], AgentId("caller", "k1"), timeout=120, message_id="m-kill-1"
            )
        )
        ledger = runtime.event_log(AgentId("caller.a2a-tasks", "k1#m-kill-1"))
        async with asyncio.timeout(60):  # the remote accepted the task: its id is journaled
            while not (records := await ledger.read()):  # noqa: ASYNC110 - another process writes it
                await asyncio.sleep(0.05)
        (accepted,) = [r.entry for r in records]
        assert isinstance(accepted, A2ATaskAccepted)
        assert accepted.call_id == "call_a1"
        running = await _remote_runs(remote, "leaf")
        assert [r["run_id"] for r in running] == [accepted.task_id]
        assert running[0]["status"] in ("pending", "running")  # killed while the remote task still runs
        await _kill(first)
        worker_process("tests.llm.apps_a2a:app", "--worker-id", "w2", env=env)
        reply = await asyncio.wait_for(reply_task, 120)

    assert _text(reply).startswith("remote said: ")
    assert _text(reply).endswith("did 16")
    # Sent once: the remote ran one leaf task, the one journaled; the ledger was not written again.
    runs = await _remote_runs(remote, "leaf")
    assert [(r["run_id"], r["status"]) for r in runs] == [(accepted.task_id, "completed")]
    assert len(await ledger.read()) == 1
    # The model was asked for turn 1 once (journaled), for turn 2 once.
    assert fake.count == 2


async def test_a_remote_agent_is_a_handoff_target(
    runtime: Runtime, worker_process: Any, remote: RemoteStack
) -> None:
    async with FakeProvider(_caller_turns) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url, "REMOTE_A2A_URL": remote.url, "REMOTE_A2A_TOKEN": TOKEN}
        worker_process("tests.llm.apps_a2a:app", env=env)
        await runtime.get("router", lazy=False, timeout=60)
        reply = await runtime.send_message(
            [TextBlock(text="hello there")], AgentId("router", "r1"), timeout=90
        )
        assert fake.count == 1  # the handoff's answer is the reply: no further model call
    # The conversation's words went to the remote echo agent as one message; its answer is the reply.
    assert _text(reply) == "echo #1: hello there"
    assert [r["status"] for r in await _remote_runs(remote, "echo")] == ["completed"]


# -- bad input: typed errors the model sees, never a stuck run ---------------------------------------
@pytest.fixture
def garbage_server() -> Iterator[str]:
    """An HTTP server with two agents whose cards are fine: ``/garbage`` answers JSON-RPC with garbage,
    ``/gone`` closes the connection without an answer (a remote that went away mid-call)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            port = int(self.server.server_address[1])  # type: ignore[index]  # an AF_INET server: (host, port)
            agent = self.path.split("/")[1]
            card = {
                "name": "garbler",
                "description": "answers garbage",
                "version": "1",
                "supportedInterfaces": [
                    {
                        "url": f"http://127.0.0.1:{port}/{agent}",
                        "protocolBinding": "JSONRPC",
                        "protocolVersion": "1.0",
                    }
                ],
                "capabilities": {"streaming": False},
                "defaultInputModes": ["text/plain"],
                "defaultOutputModes": ["text/plain"],
                "skills": [],
            }
            self._send(json.dumps(card).encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path == "/gone":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._send(b'{"jsonrpc": "2.0", "id": 7, "result": {"what": [1, 2')

        def _send(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _error_seen(runtime: Runtime, start_worker: Any, tool: A2AAgent, message: str) -> ErrorBlock:
    """Run a scripted agent whose turn 1 calls the remote tool; the error result the model saw in turn 2."""
    tools = await tool.list_tools()
    model = ScriptedModel(
        [ScriptedTurn(tool_calls=[("c1", tools[0].name, {"message": message})]), ScriptedTurn(text="ok")]
    )
    app = App()
    app.register("asker", lambda _id: LLMAgent(model, tools=[tool]))
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="go")], AgentId("asker", "a1"), timeout=60)
    assert _text(reply) == "ok"
    results = [b for b in model.requests[1].items[-1].blocks if isinstance(b, ToolResultBlock)]
    assert results[0].is_error, results
    error = results[0].content[0]
    assert isinstance(error, ErrorBlock)
    return error


async def test_a_failed_remote_task_is_an_error_result_the_model_sees(
    runtime: Runtime, start_worker: Any, remote: RemoteStack
) -> None:
    error = await _error_seen(runtime, start_worker, A2AAgent(f"{remote.url}/a2a/failing", TOKEN), "x")
    assert error.error_type == "A2ATaskFailedError"
    assert "failed" in error.message
    assert "nope" in error.message


async def test_an_input_required_remote_task_is_an_error_result_naming_it(
    runtime: Runtime, start_worker: Any, remote: RemoteStack
) -> None:
    error = await _error_seen(runtime, start_worker, A2AAgent(f"{remote.url}/a2a/gatekeeper", TOKEN), "open")
    assert error.error_type == "A2AInputRequiredError"
    assert "door-1" in error.message


async def test_a_remote_agent_that_answers_garbage_is_a_protocol_error(
    runtime: Runtime, start_worker: Any, garbage_server: str
) -> None:
    error = await _error_seen(runtime, start_worker, A2AAgent(f"{garbage_server}/garbage"), "hi")
    assert error.error_type == "A2AProtocolError"


async def test_a_remote_agent_that_disappears_mid_call_is_an_error_result(
    runtime: Runtime, start_worker: Any, garbage_server: str
) -> None:
    error = await _error_seen(runtime, start_worker, A2AAgent(f"{garbage_server}/gone"), "hi")
    assert error.error_type == "A2AAgentError"
    assert "unreachable" in error.message


async def test_an_unreachable_card_fails_the_message_with_a_typed_error() -> None:
    from plexus.llm import A2AAgentError

    with pytest.raises(A2AAgentError, match="unreachable"):
        await A2AAgent(f"http://127.0.0.1:{_closed_port()}/a2a/x", connect_timeout_s=5).list_tools()


async def test_the_card_names_and_describes_the_tool(remote: RemoteStack) -> None:
    (tool,) = await A2AAgent(f"{remote.url}/a2a/echo", TOKEN).list_tools()
    assert tool.name == "echo"
    assert tool.description.startswith("replies with its input")
    assert tool.schema["required"] == ["message"]
    (named,) = await A2AAgent(f"{remote.url}/a2a/echo", TOKEN, name="helper", description="d").list_tools()
    assert (named.name, named.description) == ("helper", "d")


def test_a_handoff_sends_the_conversation_as_text() -> None:
    items = [
        Item(kind=ItemKind.USER, blocks=[TextBlock(text="hi")]),
        Item(kind=ItemKind.ASSISTANT, blocks=[TextBlock(text="hello")]),
        Item(kind=ItemKind.USER, blocks=[TextBlock(text="refund?")]),
    ]
    assert conversation_text(items[:1]) == "hi"
    assert conversation_text(items) == "user: hi\n\nassistant: hello\n\nuser: refund?"
    with pytest.raises(ValueError, match="http"):
        A2AAgent("ftp://x")
