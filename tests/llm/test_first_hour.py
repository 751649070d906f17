"""The mistakes of a first hour with LLM agents fail where they are made, with a message that says what to
do: an unannotated tool parameter, ``*args``, a plain function in ``tools=``, a script that runs out; and
the helpers a script reads a request with."""

from __future__ import annotations

from typing import Any

import pytest

from plexus.core import AgentId, DataBlock, Item, ItemKind, TextBlock, ToolResultBlock, ToolUseBlock
from plexus.llm import (
    LLMAgent,
    ModelRequest,
    ScriptedModel,
    ScriptedTurn,
    ScriptExhaustedError,
    complete,
    tool,
)
from plexus.runtime import App, Runtime


def test_a_tool_parameter_without_a_type_hint_is_refused_when_decorated() -> None:
    def pay(amount, note: str) -> str:  # type: ignore[no-untyped-def]
        return "paid"

    with pytest.raises(TypeError) as info:
        tool(pay)
    assert "@tool test_a_tool_parameter_without_a_type_hint_is_refused_when_decorated.<locals>.pay" in str(
        info.value
    )
    assert "parameter 'amount' has no type hint" in str(info.value)
    assert "`amount: int`" in str(info.value)


def test_star_args_and_kwargs_are_refused_when_decorated() -> None:
    def many(*values: int) -> int:
        return sum(values)

    def loose(a: int, **rest: Any) -> int:
        return a

    with pytest.raises(TypeError, match=r"many: parameter \*values is not allowed"):
        tool(many)
    with pytest.raises(TypeError, match=r"loose: parameter \*\*rest is not allowed"):
        tool(mode="sequential")(loose)


def test_ctx_and_annotated_parameters_still_make_a_schema() -> None:
    @tool
    def add(a: int, ctx, b: int = 2) -> int:  # type: ignore[no-untyped-def]
        """Add."""
        return a + b

    assert add.context_param == "ctx"
    assert add.schema["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"default": 2, "title": "B", "type": "integer"},
    }


def test_a_plain_function_in_tools_is_refused_by_llm_agent() -> None:
    def lookup(key: str) -> str:
        return key

    with pytest.raises(TypeError) as info:
        LLMAgent(ScriptedModel([]), tools=[lookup])  # type: ignore[list-item]
    assert str(info.value) == (
        "tools must be Tool objects made by @tool, got "
        "'test_a_plain_function_in_tools_is_refused_by_llm_agent.<locals>.lookup': "
        "decorate it with @tool (from plexus.llm import tool)"
    )


USER = Item(kind=ItemKind.USER, blocks=[TextBlock(text="hi")])


async def test_a_script_that_runs_out_raises_a_typed_error_naming_it() -> None:
    def planner(request: ModelRequest) -> ScriptedTurn:
        return ScriptedTurn(text="ok")

    model = ScriptedModel([planner] * 2)
    for _ in range(2):
        await complete(model, ModelRequest(items=[USER]))
    with pytest.raises(ScriptExhaustedError) as info:
        await complete(model, ModelRequest(items=[USER]))
    assert (info.value.script, info.value.turns) == (
        "test_a_script_that_runs_out_raises_a_typed_error_naming_it.<locals>.planner",
        2,
    )
    assert "has 2 turn(s); call 3 has no answer (turns are counted per ScriptedModel instance" in str(
        info.value
    )
    named = ScriptedModel([ScriptedTurn(text="x")], name="writer")
    await complete(named, ModelRequest(items=[USER]))
    with pytest.raises(ScriptExhaustedError, match="ScriptedModel 'writer' has 1 turn"):
        await complete(named, ModelRequest(items=[USER]))


async def test_the_caller_gets_the_exhausted_script_typed(runtime: Runtime, start_worker: Any) -> None:
    model = ScriptedModel([ScriptedTurn(text="first")], name="greeter script")
    app = App()
    app.register("greeter", lambda _id: LLMAgent(model, journal=False), retry=None)
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="a")], AgentId("greeter", "k"), timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["first"]
    # The second message of the same agent: turns are counted per instance, across messages.
    with pytest.raises(ScriptExhaustedError) as info:
        await runtime.send_message([TextBlock(text="b")], AgentId("greeter", "k"), timeout=20)
    assert (info.value.script, info.value.turns) == ("greeter script", 1)


@tool
def double(n: int) -> str:
    """Double a number."""
    return str(2 * n)


@tool
async def describe(n: int) -> dict[str, int]:
    """Describe a number."""
    return {"n": n}


async def test_request_helpers_read_the_last_user_text_and_every_result_of_the_last_turn(
    runtime: Runtime, start_worker: Any
) -> None:
    seen: list[tuple[str, list[ToolResultBlock], dict[str, str]]] = []

    def answer(request: ModelRequest) -> ScriptedTurn:
        seen.append((request.last_user_text(), request.last_tool_results(), request.last_tool_texts()))
        return ScriptedTurn(text=" ".join(request.last_tool_texts().values()))

    calls = [("a", "double", {"n": 2}), ("b", "double", {"n": 5}), ("c", "describe", {"n": 1})]
    model = ScriptedModel([ScriptedTurn(tool_calls=calls), answer])
    app = App()
    app.register("calc", lambda _id: LLMAgent(model, tools=[double, describe]))
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="double 2 and 5")], AgentId("calc", "k"), timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["4 10 "]
    [(user_text, results, texts)] = seen
    assert user_text == "double 2 and 5"
    assert [(r.call_id, r.content) for r in results] == [
        ("a", [TextBlock(text="4")]),
        ("b", [TextBlock(text="10")]),
        ("c", [DataBlock(data={"n": 1})]),
    ]
    assert texts == {"a": "4", "b": "10", "c": ""}
    # One tool item holds every result of the turn, and its own text is empty.
    [tool_item] = [i for i in model.requests[1].items if i.kind is ItemKind.TOOL]
    assert len(tool_item.blocks) == 3
    assert tool_item.text == ""


def test_request_helpers_when_the_last_turn_called_no_tool() -> None:
    call = ToolUseBlock(call_id="x", tool_name="double", arguments={"n": 1})
    items = [
        USER,
        Item(kind=ItemKind.ASSISTANT, blocks=[call]),
        Item(kind=ItemKind.TOOL, blocks=[ToolResultBlock(call_id="x", content=[TextBlock(text="2")])]),
        Item(kind=ItemKind.ASSISTANT, blocks=[TextBlock(text="2")]),
        Item(kind=ItemKind.USER, blocks=[TextBlock(text="and 3?")]),
    ]
    request = ModelRequest(items=items)
    assert request.last_user_text() == "and 3?"
    assert request.last_tool_results() == []
    assert request.last_tool_texts() == {}
    assert ModelRequest(items=[]).last_user_text() == ""
