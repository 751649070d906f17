"""`plexus mcp serve`: agent types as MCP tools, driven by the official `mcp` SDK's client over stdio (the
command as a subprocess) and over streamable HTTP on loopback, against a real nats-server, orchestrator and
workers (tests.gateway.apps, plus the typed agents below)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import mcp.types as mt
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from plexus.core import BaseBlock, DataBlock, ImageBlock, TextBlock
from plexus.gateway import GatewayConfig, hash_token
from plexus.gateway._access import TokenRegistry
from plexus.gateway._mcp_serve import McpHttp
from plexus.gateway._mcp_tools import INPUT_SCHEMA_KEY, AgentTools, mcp_server
from plexus.runtime import Agent, App, Context, NatsServer, Runtime, Worker, WorkerConfig
from plexus.runtime.orchestration import RunStatus
from tests.imports import modules_after

from .test_cli import plexus

typed = App()

_SUM_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
#: The 1x1 PNG the painter answers with.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@typed.agent("adder", description="adds a and b", metadata={INPUT_SCHEMA_KEY: json.dumps(_SUM_SCHEMA)})
class Adder(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        data = blocks[0].data if isinstance(blocks[0], DataBlock) else {}
        return [TextBlock(text="the sum"), DataBlock(data={"sum": int(str(data["a"])) + int(str(data["b"]))})]


@typed.agent("painter", description="answers with an image")
class Painter(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return [ImageBlock(data=PNG, mime_type="image/png")]


EXPOSED = "echo,leaf,adder,painter,not-registered"


@pytest.fixture
async def typed_worker(cluster: Runtime, nats_server: NatsServer) -> AsyncIterator[Runtime]:
    """A second worker serving the typed agents; yields the cluster's (client) Runtime."""
    rt = await Runtime.connect(nats_server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
    worker = Worker(typed, rt, WorkerConfig(lease_ttl_s=3.0, heartbeat_s=0.5, ack_wait_s=5.0))
    await worker.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            await worker.stop(drain_timeout=2)
        await rt.close()


def _texts(result: mt.CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, mt.TextContent)]


@contextlib.asynccontextmanager
async def stdio_client(nats_url: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "plexus.runtime.cli", "mcp", "serve", "--stdio", "--types", EXPOSED, "--nats", nats_url],
    )
    async with Client(params, read_timeout_seconds=60) as client:
        yield client


class Progress:
    """Records the progress notifications of one call (its ``progress_callback``)."""

    def __init__(self) -> None:
        self.updates: list[tuple[float, str | None]] = []
        self.changed = asyncio.Event()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.updates.append((progress, message))
        self.changed.set()

    async def at_least(self, n: int) -> None:
        while len(self.updates) < n:
            self.changed.clear()
            await self.changed.wait()

    async def run_id(self) -> str:
        """The run id the first notification names (``run <id> started``)."""
        await self.at_least(1)
        message = self.updates[0][1] or ""
        assert message.startswith("run ")
        assert message.endswith(" started")
        return message.split()[1]

    @property
    def messages(self) -> list[str | None]:
        return [m for _, m in self.updates]


async def test_stdio_tools_replies_progress_and_keys(typed_worker: Runtime, nats_server: NatsServer) -> None:
    rt = typed_worker
    async with stdio_client(nats_server.url) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        # Exposed and registered only: fanout is registered but not exposed, not-registered is not a type.
        assert sorted(listed) == ["adder", "echo", "leaf", "painter"]
        assert listed["echo"].description == "replies with its input"
        assert listed["echo"].input_schema["required"] == ["text"]
        assert set(listed["adder"].input_schema["properties"]) == {"a", "b", "key"}

        # One agent per MCP session: the session's calls continue one conversation; `key` picks another.
        first = await client.call_tool("echo", {"text": "hi"})
        second = await client.call_tool("echo", {"text": "again"})
        other = await client.call_tool("echo", {"text": "hi", "key": "mine"})
        assert not first.is_error
        assert _texts(first) == ["echo #1: hi"]
        assert _texts(second) == ["echo #2: again"]
        assert _texts(other) == ["echo #1: hi"]

        # Progress: the run tree's progress events as MCP progress notifications.
        on_progress = Progress()
        done = await client.call_tool(
            "leaf", {"text": json.dumps({"steps": 3}), "key": "p1"}, progress_callback=on_progress
        )
        assert _texts(done) == ["p1 did 3"]
        run_id = await on_progress.run_id()
        assert (await rt.get_run(run_id)).status == RunStatus.COMPLETED  # an orchestrated run
        steps = on_progress.messages[1:]
        for n in (1, 2, 3):
            assert f"leaf/p1 thinking: step {n}" in steps
        progress = [p for p, _ in on_progress.updates]
        assert progress == sorted(progress)  # progress only grows

        # A declared input schema: the arguments are the agent's DataBlock; a data reply is structured.
        summed = await client.call_tool("adder", {"a": 2, "b": 3})
        assert not summed.is_error
        assert summed.structured_content == {"sum": 5}
        assert _texts(summed) == ["the sum", json.dumps({"sum": 5})]

        # An image reply is ImageContent.
        painted = await client.call_tool("painter", {"text": "draw"})
        (image,) = painted.content
        assert isinstance(image, mt.ImageContent)
        assert image.mime_type == "image/png"
        assert base64.b64decode(image.data) == PNG


