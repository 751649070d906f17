"""Apps for `plexus worker tests.llm.apps_llm:app` subprocesses: an LLMAgent over the official openai SDK,
pointed at the fake provider whose URL the test passes in ``FAKE_OPENAI_URL`` (Chat Completions, or the
Responses API when ``FAKE_OPENAI_API=responses``).

For the crash tests, two environment variables park a worker where the test then kills it:
``NOTE_HOLD`` (a path): the ``note`` tool, once it has logged its execution, touches that path and blocks;
``HOLD_AFTER_TURN`` (``<n>:<path>``): after the loop's iteration ``n`` (0-based) the worker touches the path
and waits.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import openai

from plexus.core import AgentId
from plexus.llm import LLMAgent, Middleware, OpenAIChatModel, OpenAIResponsesModel, Turn, tool
from plexus.runtime import App


@tool
def note(text: str) -> str:
    """Write a note down (and, for the crash test, log each execution to ``NOTE_LOG`` if set)."""
    log = os.environ.get("NOTE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(text + "\n")
    hold = os.environ.get("NOTE_HOLD")
    if hold:
        Path(hold).touch()
        time.sleep(3600)  # killed here by the test
    return f"noted: {text}"


class _HoldAfterTurn(Middleware):
    """Park the worker after one iteration of the loop (see the module's docstring)."""

    async def process_turn(self, context: Turn, call_next: Callable[[Turn], Awaitable[None]]) -> None:
        await call_next(context)
        number, _, marker = os.environ.get("HOLD_AFTER_TURN", "").partition(":")
        if marker and context.number == int(number):
            await asyncio.to_thread(Path(marker).touch)
            await asyncio.sleep(3600)  # killed here by the test


def _researcher(_id: AgentId) -> LLMAgent:
    client = openai.AsyncOpenAI(base_url=os.environ["FAKE_OPENAI_URL"], api_key="test-key", max_retries=0)
    responses = os.environ.get("FAKE_OPENAI_API") == "responses"
    return LLMAgent(
        OpenAIResponsesModel(client, "fake-model") if responses else OpenAIChatModel(client, "fake-model"),
        system="Research.",
        tools=[note],
        max_turns=8,
        middleware=[_HoldAfterTurn()],
    )


app = App()
app.register("researcher", _researcher)
