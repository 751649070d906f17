"""Tool sources live at module level (examples/research_team.py's `library`), so what they share in a process
outlives an event loop: a test's, or a script's `asyncio.run`. The next loop must be served, never handed what
belonged to a loop that ended."""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from pathlib import Path

from plexus.llm import A2AAgent, MCPServer, close_mcp_connections

SERVER_SCRIPT = str(Path(__file__).with_name("mcp_servers.py"))


def test_one_server_object_serves_concurrent_calls_on_one_event_loop_after_another(tmp_path: Path) -> None:
    server = MCPServer.stdio(
        sys.executable, [SERVER_SCRIPT, "stdio"], {"MCP_LOG": str(tmp_path / "log")}, name="loops"
    )

    async def two_at_once() -> list[int]:
        # Two activations' first calls race to start the session: the second waits on the start lock.
        listed = await asyncio.gather(server.list_tools(), server.list_tools())
        return [len(tools) for tools in listed]

    try:
        first = asyncio.run(two_at_once())
        # Used to fail here: the start lock was bound to the first loop ("bound to a different event loop").
        second = asyncio.run(two_at_once())
    finally:
        asyncio.run(close_mcp_connections())
    assert first == second
    assert first[0] > 0


def test_an_a2a_agents_remote_belongs_to_its_event_loop_and_goes_with_it() -> None:
    agent = A2AAgent("http://127.0.0.1:9/a2a")  # never contacted: a Remote connects at its first call

    async def remote() -> object:
        return agent.remote

    first = asyncio.run(remote())
    assert asyncio.run(remote()) is not first
    gone = weakref.ref(first)
    del first
    gc.collect()
    # Kept by the id of its loop, a Remote outlived it, and a new loop made at the same address was handed
    # the dead loop's Remote (its lock and HTTP pool bound to a closed loop).
    assert gone() is None
