"""The research-team example (examples/research_team.py, offline) driven end to end by an MCP client through
`plexus mcp serve --stdio`: the planner is a tool; its run tree (researchers that use an MCP tool of their
own, the typed writer) shows as MCP progress, and the planner's answer comes back as the tool's result."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

import mcp.types as mt
import pytest
from examples import research_team
from examples.library_mcp import LIBRARY
from mcp import Client, StdioServerParameters

from plexus.llm import close_mcp_connections
from plexus.runtime import NatsServer, Runtime, Worker, WorkerConfig
from plexus.runtime.orchestration import RunStatus

from .test_mcp_serve import Progress

_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")


@pytest.fixture
async def team(
    cluster: Runtime, nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Runtime]:
    for key in _KEYS:  # offline: the scripted models, whatever the developer's environment holds
        monkeypatch.delenv(key, raising=False)
    rt = await Runtime.connect(nats_server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
    worker = Worker(research_team.app, rt, WorkerConfig(lease_ttl_s=3.0, heartbeat_s=0.5, ack_wait_s=5.0))
    await worker.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            await worker.stop(drain_timeout=2)
        await close_mcp_connections()
        await rt.close()


async def test_an_mcp_client_drives_the_research_team(team: Runtime, nats_server: NatsServer) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "plexus.runtime.cli", "mcp", "serve", "--stdio", "--types", "planner",
              "--nats", nats_server.url],
    )  # fmt: skip
    async with Client(params, read_timeout_seconds=120) as client:
        (tool,) = (await client.list_tools()).tools
        assert tool.name == "planner"
        assert tool.description == "Plans the research and merges it"
        on_progress = Progress()
        result = await client.call_tool(
            "planner", {"text": "How does Plexus keep agents durable?"}, progress_callback=on_progress
        )
    assert not result.is_error
    texts = [c.text for c in result.content if isinstance(c, mt.TextContent)]
    assert texts[-1] == "The report is ready: durable agents on NATS, journaled so no turn is paid twice."
    record = await team.get_run(await on_progress.run_id())
    assert record.status == RunStatus.COMPLETED
    messages = [m or "" for m in on_progress.messages]
    for topic in research_team.TOPICS:  # the tree's progress: the researchers' MCP lookups included
        call = f'researcher/{topic} tool_call: library_lookup {{"topic": "{topic}"}}'
        assert call in messages, messages
        assert any(
            m.startswith(f"researcher/{topic} tool_result: ") and LIBRARY[topic] in m for m in messages
        ), messages
    assert any(m.startswith("writer/main ") for m in messages), messages
