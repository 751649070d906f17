"""Apps for `plexus worker tests.llm.apps_llm:app` subprocesses: an LLMAgent over the official openai SDK,
pointed at the fake provider whose URL the test passes in ``FAKE_OPENAI_URL``."""

from __future__ import annotations

import os

import openai

from plexus.core import AgentId
from plexus.llm import LLMAgent, OpenAIChatModel, tool
from plexus.runtime import App


@tool
def note(text: str) -> str:
    """Write a note down (and, for the crash test, log each execution to ``NOTE_LOG`` if set)."""
    log = os.environ.get("NOTE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(text + "\n")
    return f"noted: {text}"


def _researcher(_id: AgentId) -> LLMAgent:
    client = openai.AsyncOpenAI(base_url=os.environ["FAKE_OPENAI_URL"], api_key="test-key", max_retries=0)
    return LLMAgent(OpenAIChatModel(client, "fake-model"), system="Research.", tools=[note], max_turns=8)


app = App()
app.register("researcher", _researcher)
