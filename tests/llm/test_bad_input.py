"""Bad input and failure paths: garbage from a provider, orphan tool results, provider errors inside the
loop, cancellation racing a stream, and a sub-agent called as a tool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from plexus.core import (
    AgentId,
    CancellationError,
    Item,
    ItemKind,
    ProtocolError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.llm import (
    AnthropicModel,
    LLMAgent,
    ModelEvent,
    ModelRequest,
    OpenAIChatModel,
    ProviderProtocolError,
    RateLimitError,
    ScriptedModel,
    ScriptedTurn,
    TextDeltaEvent,
    anthropic_messages,
    complete,
    openai_messages,
    tool,
)
from plexus.runtime import App, Context, Runtime, new_root_run

from .fake_providers import FakeProvider, Sse

USER = Item(kind=ItemKind.USER, blocks=[TextBlock(text="hi")])


async def test_garbage_from_either_provider_is_a_typed_protocol_error() -> None:
    async with FakeProvider(lambda _: Sse(["data: {not json\n\n", "data: [DONE]\n\n"])) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        with pytest.raises(ProviderProtocolError):
            await complete(OpenAIChatModel(client, "m"), ModelRequest(items=[USER]))
    async with FakeProvider(lambda _: Sse(["event: message_start\ndata: {bad\n\n"]), base_path="") as fake:
        aclient = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k", max_retries=0)
        with pytest.raises(ProviderProtocolError):
            await complete(AnthropicModel(aclient, "m"), ModelRequest(items=[USER]))


def test_a_tool_result_without_its_call_is_refused() -> None:
    orphan = Item(
        kind=ItemKind.TOOL, blocks=[ToolResultBlock(call_id="ghost", content=[TextBlock(text="x")])]
    )
    with pytest.raises(ProtocolError):
        openai_messages([USER, orphan])
    with pytest.raises(ProtocolError):
        anthropic_messages([USER, orphan])


def test_empty_results_and_reasoning_only_turns_convert_to_what_providers_accept() -> None:
    call = Item(kind=ItemKind.ASSISTANT, blocks=[ToolUseBlock(call_id="c1", tool_name="noop", arguments={})])
    empty = Item(kind=ItemKind.TOOL, blocks=[ToolResultBlock(call_id="c1", content=[TextBlock(text="")])])
    # Anthropic refuses an empty text block: the tool_result goes without content.
    _, messages = anthropic_messages([USER, call, empty])
    (result,) = messages[-1]["content"]
    assert result == {"type": "tool_result", "tool_use_id": "c1"}
    # A turn cut by max_tokens while reasoning has nothing Chat Completions carries: no null assistant.
    thinking = Item(kind=ItemKind.ASSISTANT, blocks=[ThinkingBlock(content="hmm", signature="s")])
    again = Item(kind=ItemKind.USER, blocks=[TextBlock(text="go on")])
    assert [m["role"] for m in openai_messages([USER, thinking, again])] == ["user", "user"]


class FlakyModel:
    """Rate-limited on the first call, then answers."""

    model = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        if self.calls == 1:
            raise RateLimitError("slow down", "fake", 429, 2.0)
        yield TextDeltaEvent("fine")


async def test_provider_error_reaches_the_caller_typed_and_the_worker_lives_on(
    runtime: Runtime, start_worker: Any
) -> None:
    model = FlakyModel()
    app = App()
    # ProviderRetry (the default) would absorb the one 429: this is about the error when nothing retries it.
    app.register("flaky", lambda _id: LLMAgent(model, provider_retry=None), retry=None)
    await start_worker(app)
    with pytest.raises(RateLimitError) as info:
        await runtime.send_message([TextBlock(text="a")], AgentId("flaky", "1"), timeout=20)
    assert info.value.retry_after_s == 2.0
    reply = await runtime.send_message([TextBlock(text="b")], AgentId("flaky", "2"), timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["fine"]


class HangingModel:
    """Streams one delta, then waits forever; records that its stream was stopped."""

    model = "hang"

    def __init__(self) -> None:
        self.stopped = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield TextDeltaEvent("thinking...")
        try:
            await asyncio.Event().wait()
        finally:
            self.stopped.set()


async def test_cancellation_races_the_model_stream(runtime: Runtime, start_worker: Any) -> None:
    model = HangingModel()
    app = App()
    app.register("hang", lambda _id: LLMAgent(model), time_limit_s=1.0)  # its cancellation fires after 1 s
    await start_worker(app)
    with pytest.raises(CancellationError):
        await runtime.send_message([TextBlock(text="go")], AgentId("hang", "1"), timeout=20)
    await asyncio.wait_for(model.stopped.wait(), 10)  # the stream itself was stopped, not left running


@tool
async def ask_expert(question: str, ctx: Context) -> str:
    """Ask the expert sub-agent."""
    reply = await ctx.spawn(AgentId("expert", "e1"), [TextBlock(text=question)], timeout=20)
    return " ".join(b.text for b in reply if isinstance(b, TextBlock))


async def test_a_sub_agent_as_a_tool(runtime: Runtime, start_worker: Any) -> None:
    lead = ScriptedModel(
        [ScriptedTurn(tool_calls=[("c", "ask_expert", {"question": "why?"})]), ScriptedTurn(text="ok")]
    )
    expert = ScriptedModel([ScriptedTurn(text="because")])
    app = App()
    app.register("lead", lambda _id: LLMAgent(lead, tools=[ask_expert]))
    app.register("expert", lambda _id: LLMAgent(expert))
    await start_worker(app)
    await runtime.send_message([TextBlock(text="?")], AgentId("lead", "1"), timeout=30, run=new_root_run())
    assert expert.requests[0].items[-1].text == "why?"
    (result,) = [b for i in lead.requests[1].items for b in i.blocks if isinstance(b, ToolResultBlock)]
    assert result.content == [TextBlock(text="because")]
