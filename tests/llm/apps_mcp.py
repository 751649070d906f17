"""An app for `plexus worker tests.llm.apps_mcp:app` subprocesses: an LLMAgent over the official openai SDK
(the fake provider at ``FAKE_OPENAI_URL``) whose tools come from the stdio MCP server of
``tests/llm/mcp_servers.py`` (``MCP_LOG`` and ``MCP_GATE`` passed on to it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import openai

from plexus.core import AgentId
from plexus.llm import LLMAgent, MCPServer, OpenAIChatModel
from plexus.runtime import App

SERVER = MCPServer.stdio(
    sys.executable,
    [str(Path(__file__).with_name("mcp_servers.py")), "stdio"],
    {k: os.environ[k] for k in ("MCP_LOG", "MCP_GATE") if k in os.environ},
    name="t",
    timeout_s=120,
)


def _assistant(_id: AgentId) -> LLMAgent:
    client = openai.AsyncOpenAI(base_url=os.environ["FAKE_OPENAI_URL"], api_key="test-key", max_retries=0)
    return LLMAgent(OpenAIChatModel(client, "fake-model"), tools=[SERVER], max_turns=6)


app = App()
app.register("mcp-assistant", _assistant)