async def test_stdio_bad_input_is_an_error_never_a_crash(
    typed_worker: Runtime, nats_server: NatsServer
) -> None:
    async with stdio_client(nats_server.url) as client:
        # Arguments that fail the schema: a tool error result the model can read and correct.
        cases: list[tuple[str, dict[str, Any]]] = [
            ("echo", {}),
            ("echo", {"text": 5}),
            ("echo", {"text": "x", "extra": 1}),
            ("echo", {"text": "x", "key": ""}),
            ("echo", {"text": "x", "key": 7}),
            ("adder", {"a": "two", "b": 3}),
            ("adder", {"a": 1}),
        ]
        for name, arguments in cases:
            result = await client.call_tool(name, arguments)
            assert result.is_error, (name, arguments)
            assert _texts(result)[0].startswith("invalid arguments: "), _texts(result)
        # An unknown tool and a registered type that is not exposed: JSON-RPC invalid params, alike.
        for name in ("nope", "fanout", "not-registered"):
            with pytest.raises(MCPError) as caught:
                await client.call_tool(name, {"text": "x"})
            assert caught.value.code == mt.INVALID_PARAMS
            assert f"Unknown tool: {name}" in caught.value.error.message
        # A run that fails: a tool error with the run's typed error.
        # (tests.gateway.apps' `failing` is not exposed: the leaf fails on a bad command instead.)
        failed = await client.call_tool("leaf", {"text": json.dumps({"steps": "many"})})
        assert failed.is_error
        assert "ValueError" in _texts(failed)[0]
        # The server still serves.
        assert _texts(await client.call_tool("echo", {"text": "still here"})) == ["echo #1: still here"]


async def test_stdio_cancel_cancels_the_run(typed_worker: Runtime, nats_server: NatsServer) -> None:
    rt = typed_worker
    async with stdio_client(nats_server.url) as client:
        on_progress = Progress()
        slow = json.dumps({"steps": 600, "sleep": 0.1})
        call = asyncio.ensure_future(
            client.call_tool("leaf", {"text": slow, "key": "c1"}, progress_callback=on_progress)
        )
        run_id = await asyncio.wait_for(on_progress.run_id(), 30)
        await asyncio.wait_for(on_progress.at_least(2), 30)  # the agent is at work
        call.cancel()  # the SDK sends notifications/cancelled
        with pytest.raises(asyncio.CancelledError):
            await call
        record = await rt.wait_run(run_id, timeout=30)
        assert record.status == RunStatus.CANCELLED
        # Nothing stuck: the same agent answers the next call.
        again = await client.call_tool("leaf", {"text": json.dumps({"steps": 1}), "key": "c1"})
        assert _texts(again) == ["c1 did 1"]


async def test_cli_refuses_without_types_or_open_http_off_loopback() -> None:
    code, _, err = await plexus("mcp", "serve", "--stdio")
    assert code == 2
    assert "--types" in err
    code, _, err = await plexus(
        "mcp", "serve", "--types", "echo", "--http", "0", "--dev", "--host", "0.0.0.0"
    )
    assert code == 2
    assert "loopback" in err


TOKEN = "mcp-token-0123456789"


@pytest.fixture
async def http_server(typed_worker: Runtime) -> AsyncIterator[McpHttp]:
    tools = AgentTools(typed_worker, EXPOSED.split(","))
    server = McpHttp(
        typed_worker,
        mcp_server(tools),
        GatewayConfig(token_hashes=frozenset({hash_token(TOKEN)})),
        host="127.0.0.1",
        port=0,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        await tools.aclose()


@contextlib.asynccontextmanager
async def http_client(url: str, token: str, mode: Any = "auto") -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, read_timeout_seconds=60, mode=mode) as client:
            yield client


