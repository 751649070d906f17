"""LLM agents of the GenAI span test, over the official openai SDK pointed at the fake provider whose URL the
test passes in ``FAKE_OPENAI_URL``: ``triage`` hands the conversation to ``billing``, whose ``ask_clerk`` tool
spawns ``clerk`` as a child run; ``liaison`` asks ``clerk`` over A2A, through a gateway (``A2A_GATEWAY_URL``).
Each agent's system prompt tells the fake which one is asking."""

from __future__ import annotations

import os

import openai

from plexus.core import AgentId, TextBlock
from plexus.llm import A2AAgent, LLMAgent, ModelSettings, OpenAIChatModel, tool
from plexus.runtime import App, Context

app = App()


def _model() -> OpenAIChatModel:
    client = openai.AsyncOpenAI(base_url=os.environ["FAKE_OPENAI_URL"], api_key="test-key", max_retries=0)
    return OpenAIChatModel(client, "fake-model")


@tool
async def ask_clerk(question: str, ctx: Context) -> str:
    """Ask the clerk (a child run) a question about an invoice."""
    reply = await ctx.spawn(AgentId("clerk", ctx.agent_id.key), [TextBlock(text=question)], timeout=60)
    return " ".join(b.text for b in reply if isinstance(b, TextBlock))


app.register("clerk", lambda _id: LLMAgent(_model(), system="Clerk."), description="Knows the invoices.")
billing = app.register(
    "billing",
    lambda _id: LLMAgent(_model(), system="Billing.", tools=[ask_clerk]),
    description="Billing: invoices and refunds.",
)
app.register(
    "triage",
    lambda _id: LLMAgent(
        _model(),
        system="Triage.",
        handoffs=[billing],
        settings=ModelSettings(temperature=0.2, max_tokens=200),
    ),
)


def _liaison(_id: AgentId) -> LLMAgent:
    # The clerk again, but remote: served over A2A by the gateway whose URL the A2A-hop test passes in.
    clerk = A2AAgent(f"{os.environ['A2A_GATEWAY_URL']}/a2a/clerk", os.environ["A2A_GATEWAY_TOKEN"])
    return LLMAgent(_model(), system="Liaison.", tools=[clerk])


app.register("liaison", _liaison, description="asks the clerk over A2A")
