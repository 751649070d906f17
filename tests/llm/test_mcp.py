"""MCP servers as tool sources (issue 37 item 1): real servers written with the official SDK (stdio processes
of ``tests/llm/mcp_servers.py``, and streamable HTTP on loopback), an LLMAgent on a real worker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from plexus.core import AgentId, ErrorBlock, KernelError, TextBlock, ToolResultBlock
from plexus.llm import (
    LLMAgent,
    MCPServer,
    MCPServerError,
    Middleware,
    ModelRequest,
    ScriptedModel,
    ScriptedTurn,
    ToolCall,
    approve,
    close_mcp_connections,
    tool,
)
from plexus.runtime import App, Runtime

from .fake_providers import FakeProvider, Sse, openai_frames

SERVER_SCRIPT = str(Path(__file__).with_name("mcp_servers.py"))


@pytest.fixture(autouse=True)
async def _closed_connections() -> AsyncIterator[None]:
    """Each test's MCP sessions end with it (their processes too): a session belongs to its event loop."""
    yield
    await close_mcp_connections()


def _stdio(log: Path, **options: Any) -> MCPServer:
    options.setdefault("name", "t")
    return MCPServer.stdio(sys.executable, [SERVER_SCRIPT, "stdio"], {"MCP_LOG": str(log)}, **options)


def _calls(log: Path) -> list[str]:
    return (
        [line for line in log.read_text().splitlines() if not line.startswith("pid ")] if log.exists() else []
    )


def _pids(log: Path) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("pid ")]


def _results(request: ModelRequest) -> dict[str, ToolResultBlock]:
    return {b.call_id: b for i in request.items for b in i.blocks if isinstance(b, ToolResultBlock)}


def _app(agent: Callable[[AgentId], LLMAgent]) -> App:
    app = App()
    app.register("assistant", agent)
    return app


async def _ask(runtime: Runtime, key: str, text: str = "go") -> list[Any]:
    return await runtime.send_message([TextBlock(text=text)], AgentId("assistant", key), timeout=60)


async def test_the_servers_tools_are_offered_with_their_schemas_and_called(
    runtime: Runtime, start_worker: Any, tmp_path: Path
) -> None:
    log = tmp_path / "mcp.log"
    server = _stdio(log, tool_filter=lambda name: name != "hang")
    model = ScriptedModel(
        [ScriptedTurn(tool_calls=[("c1", "t_add", {"a": 2, "b": 3})]), ScriptedTurn(text="five")]
    )
    await start_worker(_app(lambda _id: LLMAgent(model, tools=[server])))
    reply = await _ask(runtime, "a")

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["five"]
    offered = {t.name: t for t in model.requests[0].tools}
    # Prefixed, filtered, and the tool whose schema is invalid is left out (the provider would refuse it).
    assert set(offered) == {"t_add", "t_echo", "t_fail", "t_crash", "t_gate", "t_grow"}
    assert offered["t_add"].description == "Add two integers."
    schema: Any = offered["t_add"].parameters
    assert schema["properties"]["a"]["type"] == "integer"
    assert schema["required"] == ["a", "b"]
    assert server.invalid_tools.keys() == {"bad"}
    assert _results(model.requests[1])["c1"].content == [TextBlock(text="5")]
    assert _calls(log) == ["add 2 3"]


async def test_every_mcp_failure_is_a_result_the_model_sees_and_the_worker_keeps_serving(
    runtime: Runtime, start_worker: Any, tmp_path: Path
) -> None:
    log = tmp_path / "mcp.log"
    server = _stdio(log, timeout_s=1.5)
    model = ScriptedModel(
        [
            ScriptedTurn(
                tool_calls=[
                    ("c1", "t_fail", {"reason": "no"}),  # an isError result
                    ("c2", "t_add", {"a": "x"}),  # arguments that do not fit the schema: never sent
                    ("c3", "t_hang", {}),  # past its timeout
                ]
            ),
            ScriptedTurn(tool_calls=[("c4", "t_crash", {})]),  # the server exits mid-call
            ScriptedTurn(tool_calls=[("c5", "t_add", {"a": 1, "b": 1})]),  # started again
            ScriptedTurn(text="survived"),
        ]
    )
    after = ScriptedModel(
        [ScriptedTurn(tool_calls=[("d1", "t_echo", {"text": "hi"})]), ScriptedTurn(text="ok")]
    )
    models = {"b": model, "b2": after}
    await start_worker(_app(lambda agent_id: LLMAgent(models[agent_id.key], tools=[server])))
    reply = await _ask(runtime, "b")

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["survived"]
    errors = {}
    for request in model.requests[1:3]:
        for call_id, result in _results(request).items():
            (block,) = result.content
            assert result.is_error
            assert isinstance(block, ErrorBlock)
            errors[call_id] = block
    assert errors["c1"].error_type == "MCPToolError"
    assert errors["c2"].error_type == "InvalidToolArguments"
    assert "'b' is a required property" in errors["c2"].message
    assert errors["c3"].error_type == "MCPTimeoutError"
    assert errors["c4"].error_type == "MCPServerError"
    assert "closed the connection" in errors["c4"].message
    assert _results(model.requests[3])["c5"].content == [TextBlock(text="2")]
    assert _calls(log) == ["fail no", "hang", "crash", "add 1 1"]
    assert len(_pids(log)) == 2  # restarted once, after the crash

    # The same worker serves the next message, on the same server process.
    assert [b.text for b in await _ask(runtime, "b2") if isinstance(b, TextBlock)] == ["ok"]
    assert _results(after.requests[1])["d1"].content == [TextBlock(text="echo: hi")]
    assert len(_pids(log)) == 2


