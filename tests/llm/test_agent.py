"""LLMAgent on a real worker and nats-server, driven by ScriptedModel (no HTTP)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from plexus.core import (
    AgentId,
    DataBlock,
    ErrorBlock,
    Item,
    JsonValue,
    KernelError,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.llm import (
    FINISH_KEY,
    TRANSCRIPT_KEY,
    CompactionPipeline,
    KeepRecent,
    LLMAgent,
    LlmStep,
    ModelEvent,
    ModelRequest,
    ScriptedModel,
    ScriptedTurn,
    TranscriptTooLargeError,
    tool,
)
from plexus.runtime import App, Runtime

StartWorker = Any


class Query(BaseModel):
    q: str


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(mode="sequential")
async def stop_here(reason: str) -> ToolResultBlock:
    """End the run without another model call."""
    return ToolResultBlock(call_id="x", content=[TextBlock(text=reason)], terminate=True)


def _tool_results(request: ModelRequest) -> list[ToolResultBlock]:
    return [b for i in request.items for b in i.blocks if isinstance(b, ToolResultBlock)]


async def _ask(rt: Runtime, app: App, key: str, text: str) -> list[Any]:
    return await rt.send_message([TextBlock(text=text)], AgentId("assistant", key, app.namespace), timeout=20)


def _app(model: ScriptedModel, **options: Any) -> App:
    app = App()
    app.register(
        "assistant", lambda _id: LLMAgent(model, system="Be brief.", tools=[add, stop_here], **options)
    )
    return app


async def test_tool_turn_then_answer_and_journal(runtime: Runtime, start_worker: StartWorker) -> None:
    model = ScriptedModel(
        [
            ScriptedTurn(text="Adding.", tool_calls=[("c1", "add", {"a": 2, "b": 3})]),
            ScriptedTurn(text="It is 5."),
        ]
    )
    app = _app(model)
    await start_worker(app)
    reply = await _ask(runtime, app, "k1", "2+3?")
    assert [b.text for b in reply] == ["It is 5."]
    assert reply[0].metadata[FINISH_KEY] == "completed"
    assert len(model.requests) == 2
    first = model.requests[0]
    assert first.items[0].text == "Be brief."
    assert [s.name for s in first.tools] == ["add", "stop_here"]
    assert first.tools[0].parameters["required"] == ["a", "b"]
    (result,) = _tool_results(model.requests[1])
    assert result.content == [TextBlock(text="5")]
    # Every step is journaled, in order, for this message.
    journal = runtime.event_log(AgentId("assistant.llm-journal", "k1", app.namespace))
    steps = [r.entry for r in await journal.read()]
    assert [(s.step, s.item.kind.value) for s in steps if isinstance(s, LlmStep)] == [
        (0, "assistant"),
        (1, "tool"),
        (2, "assistant"),
    ]


async def test_conversation_is_kept_across_messages(runtime: Runtime, start_worker: StartWorker) -> None:
    model = ScriptedModel([ScriptedTurn(text="Hi Ann."), ScriptedTurn(text="You are Ann.")])
    app = _app(model)
    await start_worker(app)
    await _ask(runtime, app, "k2", "I am Ann.")
    reply = await _ask(runtime, app, "k2", "Who am I?")
    assert reply[0].text == "You are Ann."
    texts = [i.text for i in model.requests[1].items]
    assert texts == ["Be brief.", "I am Ann.", "Hi Ann.", "Who am I?"]


async def test_a_transcript_changed_in_the_state_is_the_one_the_model_sees(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """The activation keeps its items between messages, but only while the state holds what it wrote: a
    transcript replaced (as a restore does), shortened or edited in place is read from the state."""

    class Editing(LLMAgent):
        async def on_message(self, blocks: list[Any], ctx: Any) -> Any:
            if blocks[0].text == "forget":
                self.state[TRANSCRIPT_KEY] = self.state[TRANSCRIPT_KEY][-1:]
            elif blocks[0].text == "trim":
                del self.state[TRANSCRIPT_KEY][:2]
            elif blocks[0].text == "redact":
                self.state[TRANSCRIPT_KEY][0]["blocks"][0]["text"] = "[redacted]"
            return await super().on_message(blocks, ctx)

    turns = ("Hi Ann.", "Forgot.", "Trimmed.", "Same.", "Redacted.", "Same again.")
    model = ScriptedModel([ScriptedTurn(text=t) for t in turns])
    app = App()
    app.register("assistant", lambda _id: Editing(model, system="Be brief."))
    await start_worker(app)
    for text in ("I am Ann.", "forget", "trim", "again", "redact", "once more"):
        await _ask(runtime, app, "k-edit", text)
    seen = [[i.text for i in r.items] for r in model.requests]
    assert seen == [
        ["Be brief.", "I am Ann."],
        ["Be brief.", "Hi Ann.", "forget"],
        ["Be brief.", "Forgot.", "trim"],
        ["Be brief.", "Forgot.", "trim", "Trimmed.", "again"],
        ["Be brief.", "[redacted]", "trim", "Trimmed.", "again", "Same.", "redact"],
        ["Be brief.", "[redacted]", "trim", "Trimmed.", "again", "Same.", "redact", "Redacted.", "once more"],
    ]


async def test_a_conversation_the_state_could_not_store_is_refused_before_a_paid_call(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Over ``max_transcript_bytes`` the loop raises `TranscriptTooLargeError` instead of calling the model
    (the commit of the state would fail after the paid call, and again for every later message), leaving the
    conversation as it was; a pipeline with ``max_bytes`` compacts it instead and the agent goes on."""
    plain = ScriptedModel([ScriptedTurn(text=f"answer {i}") for i in range(2)])
    compacted = ScriptedModel([ScriptedTurn(text=f"answer {i}") for i in range(4)])
    pipeline = CompactionPipeline([KeepRecent(2)], max_bytes=2_000)
    app = App()
    app.register("plain", lambda _id: LLMAgent(plain, max_transcript_bytes=2_000))
    app.register(
        "compacting", lambda _id: LLMAgent(compacted, max_transcript_bytes=2_000, compaction=pipeline)
    )
    await start_worker(app)
    long = "x" * 900

    async def ask(agent_type: str, text: str) -> list[Any]:
        blocks = [TextBlock(text=text)]
        return await runtime.send_message(blocks, AgentId(agent_type, "k", app.namespace), timeout=20)

    assert [b.text for b in await ask("plain", long)] == ["answer 0"]
    with pytest.raises(TranscriptTooLargeError) as refused:
        await ask("plain", long)  # 2 x 900 characters and the answer: over 2,000 bytes
    assert (refused.value.limit, refused.value.size > 2_000) == (2_000, True)
    assert len(plain.requests) == 1  # no call was made for the refused message
    assert [b.text for b in await ask("plain", "short")] == ["answer 1"]
    assert [i.text for i in plain.requests[1].items] == [long, "answer 0", "short"]  # no trace of it

    for i in range(4):
        assert [b.text for b in await ask("compacting", long)] == [f"answer {i}"]
    # Each call after the first saw the conversation compacted to what fits: the last answer and the question.
    assert [[i.text[:8] for i in r.items] for r in compacted.requests[1:]] == [
        ["answer 0", "xxxxxxxx"],
        ["answer 1", "xxxxxxxx"],
        ["answer 2", "xxxxxxxx"],
    ]


