"""Middleware at the turn, model-call and tool-call stages, on a real worker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import openai
import pytest

from plexus.core import AgentId, MiddlewareTermination, TextBlock, ToolResultBlock
from plexus.llm import (
    LLMAgent,
    Middleware,
    OpenAIChatModel,
    ProviderRetry,
    ScriptedModel,
    ScriptedTurn,
    ToolOutputLimit,
    Turn,
    tool,
)
from plexus.runtime import App, Runtime

from .fake_providers import Answer, FakeProvider, Sse, Status, openai_frames


async def test_provider_retry_honours_retry_after_then_backs_off(runtime: Runtime, start_worker: Any) -> None:
    answers: Iterator[Answer] = iter(
        [
            Status(429, {"error": {"message": "slow down"}}, {"retry-after": "7"}),
            Status(500, {"error": {"message": "boom"}}),
            Sse(openai_frames("finally")),
        ]
    )
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async with FakeProvider(lambda _: next(answers)) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        retry = ProviderRetry(attempts=3, base_s=0.25, sleep=record)
        app = App()
        app.register("a", lambda _id: LLMAgent(OpenAIChatModel(client, "m"), middleware=[retry]))
        await start_worker(app)
        reply = await runtime.send_message([TextBlock(text="hi")], AgentId("a", "r"), timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["finally"]
    assert waits == [7.0, 0.5]  # the provider's retry-after, then base * 2**1
    assert fake.count == 3


class Guard(Middleware):
    async def process_turn(self, context: Turn, call_next: Callable[[Turn], Awaitable[None]]) -> None:
        if "forbidden" in context.items[-1].text:
            raise MiddlewareTermination("guardrail: forbidden topic")
        await call_next(context)


@tool
def dump() -> str:
    """Return a lot of text."""
    return "x" * 500


async def test_turn_guard_ends_the_run_and_tool_output_is_truncated(
    runtime: Runtime, start_worker: Any
) -> None:
    model = ScriptedModel([ScriptedTurn(tool_calls=[("c", "dump", {})]), ScriptedTurn(text="ok")])
    app = App()
    middleware = [Guard(), ToolOutputLimit(max_chars=20)]
    app.register("g", lambda _id: LLMAgent(model, tools=[dump], middleware=middleware))
    await start_worker(app)
    with pytest.raises(MiddlewareTermination) as info:
        await runtime.send_message([TextBlock(text="a forbidden thing")], AgentId("g", "1"), timeout=20)
    assert "forbidden topic" in str(info.value)
    assert model.requests == []  # stopped before any model call
    await runtime.send_message([TextBlock(text="fine")], AgentId("g", "2"), timeout=20)
    (result,) = [b for i in model.requests[1].items for b in i.blocks if isinstance(b, ToolResultBlock)]
    assert result.content == [TextBlock(text="x" * 20 + "\n[... 480 characters truncated]")]