async def test_http_tools_progress_sessions_and_tokens(http_server: McpHttp, typed_worker: Runtime) -> None:
    # No token, a wrong token: refused before the MCP server sees the request.
    async with httpx.AsyncClient(timeout=30) as raw:
        init: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        assert (await raw.post(http_server.url, json=init)).status_code == 401
        wrong = {"Authorization": "Bearer not-the-token"}
        assert (await raw.post(http_server.url, json=init, headers=wrong)).status_code == 401

    async with http_client(http_server.url, TOKEN) as client:
        assert sorted(t.name for t in (await client.list_tools()).tools) == [
            "adder",
            "echo",
            "leaf",
            "painter",
        ]
        on_progress = Progress()
        done = await client.call_tool(
            "leaf", {"text": json.dumps({"steps": 2}), "key": "h1"}, progress_callback=on_progress
        )
        assert _texts(done) == ["h1 did 2"]
        assert "leaf/h1 thinking: step 2" in on_progress.messages
        assert (await typed_worker.get_run(await on_progress.run_id())).status == RunStatus.COMPLETED
        bad = await client.call_tool("adder", {"a": 1, "b": "x"})
        assert bad.is_error
        with pytest.raises(MCPError) as caught:
            await client.call_tool("fanout", {"text": "x"})
        assert caught.value.code == mt.INVALID_PARAMS
        # The 2026-07-28 protocol has no session: without `key` every call gets a fresh agent.
        assert _texts(await client.call_tool("echo", {"text": "a"})) == ["echo #1: a"]
        assert _texts(await client.call_tool("echo", {"text": "b"})) == ["echo #1: b"]
    # A handshake-era session (Mcp-Session-Id): one agent per session, a second session starts its own.
    async with http_client(http_server.url, TOKEN, mode="legacy") as one:
        assert _texts(await one.call_tool("echo", {"text": "a"})) == ["echo #1: a"]
        assert _texts(await one.call_tool("echo", {"text": "b"})) == ["echo #2: b"]
    async with http_client(http_server.url, TOKEN, mode="legacy") as other:
        assert _texts(await other.call_tool("echo", {"text": "c"})) == ["echo #1: c"]


async def test_http_command_with_tenant_tokens_and_a_call_that_times_out(
    typed_worker: Runtime, nats_server: NatsServer
) -> None:
    """`plexus mcp serve --http` as a process: a `plexus tokens` token is accepted; a call that outlives
    `--timeout` answers an error and its run is cancelled, not left running for nobody."""
    token = await TokenRegistry(typed_worker.js).create("assistant")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "plexus.runtime.cli", "mcp", "serve", "--http", "0", "--types", "leaf",
        "--timeout", "2", "--nats", nats_server.url,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        assert line.startswith("plexus mcp serving http://127.0.0.1:"), line
        url = line.split()[3]
        async with httpx.AsyncClient(timeout=30) as raw:
            ping: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            assert (await raw.post(url, json=ping)).status_code == 401
        async with http_client(url, token) as client:
            on_progress = Progress()
            slow = json.dumps({"steps": 600, "sleep": 0.1})
            late = await client.call_tool("leaf", {"text": slow, "key": "t1"}, progress_callback=on_progress)
            assert late.is_error
            assert _texts(late)[0].startswith("ReplyTimeoutError: ")
            record = await typed_worker.wait_run(await on_progress.run_id(), timeout=30)
            assert record.status == RunStatus.CANCELLED
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0


async def test_without_an_orchestrator_a_call_is_one_message(nats_server: NatsServer) -> None:
    """No orchestrator: the call is a plain message to the agent (no run), answered all the same."""
    worker_rt = await Runtime.connect(nats_server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
    worker = Worker(typed, worker_rt, WorkerConfig(lease_ttl_s=3.0, heartbeat_s=0.5, ack_wait_s=5.0))
    await worker.start()
    rt = await Runtime.connect(nats_server.url)
    tools = AgentTools(rt, ["adder"])
    try:
        async with Client(mcp_server(tools)) as client:  # in-process: the transport is not the point here
            summed = await client.call_tool("adder", {"a": 20, "b": 22})
            assert summed.structured_content == {"sum": 42}
    finally:
        await rt.close()
        with contextlib.suppress(Exception):
            await worker.stop(drain_timeout=2)
        await worker_rt.close()


def test_only_plexus_mcp_serve_imports_the_mcp_sdk() -> None:
    code = "import plexus.runtime.cli as cli\nassert 'mcp' in cli.build_parser().format_help()"
    assert modules_after(code, ("mcp", "uvicorn")) == {"mcp": False, "uvicorn": False}
