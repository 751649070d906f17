"""More failure paths: tool timeouts and exceptions, provider retries running out, context too long, the
remaining FinishReason rows."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from plexus.core import AgentId, ErrorBlock, FinishReason, TextBlock, ToolResultBlock
from plexus.llm import (
    FINISH_KEY,
    ContextTooLongError,
    LLMAgent,
    ModelRequest,
    OpenAIChatModel,
    ProviderRetry,
    ProviderUnavailableError,
    RateLimit,
    ScriptedModel,
    ScriptedTurn,
    complete,
    tool,
)
from plexus.runtime import App, PayloadTooLargeError, Runtime

from .fake_providers import FakeProvider, Sse, Status, openai_frames


@tool(timeout_s=0.05)
async def slow() -> str:
    """Never finishes in time."""
    await asyncio.sleep(30)
    return "late"


@tool
def boom(n: int) -> str:
    """Always fails."""
    raise ValueError(f"cannot handle {n}")


async def test_tool_timeout_and_exception_are_errors_the_model_sees(
    runtime: Runtime, start_worker: Any
) -> None:
    model = ScriptedModel(
        [ScriptedTurn(tool_calls=[("a", "slow", {}), ("b", "boom", {"n": 3})]), ScriptedTurn(text="sorry")]
    )
    app = App()
    app.register("t", lambda _id: LLMAgent(model, tools=[slow, boom]))
    await start_worker(app)
    await runtime.send_message([TextBlock(text="go")], AgentId("t", "1"), timeout=20)
    results = {
        b.call_id: b for i in model.requests[1].items for b in i.blocks if isinstance(b, ToolResultBlock)
    }
    kinds = {k: r.content[0].error_type for k, r in results.items() if isinstance(r.content[0], ErrorBlock)}
    assert kinds == {"a": "ToolTimeout", "b": "ValueError"}
    assert all(r.is_error for r in results.values())


async def test_retries_run_out_and_the_error_reaches_the_caller(runtime: Runtime, start_worker: Any) -> None:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async with FakeProvider(lambda _: Status(500, {"error": {"message": "down"}})) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        middleware = [RateLimit(per_second=1000), ProviderRetry(attempts=2, base_s=0.1, sleep=record)]
        app = App()
        app.register("r", lambda _id: LLMAgent(OpenAIChatModel(client, "m"), middleware=middleware))
        await start_worker(app)
        with pytest.raises(ProviderUnavailableError):
            await runtime.send_message([TextBlock(text="hi")], AgentId("r", "1"), timeout=20)
    assert fake.count == 2
    assert waits == [0.1]


async def test_context_too_long_is_typed() -> None:
    body = {"error": {"message": "maximum context length exceeded", "code": "context_length_exceeded"}}
    async with FakeProvider(lambda _: Status(400, body)) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        with pytest.raises(ContextTooLongError):
            await complete(OpenAIChatModel(client, "m"), ModelRequest(items=[]))
    async with FakeProvider(lambda _: Sse(openai_frames("fine"))) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        assert (await complete(OpenAIChatModel(client, "m"), ModelRequest(items=[]))).item.text == "fine"


async def test_blocked_and_cancelled_finish_reasons_return_marked(
    runtime: Runtime, start_worker: Any
) -> None:
    model = ScriptedModel(
        [
            ScriptedTurn(text="no", finish=FinishReason.blocked("content_filter")),
            ScriptedTurn(text="stopped", finish=FinishReason.cancelled("user")),
        ]
    )
    app = App()
    app.register("f", lambda _id: LLMAgent(model))
    await start_worker(app)
    first = await runtime.send_message([TextBlock(text="a")], AgentId("f", "1"), timeout=20)
    second = await runtime.send_message([TextBlock(text="b")], AgentId("f", "1"), timeout=20)
    assert first[0].metadata[FINISH_KEY] == "blocked"
    assert second[0].metadata[FINISH_KEY] == "cancelled"


async def test_a_tool_runs_only_after_its_turn_is_stored(runtime: Runtime, start_worker: Any) -> None:
    """The journal's appends are stored in the background, but the loop waits for the turn's before any
    of its tools runs: here the turn cannot be stored (its item is over max_payload), and the tool that it
    asks for must never run (without that wait it would, on a turn a retry asks the model for again)."""
    ran: list[str] = []

    @tool
    def mark() -> str:
        """Records that it ran."""
        ran.append("mark")
        return "ok"

    big = " ".join("x" * 300_000 for _ in range(4))  # four deltas that fit; the turn's item does not
    model = ScriptedModel([ScriptedTurn(text=big, tool_calls=[("a", "mark", {})]), ScriptedTurn(text="done")])
    app = App()
    app.register("t", lambda _id: LLMAgent(model, tools=[mark]))
    await start_worker(app)
    with pytest.raises(PayloadTooLargeError):
        await runtime.send_message([TextBlock(text="go")], AgentId("t", "big"), timeout=20)
    assert ran == []
    assert len(model.requests) == 1  # and no further model call


async def test_a_turn_that_cannot_be_stored_leaves_the_transcript_as_it_was(
    runtime: Runtime, start_worker: Any
) -> None:
    """The final turn's journal append fails (its item is over max_payload): the handling fails, and the
    agent's transcript does not take that message's turns (the loop stores every step before the state
    takes the transcript). The next message sees the conversation as it was before."""
    big = " ".join("z" * 300_000 for _ in range(4))
    model = ScriptedModel([ScriptedTurn(text=big), ScriptedTurn(text="fine")])
    app = App()
    app.register("t", lambda _id: LLMAgent(model))
    await start_worker(app)
    agent = AgentId("t", "kept")
    with pytest.raises(PayloadTooLargeError):
        await runtime.send_message([TextBlock(text="first")], agent, timeout=20)
    reply = await runtime.send_message([TextBlock(text="second")], agent, timeout=20)
    assert [getattr(b, "text", None) for b in reply] == ["fine"]
    seen = [getattr(b, "text", None) for item in model.requests[1].items for b in item.blocks]
    assert seen == ["second"]