async def test_unknown_tool_bad_arguments_and_malformed_json_are_errors_the_model_sees(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    from plexus.core import FinishReason, Usage
    from plexus.llm import FinishEvent, ToolCallDeltaEvent, UsageEvent

    broken: list[ModelEvent] = [
        ToolCallDeltaEvent(index=0, call_id="c1", name="nope", arguments="{}"),
        ToolCallDeltaEvent(index=1, call_id="c2", name="add", arguments='{"a": "x", "b": 1}'),
        ToolCallDeltaEvent(index=2, call_id="c3", name="add", arguments='{"a": 1, '),
        UsageEvent(Usage(input_tokens=1, output_tokens=1)),
        FinishEvent(FinishReason.tool_call()),
    ]
    model = ScriptedModel([broken, ScriptedTurn(text="Sorry.")])
    app = _app(model)
    await start_worker(app)
    reply = await _ask(runtime, app, "k3", "go")
    assert reply[0].text == "Sorry."
    results = _tool_results(model.requests[1])
    assert [r.call_id for r in results] == ["c1", "c2", "c3"]
    assert all(r.is_error for r in results)
    kinds = [r.content[0].error_type for r in results if isinstance(r.content[0], ErrorBlock)]
    assert kinds == ["UnknownTool", "InvalidToolArguments", "InvalidToolArguments"]


async def test_terminate_skips_the_follow_up_call(runtime: Runtime, start_worker: StartWorker) -> None:
    model = ScriptedModel([ScriptedTurn(tool_calls=[("c1", "stop_here", {"reason": "done"})])])
    app = _app(model)
    await start_worker(app)
    reply = await _ask(runtime, app, "k4", "stop")
    assert len(model.requests) == 1
    assert reply[0].metadata[FINISH_KEY] == "terminated"


async def test_max_turns_and_finish_table(runtime: Runtime, start_worker: StartWorker) -> None:
    from plexus.core import FinishReason

    loop_forever = ScriptedTurn(tool_calls=[("c", "add", {"a": 1, "b": 1})])
    model = ScriptedModel(
        [
            lambda r: ScriptedTurn(tool_calls=[(f"c{len(r.items)}", "add", {"a": 1, "b": 1})]),
            lambda r: ScriptedTurn(tool_calls=[(f"c{len(r.items)}", "add", {"a": 1, "b": 1})]),
            ScriptedTurn(text="cut", finish=FinishReason.max_tokens("length")),
            ScriptedTurn(text="odd", finish=FinishReason.other("weird")),
            ScriptedTurn(text="bad", finish=FinishReason.error("error")),
        ]
    )
    assert loop_forever.tool_calls
    app = _app(model, max_turns=2)
    await start_worker(app)
    reply = await _ask(runtime, app, "k5", "loop")
    assert reply[0].metadata[FINISH_KEY] == "max_turns"
    reply = await _ask(runtime, app, "k5", "more")
    assert (reply[0].text, reply[0].metadata[FINISH_KEY]) == ("cut", "max_tokens")
    reply = await _ask(runtime, app, "k5", "more")
    assert (reply[0].text, reply[0].metadata[FINISH_KEY]) == ("odd", "other")
    with pytest.raises(KernelError) as info:
        await _ask(runtime, app, "k5", "more")
    assert "ModelFinishedWithError" in repr(info.value)


async def test_tool_returning_data_and_transcript_in_state(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    @tool
    async def lookup(key: str) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"key": key, "value": 42}

    model = ScriptedModel([ScriptedTurn(tool_calls=[("c", "lookup", {"key": "k"})]), ScriptedTurn(text="42")])
    app = App()
    agents: list[LLMAgent] = []

    def make(_id: AgentId) -> LLMAgent:
        agents.append(LLMAgent(model, tools=[lookup]))
        return agents[-1]

    app.register("assistant", make)
    await start_worker(app)
    await _ask(runtime, app, "k6", "?")
    (result,) = _tool_results(model.requests[1])
    assert result.content == [DataBlock(data={"key": "k", "value": 42})]
    stored = [Item.model_validate(d) for d in agents[0].state[TRANSCRIPT_KEY]]
    assert [i.kind.value for i in stored] == ["user", "assistant", "tool", "assistant"]
    assert isinstance(stored[1].blocks[0], ToolUseBlock)


async def test_compaction_pipeline_runs_before_each_model_call(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    from plexus.llm import CompactionPipeline, KeepRecent

    model = ScriptedModel([ScriptedTurn(text=f"a{i}") for i in range(3)])
    app = App()
    pipeline = CompactionPipeline([KeepRecent(3)], max_items=3)
    app.register("assistant", lambda _id: LLMAgent(model, system="S", compaction=pipeline))
    await start_worker(app)
    for i in range(3):
        await _ask(runtime, app, "k7", f"q{i}")
    # The system prompt is added per request; the stored transcript is cut to its last 3 items.
    assert [i.text for i in model.requests[1].items] == ["S", "q0", "a0", "q1"]
    assert [i.text for i in model.requests[2].items] == ["S", "q1", "a1", "q2"]


async def test_batch_tool_gets_all_its_calls_of_a_turn_at_once(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    invocations: list[list[str]] = []

    @tool(mode="batch")
    async def search(calls: list[Query]) -> list[str]:
        """Search many queries in one request."""
        invocations.append([c.q for c in calls])
        return [f"hits for {c.q}" for c in calls]

    calls: list[tuple[str, str, dict[str, JsonValue]]] = [
        ("a", "search", {"q": "x"}),
        ("b", "add", {"a": 1, "b": 2}),
        ("c", "search", {"q": "y"}),
    ]
    bad: tuple[str, str, dict[str, JsonValue]] = ("d", "search", {"q": 5})
    model = ScriptedModel([ScriptedTurn(tool_calls=[*calls, bad]), ScriptedTurn(text="ok")])
    app = App()
    app.register("assistant", lambda _id: LLMAgent(model, tools=[search, add]))
    await start_worker(app)
    await _ask(runtime, app, "k8", "go")
    assert invocations == [["x", "y"]]  # one invocation for both valid calls
    assert search.schema["required"] == ["q"]
    results = {r.call_id: r for r in _tool_results(model.requests[1])}
    assert list(results) == ["a", "b", "c", "d"]  # results in call order
    assert results["a"].content == [TextBlock(text="hits for x")]
    assert results["c"].content == [TextBlock(text="hits for y")]
    assert results["b"].content == [TextBlock(text="3")]
    assert results["d"].is_error
