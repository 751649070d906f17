"""Middleware at the turn, model-call and tool-call stages, on a real worker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from plexus.core import AgentId, HandlerError, MiddlewareTermination, TextBlock, ToolResultBlock, ToolUseBlock
from plexus.llm import (
    LLMAgent,
    Middleware,
    OpenAIChatModel,
    ProviderRetry,
    ScriptedModel,
    ScriptedTurn,
    ToolCall,
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


STEPS: list[str] = []


@tool
async def slow(tag: str) -> str:
    """Take a while, then note that it finished."""
    STEPS.append(f"start {tag}")
    await asyncio.sleep(1.0)
    STEPS.append(f"end {tag}")
    return tag


class TripOnBad(Middleware):
    async def process_tool(
        self, context: ToolCall, call_next: Callable[[ToolCall], Awaitable[ToolResultBlock]]
    ) -> ToolResultBlock:
        if context.call.arguments.get("tag") == "bad":
            await asyncio.sleep(0.1)  # the sibling call is running by now
            raise MiddlewareTermination("guardrail: bad tool call")
        return await call_next(context)


async def test_a_tool_call_that_fails_the_run_stops_its_parallel_siblings(
    runtime: Runtime, start_worker: Any
) -> None:
    STEPS.clear()
    calls = [("c1", "slow", {"tag": "good"}), ("c2", "slow", {"tag": "bad"})]
    model = ScriptedModel([ScriptedTurn(tool_calls=calls), ScriptedTurn(text="unused")])
    app = App()
    app.register("p", lambda _id: LLMAgent(model, tools=[slow], middleware=[TripOnBad()]))
    await start_worker(app)
    with pytest.raises(MiddlewareTermination):
        await runtime.send_message([TextBlock(text="go")], AgentId("p", "1"), timeout=20)
    await asyncio.sleep(1.3)  # past the moment the sibling would have finished
    assert STEPS == ["start good"]  # cancelled with the handling, never finished after the error reply


class Skip(Middleware):
    async def process_turn(self, context: Turn, call_next: Callable[[Turn], Awaitable[None]]) -> None:
        return None  # never calls call_next


class TwiceTurn(Middleware):
    async def process_turn(self, context: Turn, call_next: Callable[[Turn], Awaitable[None]]) -> None:
        await call_next(context)
        await call_next(context)  # e.g. a middleware that retries a turn: the second run is the one kept


async def test_a_turn_middleware_must_run_the_turn_and_may_run_it_again(
    runtime: Runtime, start_worker: Any
) -> None:
    app = App()
    app.register("skip", lambda _id: LLMAgent(ScriptedModel([ScriptedTurn(text="hi")]), middleware=[Skip()]))
    script = [ScriptedTurn(tool_calls=[("a", "dump", {})]), ScriptedTurn(tool_calls=[("b", "dump", {})])]
    twice = ScriptedModel([*script, ScriptedTurn(text="first"), ScriptedTurn(text="second")])
    app.register("twice", lambda _id: LLMAgent(twice, tools=[dump], middleware=[TwiceTurn()]))
    await start_worker(app)
    with pytest.raises(HandlerError) as info:
        await runtime.send_message([TextBlock(text="go")], AgentId("skip", "1"), timeout=20)
    assert "without calling call_next" in str(info.value)
    reply = await runtime.send_message([TextBlock(text="go")], AgentId("twice", "1"), timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["second"]
    last = twice.requests[-1].items  # the kept runs' turns and tool results, paired, in order
    calls = [b.call_id for i in last for b in i.blocks if isinstance(b, ToolUseBlock)]
    answered = [b.call_id for i in last for b in i.blocks if isinstance(b, ToolResultBlock)]
    assert calls == answered == ["b"]


BATCHED: list[list[int]] = []


class Num(BaseModel):
    n: int


@tool(mode="batch")
def double(calls: list[Num]) -> list[int]:
    """Double many numbers in one go."""
    BATCHED.append([c.n for c in calls])
    return [2 * c.n for c in calls]


VETO_SAW: list[str] = []


class Veto(Middleware):
    """Answers the call with n == 3 itself; the others go on to the tool."""

    async def process_tool(
        self, context: ToolCall, call_next: Callable[[ToolCall], Awaitable[ToolResultBlock]]
    ) -> ToolResultBlock:
        VETO_SAW.append(context.call.call_id)
        if context.call.arguments.get("n") == 3:
            return ToolResultBlock(call_id=context.call.call_id, content=[TextBlock(text="vetoed")])
        return await call_next(context)


async def test_batch_calls_pass_the_tool_middleware_one_by_one_and_meet_at_the_tool(
    runtime: Runtime, start_worker: Any
) -> None:
    BATCHED.clear()
    VETO_SAW.clear()
    calls = [("x", "double", {"n": 1}), ("y", "double", {"n": 3}), ("z", "double", {"n": 5})]
    model = ScriptedModel([ScriptedTurn(tool_calls=calls), ScriptedTurn(text="ok")])
    app = App()
    app.register("d", lambda _id: LLMAgent(model, tools=[double], middleware=[Veto()]))
    await start_worker(app)
    await runtime.send_message([TextBlock(text="go")], AgentId("d", "1"), timeout=20)
    assert sorted(VETO_SAW) == ["x", "y", "z"]
    assert BATCHED == [[1, 5]]  # one invocation, without the call the middleware answered
    results = {
        b.call_id: b.content
        for i in model.requests[1].items
        for b in i.blocks
        if isinstance(b, ToolResultBlock)
    }
    assert results == {
        "x": [TextBlock(text="2")],
        "y": [TextBlock(text="vetoed")],
        "z": [TextBlock(text="10")],
    }
