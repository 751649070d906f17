"""LLM agents that call remote A2A agents (a second Plexus gateway, whose URL and token the test passes in
``REMOTE_A2A_URL`` / ``REMOTE_A2A_TOKEN``), over the official openai SDK pointed at ``FAKE_OPENAI_URL``:
``caller`` has the remote ``leaf`` as a tool, ``router`` hands its conversation to the remote ``echo``."""

from __future__ import annotations

import os

import openai

from plexus.core import AgentId
from plexus.llm import A2AAgent, LLMAgent, OpenAIChatModel
from plexus.runtime import App

app = App()


def _model() -> OpenAIChatModel:
    client = openai.AsyncOpenAI(base_url=os.environ["FAKE_OPENAI_URL"], api_key="test-key", max_retries=0)
    return OpenAIChatModel(client, "fake-model")


def _remote(agent_type: str, **options: float) -> A2AAgent:
    url = f"{os.environ['REMOTE_A2A_URL']}/a2a/{agent_type}"
    return A2AAgent(url, os.environ["REMOTE_A2A_TOKEN"], **options)  # type: ignore[arg-type]


def _caller(_id: AgentId) -> LLMAgent:
    return LLMAgent(_model(), system="Caller.", tools=[_remote("leaf")])


def _router(_id: AgentId) -> LLMAgent:
    return LLMAgent(_model(), system="Router.", handoffs=[_remote("echo")])


app.register("caller", _caller, description="asks the remote leaf agent")
app.register("router", _router, description="hands every conversation to the remote echo agent")
