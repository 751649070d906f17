"""App for `plexus worker tests.llm.apps_typed:app` subprocesses: an ``LLMAgent(output_type=City)`` over the
official openai SDK, pointed at the fake provider in ``FAKE_OPENAI_URL``; ``HOLD_AFTER_TURN`` parks it after a
loop iteration, as in `tests.llm.apps_llm`."""

from __future__ import annotations

import os

import openai
from pydantic import BaseModel

from plexus.core import AgentId
from plexus.llm import LLMAgent, OpenAIChatModel
from plexus.runtime import App
from tests.llm.apps_llm import _HoldAfterTurn


class City(BaseModel):
    """A city and its population."""

    name: str
    population: int


def _geo(_id: AgentId) -> LLMAgent:
    client = openai.AsyncOpenAI(base_url=os.environ["FAKE_OPENAI_URL"], api_key="test-key", max_retries=0)
    return LLMAgent(OpenAIChatModel(client, "fake-model"), output_type=City, middleware=[_HoldAfterTurn()])


app = App()
app.register("geo", _geo)