async def test_a_changed_tool_list_is_offered_on_the_next_turn(
    runtime: Runtime, start_worker: Any, tmp_path: Path
) -> None:
    log = tmp_path / "mcp.log"
    model = ScriptedModel(
        [
            ScriptedTurn(tool_calls=[("c1", "t_grow", {})]),
            ScriptedTurn(tool_calls=[("c2", "t_extra", {"text": "late"})]),
            ScriptedTurn(text="done"),
        ]
    )
    await start_worker(_app(lambda _id: LLMAgent(model, tools=[_stdio(log)])))
    await _ask(runtime, "c")

    assert "t_extra" not in {t.name for t in model.requests[0].tools}
    assert "t_extra" in {t.name for t in model.requests[1].tools}
    assert _results(model.requests[2])["c2"].content == [TextBlock(text="LATE")]


async def test_one_server_process_per_worker_shared_by_its_activations(
    runtime: Runtime, start_worker: Any, tmp_path: Path
) -> None:
    log = tmp_path / "mcp.log"

    def agent(_id: AgentId) -> LLMAgent:
        # A server made per activation still shares the worker's one session (same command and env).
        model = ScriptedModel(
            [ScriptedTurn(tool_calls=[("c", "t_echo", {"text": _id.key})]), ScriptedTurn(text="ok")]
        )
        return LLMAgent(model, tools=[_stdio(log)])

    await start_worker(_app(agent))
    await asyncio.gather(*(_ask(runtime, key) for key in ("k1", "k2", "k3")))
    assert sorted(_calls(log)) == ["echo k1", "echo k2", "echo k3"]
    assert len(_pids(log)) == 1


async def test_a_server_that_is_not_installed_or_answers_garbage_is_a_typed_error(
    runtime: Runtime, start_worker: Any, tmp_path: Path
) -> None:
    missing = MCPServer.stdio("plexus-no-such-mcp-server-binary", name="missing")
    garbage = MCPServer.stdio(sys.executable, [SERVER_SCRIPT, "garbage"], name="garbage", connect_timeout_s=2)
    servers = {"missing": missing, "garbage": garbage}

    @tool
    def local() -> str:
        """A plain tool."""
        return "local"

    def agent(agent_id: AgentId) -> LLMAgent:
        script = ScriptedModel([ScriptedTurn(tool_calls=[("c", "local", {})]), ScriptedTurn(text="fine")])
        server = servers.get(agent_id.key)
        return LLMAgent(script, tools=[local] if server is None else [local, server])

    await start_worker(_app(agent))
    with pytest.raises(MCPServerError) as not_installed:
        await _ask(runtime, "missing")
    assert not_installed.value.server == "missing"
    assert "could not start" in not_installed.value.message
    with pytest.raises(MCPServerError) as answered_garbage:
        await _ask(runtime, "garbage")
    assert answered_garbage.value.server == "garbage"
    # The worker keeps serving.
    assert [b.text for b in await _ask(runtime, "plain") if isinstance(b, TextBlock)] == ["fine"]


async def test_approvals_and_tool_middleware_apply_to_mcp_tools(
    runtime: Runtime, start_worker: Any, tmp_path: Path
) -> None:
    log = tmp_path / "mcp.log"
    seen: list[str] = []

    class Audit(Middleware):
        async def process_tool(
            self, context: ToolCall, call_next: Callable[[ToolCall], Awaitable[ToolResultBlock]]
        ) -> ToolResultBlock:
            seen.append(context.call.tool_name)
            return await call_next(context)

    server = _stdio(log, needs_approval=["add"])
    model = ScriptedModel(
        [
            ScriptedTurn(tool_calls=[("c1", "t_add", {"a": 4, "b": 4}), ("c2", "t_echo", {"text": "x"})]),
            ScriptedTurn(text="done"),
        ]
    )

    def app() -> App:
        return _app(lambda _id: LLMAgent(model, tools=[server], middleware=[Audit()]))

    first = await start_worker(app())
    agent = AgentId("assistant", "d")
    with pytest.raises(KernelError) as suspended:  # ApprovalRequired: the turn waits for a decision
        await runtime.send_message([TextBlock(text="go")], agent, timeout=60)
    assert suspended.value.error_type == "ApprovalRequired"
    assert _calls(log) == []  # nothing of the turn ran before the decision

    # A new activation resumes: its tools are listed before the resumed tool step.
    await first.stop(drain_timeout=5)
    await start_worker(app())
    await approve(runtime, agent, "c1", timeout=60)
    async with asyncio.timeout(30):  # the decision resumes the loop on the worker
        while len(model.requests) < 2:  # noqa: ASYNC110 - the worker appends to it
            await asyncio.sleep(0.05)
    assert _results(model.requests[1])["c1"].content == [TextBlock(text="8")]
    assert sorted(_calls(log)) == ["add 4 4", "echo x"]
    assert sorted(seen) == ["t_add", "t_echo"]


