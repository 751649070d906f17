"""Typed outputs: ``LLMAgent(output_type=T)`` validates the final answer into ``T`` — natively on OpenAI
(``response_format`` json_schema), by a forced ``final_result`` tool on Anthropic, from JSON text or a
scripted output-tool call on ScriptedModel; an answer that does not validate is fed back, then fails with
`OutputValidationError`; Python callers get a ``T`` from ``send_message`` / ``run_result``."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from pydantic import BaseModel

from plexus.core import AgentId, DataBlock, Item, ItemKind, TextBlock, ToolResultBlock
from plexus.llm import (
    FINISH_KEY,
    OUTPUT_TOOL,
    AnthropicModel,
    LLMAgent,
    LlmStep,
    ModelRequest,
    ModelSettings,
    OpenAIChatModel,
    OutputValidationError,
    ScriptedModel,
    ScriptedTurn,
    anthropic_request,
    openai_request,
    tool,
)
from plexus.llm._output import StructuredOutput
from plexus.runtime import App, Runtime

from .fake_providers import FakeProvider, Sse, anthropic_frames, openai_frames


class City(BaseModel):
    """A city and its population."""

    name: str
    population: int


class Draft(BaseModel):
    title: str
    tags: list[str] = []  # optional: OpenAI's strict mode would make it required


@tool
def lookup(name: str) -> str:
    """Look a city up."""
    return f"{name}: 2100000 people"


PARIS = '{"name": "Paris", "population": 2100000}'
MISSING = '{"name": "Paris"}'


def _spec(output_type: type[BaseModel]) -> Any:
    return StructuredOutput(output_type, 1, _no_tools()).spec


def _no_tools() -> Any:
    from plexus.llm import ToolRegistry

    return ToolRegistry([])


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


async def _serve(start_worker: Any, name: str, factory: Any) -> App:
    app = App()
    app.register(name, factory)
    await start_worker(app)
    return app


# -- ScriptedModel on a real worker --------------------------------------------------------------------


async def test_a_scripted_json_answer_is_the_typed_reply(runtime: Runtime, start_worker: Any) -> None:
    model = ScriptedModel([ScriptedTurn(text=PARIS), ScriptedTurn(text=f"```json\n{PARIS}\n```")])
    await _serve(start_worker, "geo", lambda _id: LLMAgent(model, output_type=City))
    city = await runtime.send_message([TextBlock(text="Paris?")], AgentId("geo", "s1"), output_type=City)
    assert city == City(name="Paris", population=2100000)
    # Untyped callers get the value as one DataBlock named after the schema (a fenced answer validates too).
    (block,) = await runtime.send_message([TextBlock(text="again")], AgentId("geo", "s1"))
    assert isinstance(block, DataBlock)
    assert (block.data, block.schema_id) == ({"name": "Paris", "population": 2100000}, "City")
    assert block.metadata[FINISH_KEY] == "completed"
    output = model.requests[0].output
    assert output is not None
    assert output.name == "City"
    assert output.schema == City.model_json_schema()


async def test_a_scripted_output_tool_call_is_the_typed_reply_and_is_answered(
    runtime: Runtime, start_worker: Any
) -> None:
    """The output tool is not run as a tool: its arguments are the answer, and its call is answered in the
    transcript (Anthropic refuses a tool_use without a result next time)."""
    model = ScriptedModel(
        [
            ScriptedTurn(tool_calls=[("c1", "lookup", {"name": "Paris"})]),
            ScriptedTurn(tool_calls=[("c2", OUTPUT_TOOL, {"name": "Paris", "population": 2100000})]),
            ScriptedTurn(text=PARIS),
        ]
    )
    await _serve(start_worker, "geo", lambda _id: LLMAgent(model, tools=[lookup], output_type=City))
    agent = AgentId("geo", "s2")
    assert await runtime.send_message([TextBlock(text="Paris?")], agent, output_type=City) == City(
        name="Paris", population=2100000
    )
    await runtime.send_message([TextBlock(text="and again?")], agent, output_type=City)
    results = [b for i in model.requests[2].items for b in i.blocks if isinstance(b, ToolResultBlock)]
    assert [(r.call_id, r.is_error) for r in results] == [("c1", False), ("c2", False)]
    assert results[1].content == [TextBlock(text="Final result accepted.")]
    # Only lookup ran as a tool: the final turn has no tool step in the journal.
    journal = await runtime.event_log(AgentId("geo.llm-journal", "s2")).read()
    steps = [(r.entry.step, r.entry.item.kind.value) for r in journal if isinstance(r.entry, LlmStep)]
    assert steps[:3] == [(0, "assistant"), (1, "tool"), (2, "assistant")]
    assert steps[3:] == [(0, "assistant")]  # the second message: one turn


async def test_an_invalid_answer_is_fed_back_and_the_retry_is_typed(
    runtime: Runtime, start_worker: Any
) -> None:
    model = ScriptedModel([ScriptedTurn(text=MISSING), ScriptedTurn(text=PARIS)])
    await _serve(start_worker, "geo", lambda _id: LLMAgent(model, output_type=City))
    city = await runtime.send_message([TextBlock(text="Paris?")], AgentId("geo", "s3"), output_type=City)
    assert city.population == 2100000
    assert len(model.requests) == 2
    feedback = model.requests[1].items[-1]
    assert feedback.kind is ItemKind.USER
    assert "not a valid City" in feedback.text
    assert "population" in feedback.text
    assert '"missing"' in feedback.text  # pydantic's error type, for the model to act on


async def test_an_answer_that_never_validates_is_a_typed_error_and_the_worker_keeps_serving(
    runtime: Runtime, start_worker: Any
) -> None:
    bad = ScriptedModel([ScriptedTurn(text=MISSING), ScriptedTurn(text="Paris has about 2 million.")])
    good = ScriptedModel([ScriptedTurn(text=PARIS)])
    app = App()
    app.register("bad", lambda _id: LLMAgent(bad, output_type=City))  # output_retries=1: two answers
    app.register("good", lambda _id: LLMAgent(good, output_type=City))
    await start_worker(app)
    with pytest.raises(OutputValidationError) as info:
        await runtime.send_message([TextBlock(text="Paris?")], AgentId("bad", "s4"), timeout=20)
    error = info.value
    assert error.output_type == "City"
    assert [e["type"] for e in error.errors] == ["json_invalid"]  # the last attempt's errors
    assert "after 2 attempt(s)" in error.message
    assert len(bad.requests) == 2
    assert await runtime.send_message(
        [TextBlock(text="Paris?")], AgentId("good", "s4"), output_type=City
    ) == City(name="Paris", population=2100000)


async def test_output_retries_zero_fails_on_the_first_invalid_tool_call(
    runtime: Runtime, start_worker: Any
) -> None:
    model = ScriptedModel([ScriptedTurn(tool_calls=[("c1", OUTPUT_TOOL, {"name": "Paris"})])])
    await _serve(start_worker, "geo", lambda _id: LLMAgent(model, output_type=City, output_retries=0))
    with pytest.raises(OutputValidationError) as info:
        await runtime.send_message([TextBlock(text="Paris?")], AgentId("geo", "s5"), timeout=20)
    assert info.value.errors == [{"type": "missing", "loc": ["population"], "msg": "Field required"}]


async def test_run_result_returns_the_typed_value(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    model = ScriptedModel([ScriptedTurn(text=PARIS)])
    await _serve(start_worker, "geo", lambda _id: LLMAgent(model, output_type=City))
    run_id = await runtime.start_run(AgentId("geo", "s6"), [TextBlock(text="Paris?")])
    assert await runtime.run_result(run_id, timeout=30, output_type=City) == City(
        name="Paris", population=2100000
    )


async def test_an_orchestrated_run_whose_answer_never_validates_fails_with_the_typed_error(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    """Recorded on the run (status failed, the error's type and fields), not retried by the run's
    RetryPolicy (it is not recoverable: the same conversation would fail the same way)."""
    model = ScriptedModel([ScriptedTurn(text=MISSING)] * 4)
    await _serve(start_worker, "geo", lambda _id: LLMAgent(model, output_type=City))
    run_id = await runtime.start_run(AgentId("geo", "s7"), [TextBlock(text="Paris?")])
    with pytest.raises(OutputValidationError) as info:
        await runtime.run_result(run_id, timeout=30, output_type=City)
    assert info.value.errors == [{"type": "missing", "loc": ["population"], "msg": "Field required"}]
    record = await runtime.get_run(run_id)
    assert record.status.value == "failed"
    assert record.error is not None
    assert record.error["error_type"] == "OutputValidationError"
    assert len(model.requests) == 2  # one answer and one retry, then no RetryPolicy attempt


def test_output_type_is_checked_when_the_agent_is_built() -> None:
    model = ScriptedModel([])
    with pytest.raises(TypeError, match="pydantic BaseModel"):
        LLMAgent(model, output_type=dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="output_retries"):
        LLMAgent(model, output_type=City, output_retries=-1)

    @tool
    def final_result(x: int) -> int:
        """Clashes with the output tool."""
        return x

    with pytest.raises(ValueError, match="final_result"):
        LLMAgent(model, tools=[final_result], output_type=City)


# -- OpenAI: native structured output -----------------------------------------------------------------

CITY_STRICT = {
    "type": "json_schema",
    "json_schema": {
        "name": "City",
        "schema": {
            "description": "A city and its population.",
            "properties": {
                "name": {"title": "Name", "type": "string"},
                "population": {"title": "Population", "type": "integer"},
            },
            "required": ["name", "population"],
            "title": "City",
            "type": "object",
            "additionalProperties": False,
        },
        "strict": True,
        "description": "A city and its population.",
    },
}


async def test_openai_asks_for_a_strict_json_schema_and_an_invalid_answer_is_retried(
    runtime: Runtime, start_worker: Any
) -> None:
    answers = iter([MISSING, PARIS])
    async with FakeProvider(lambda _: Sse(openai_frames(next(answers)))) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
        model = OpenAIChatModel(client, "m")
        await _serve(start_worker, "geo", lambda _id: LLMAgent(model, tools=[lookup], output_type=City))
        city = await runtime.send_message(
            [TextBlock(text="Paris?")], AgentId("geo", "o1"), output_type=City, timeout=20
        )
    assert city == City(name="Paris", population=2100000)
    first, second = fake.requests
    assert first["response_format"] == CITY_STRICT  # golden: every object closed, all properties required
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup"]  # no output tool: native
    assert second["messages"][-1]["role"] == "user"
    assert "population" in second["messages"][-1]["content"][0]["text"]


def test_openai_falls_back_to_a_non_strict_schema_when_strict_mode_would_change_it() -> None:
    spec = _spec(Draft)
    body = openai_request("m", ModelRequest(items=[_user("write")], output=spec))
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Draft", "schema": Draft.model_json_schema(), "strict": False},
    }


# -- Anthropic: a forced output tool -------------------------------------------------------------------

CITY_TOOL = {
    "name": OUTPUT_TOOL,
    "description": "A city and its population.",
    "input_schema": City.model_json_schema(),
}


async def test_anthropic_forces_the_output_tool_and_an_invalid_call_is_fed_back(
    runtime: Runtime, start_worker: Any
) -> None:
    answers = iter([MISSING, PARIS])

    def respond(_: dict[str, Any]) -> Sse:
        return Sse(anthropic_frames(tool_calls=[("toolu_1", OUTPUT_TOOL, next(answers))]))

    async with FakeProvider(respond, base_path="") as fake:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k")
        model = AnthropicModel(client, "claude")
        await _serve(start_worker, "geo", lambda _id: LLMAgent(model, output_type=City))
        city = await runtime.send_message(
            [TextBlock(text="Paris?")], AgentId("geo", "a1"), output_type=City, timeout=20
        )
    assert city == City(name="Paris", population=2100000)
    first, second = fake.requests
    assert first["tools"] == [CITY_TOOL]
    assert first["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}
    assert "response_format" not in first
    (result,) = second["messages"][-1]["content"]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == "toolu_1"
    assert result["is_error"]
    assert "population" in result["content"][0]["text"]


def test_anthropic_tool_choice_with_tools_user_choice_and_thinking() -> None:
    """With tools of its own the model must call a tool (``any``), so it can use them first; a tool_choice
    the user set wins; extended thinking refuses a forced choice, so the tool is only offered."""
    spec = _spec(City)
    tools = list(LLMAgent(ScriptedModel([]), tools=[lookup]).tools.specs)

    def body(settings: ModelSettings, with_tools: bool = True) -> dict[str, Any]:
        request = ModelRequest(
            items=[_user("Paris?")],
            tools=tools if with_tools else (),
            max_tokens=4096,
            output=spec,
            settings=settings,
        )
        return anthropic_request("claude", request)

    own = body(ModelSettings(parallel_tool_calls=False))
    assert [t["name"] for t in own["tools"]] == ["lookup", OUTPUT_TOOL]
    assert own["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body(ModelSettings(tool_choice="lookup"))["tool_choice"] == {"type": "tool", "name": "lookup"}
    assert body(ModelSettings(tool_choice="auto"), with_tools=False)["tool_choice"] == {"type": "auto"}
    assert body(ModelSettings(thinking_budget=2048))["tool_choice"] == {"type": "auto"}


# -- a crash after the validated turn ------------------------------------------------------------------


async def test_a_crash_after_the_validated_turn_replays_it_and_the_retry_without_asking_again(
    runtime: Runtime, worker_process: Any, tmp_path: Path
) -> None:
    """Turn 1 does not validate (fed back), turn 2 does; the worker is SIGKILLed after turn 2 is journaled,
    before the commit. The next worker replays both turns, judges them again (the feedback is a function of
    turn 1, not journaled) and replies with the value: the provider was asked twice in all."""
    from .apps_typed import City as WorkerCity  # the class the worker validates into

    answers = iter([MISSING, PARIS, PARIS])
    marker = tmp_path / "after-turn-2"
    agent = AgentId("geo", "c1")
    async with FakeProvider(lambda _: Sse(openai_frames(next(answers)))) as fake:
        env = {"FAKE_OPENAI_URL": fake.base_url}
        first = worker_process(
            "tests.llm.apps_typed:app", "--worker-id", "w1", env={**env, "HOLD_AFTER_TURN": f"1:{marker}"}
        )
        await runtime.get("geo", lazy=False, timeout=60)  # hosted: an unknown type is refused at once
        reply = asyncio.ensure_future(
            runtime.send_message([TextBlock(text="Paris?")], agent, output_type=WorkerCity, timeout=90)
        )
        journal = runtime.event_log(AgentId("geo.llm-journal", "c1"))
        for _ in range(600):
            steps = [r.entry.step for r in await journal.read() if isinstance(r.entry, LlmStep)]
            if marker.exists() and steps == [0, 1]:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the worker never stored turn 2: {_logs(tmp_path)}")
        os.kill(first.pid, signal.SIGKILL)
        assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
        worker_process("tests.llm.apps_typed:app", "--worker-id", "w2", env=env)
        assert await asyncio.wait_for(reply, 90) == WorkerCity(name="Paris", population=2100000)
        assert fake.count == 2, _logs(tmp_path)
        # The committed conversation holds the replayed feedback: the next message's request carries it.
        await runtime.send_message([TextBlock(text="again?")], agent, output_type=WorkerCity, timeout=30)
    roles = [(m["role"], str(m.get("content"))) for m in fake.requests[2]["messages"]]
    assert [r for r, _ in roles] == ["user", "assistant", "user", "assistant", "user"]
    assert "not a valid City" in roles[2][1]
    assert "population" in roles[2][1]


def _logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(tmp_path.glob("worker*.log")))
