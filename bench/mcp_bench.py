"""One MCP tool call inside the `LLMAgent` loop against the same call made with the bare ``mcp`` client.

``uv run --no-sync python -m bench.mcp_bench [--runs N] [--url nats://...]``: a stdio MCP server written with
the SDK (``bench/mcp_server.py``, one ``add`` tool) serves both sides, each over its own session (its own
server process): the bare side is ``ClientSession.call_tool`` on a session of its own; the Plexus side is a
run of an `LLMAgent` on an in-process worker whose scripted model (no provider) calls the server's tool once,
then answers. An outermost tool middleware (the public ``Middleware.process_tool``) times the MCP call inside
the loop: the arguments checked against the tool's JSON Schema, the call through the worker's shared session
and the result made blocks. What any tool call costs in the loop (its records, progress events, the journal)
is not part of it: ``bench.llm_bench`` measures that.

Measured in rounds (a bare call, then a run), so both sides see the same phase of the machine; each figure is
the p50 over rounds: ``mcp.bare_call.p50_ms``, ``mcp.loop_call.p50_ms`` and their difference per round,
``mcp.overhead_per_call.p50_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import emit_once, percentile

SERVER = str(Path(__file__).with_name("mcp_server.py"))


async def _measure(runs: int, nats_url: str | None) -> dict[str, float]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    from bench.llm_bench import worker_and_client
    from plexus.core import AgentId, TextBlock
    from plexus.llm import LLMAgent, MCPServer, Middleware, ScriptedModel, ScriptedTurn, close_mcp_connections
    from plexus.runtime import App

    loop_ms: list[float] = []

    class TimeCall(Middleware):
        async def process_tool(self, context: Any, call_next: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await call_next(context)
            finally:
                loop_ms.append((time.perf_counter() - t0) * 1000)

    server = MCPServer.stdio(sys.executable, [SERVER], name="b")
    turns = [ScriptedTurn(tool_calls=[("c1", "b_add", {"a": 2, "b": 3})]), ScriptedTurn(text="5")]

    def agent(_id: AgentId) -> LLMAgent:
        return LLMAgent(ScriptedModel(list(turns)), tools=[server], middleware=[TimeCall()])

    app = App()
    app.register("mcp-bench", agent)
    bare_ms: list[float] = []
    params = StdioServerParameters(command=sys.executable, args=[SERVER])
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
        worker_and_client(app, nats_url) as (rt, _url),
    ):
        await session.initialize()
        await session.list_tools()
        for i in range(-20, runs):  # 20 warm-up rounds
            t0 = time.perf_counter()
            await session.call_tool("add", {"a": 2, "b": 3})
            bare = (time.perf_counter() - t0) * 1000
            await asyncio.sleep(0.005)
            await rt.send_message([TextBlock(text="add")], AgentId("mcp-bench", f"r{i}"), timeout=30)
            await asyncio.sleep(0.005)
            if i < 0:
                loop_ms.clear()
            else:
                bare_ms.append(bare)
        await close_mcp_connections()
    overhead = [loop - bare for loop, bare in zip(loop_ms, bare_ms, strict=True)]
    return {
        "mcp.bare_call.p50_ms": percentile(bare_ms, 50),
        "mcp.loop_call.p50_ms": percentile(loop_ms, 50),
        "mcp.overhead_per_call.p50_ms": percentile(overhead, 50),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--url", help="an existing nats-server (default: start one)")
    args = parser.parse_args()
    metrics = asyncio.run(_measure(args.runs, args.url))
    for name, value in metrics.items():
        print(f"{name:<32} {value:8.3f}")
    emit_once(metrics, {"runs": args.runs})


if __name__ == "__main__":
    main()