async def test_a_streamable_http_server_on_loopback(
    runtime: Runtime, start_worker: Any, tmp_path: Path
) -> None:
    uvicorn = pytest.importorskip("uvicorn")
    from tests.llm.mcp_servers import build

    seen_headers: list[str] = []
    asgi = build().streamable_http_app()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen_headers.extend(v.decode() for k, v in scope["headers"] if k == b"x-plexus-test")
        await asgi(scope, receive, send)

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    serving = asyncio.ensure_future(http.serve())
    try:
        async with asyncio.timeout(20):
            while not http.started:  # noqa: ASYNC110 - uvicorn offers no event
                await asyncio.sleep(0.05)
        port = http.servers[0].sockets[0].getsockname()[1]
        server = MCPServer.http(f"http://127.0.0.1:{port}/mcp", {"x-plexus-test": "yes"}, name="web")
        model = ScriptedModel(
            [ScriptedTurn(tool_calls=[("c1", "web_echo", {"text": "over http"})]), ScriptedTurn(text="ok")]
        )
        await start_worker(_app(lambda _id: LLMAgent(model, tools=[server])))
        assert [b.text for b in await _ask(runtime, "h") if isinstance(b, TextBlock)] == ["ok"]
        assert _results(model.requests[1])["c1"].content == [TextBlock(text="echo: over http")]
        assert "yes" in seen_headers
        await close_mcp_connections()
    finally:
        http.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_sigkill_during_an_mcp_call_never_makes_a_stored_call_again(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    """Turn 1 calls ``add`` (its result journaled), turn 2 calls ``gate``, which blocks; the worker is killed
    during that call. The next owner replays turn 1, its tool result and turn 2 from the journal, and makes
    only the interrupted call again. The killed worker's server process ends with it."""
    log, gate = tmp_path / "mcp.log", tmp_path / "gate"
    per_turn: list[int] = []

    def respond(body: dict[str, Any]) -> Sse:
        turn = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        per_turn.append(turn)
        if turn == 1:
            return Sse(openai_frames("", [("call_1", "t_add", '{"a": 20, "b": 22}')]))
        if turn == 2:
            return Sse(openai_frames("", [("call_2", "t_gate", '{"text": "once"}')]))
        return Sse(openai_frames("all done"))

    async with FakeProvider(respond) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url, "MCP_LOG": str(log), "MCP_GATE": str(gate)}
        first = worker_process("tests.llm.apps_mcp:app", "--worker-id", "w1", env=env)
        agent = AgentId("mcp-assistant", "k")
        await runtime.get("mcp-assistant", lazy=False, timeout=60)  # the new process hosts the type
        reply_task = asyncio.ensure_future(runtime.send_message([TextBlock(text="go")], agent, timeout=120))
        async with asyncio.timeout(60):
            while not os.path.exists(str(gate) + ".entered"):  # noqa: ASYNC110, ASYNC240 - another process
                await asyncio.sleep(0.05)
        (first_pid,) = _pids(log)
        os.kill(first.pid, signal.SIGKILL)
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        async with asyncio.timeout(20):  # its stdin closed: the server exits with the worker
            while _alive(first_pid):  # noqa: ASYNC110 - another process
                await asyncio.sleep(0.05)
        gate.touch()
        second = worker_process("tests.llm.apps_mcp:app", "--worker-id", "w2", env=env)
        reply = await asyncio.wait_for(reply_task, 120)
        # A worker that stops (SIGTERM: drained, its loop ended) stops its server process too.
        second_pid = _pids(log)[-1]
        os.kill(second.pid, signal.SIGTERM)
        assert await asyncio.to_thread(second.wait, 60) == 0
        assert not _alive(second_pid)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["all done"]
    assert _calls(log) == ["add 20 22", "gate once", "gate once"]  # add never again; gate was interrupted
    assert sorted(per_turn) == [1, 2, 3]  # no paid turn requested twice
    final = fake.requests[-1]
    tool_messages = [m for m in final["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["42", "passed: once"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_1", "call_2"]
