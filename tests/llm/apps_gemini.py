"""App for `plexus worker tests.llm.apps_gemini:app` subprocesses: the crash-test researcher of `apps_llm`
over `GeminiModel` (the official google-genai SDK), pointed at the fake Gemini server in ``FAKE_GEMINI_URL``.
``HOLD_AFTER_TURN`` and ``NOTE_LOG`` work as in `apps_llm`."""

from __future__ import annotations

import os

from google import genai
from google.genai import types

from plexus.core import AgentId
from plexus.llm import GeminiModel, LLMAgent
from plexus.runtime import App

from .apps_llm import _HoldAfterTurn, note


def _researcher(_id: AgentId) -> LLMAgent:
    options = types.HttpOptions(base_url=os.environ["FAKE_GEMINI_URL"], api_version="v1beta")
    client = genai.Client(api_key="test-key", http_options=options)
    return LLMAgent(
        GeminiModel(client, "fake-gemini"),
        system="Research.",
        tools=[note],
        max_turns=8,
        middleware=[_HoldAfterTurn()],
    )


app = App()
app.register("researcher", _researcher)
