"""The tool-call accumulator: by index, continuation chunks kept, zero-arg tools, malformed JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexus.core import (
    BaseBlock,
    FinishReason,
    FinishReasonKind,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    UnknownBlock,
    Usage,
)
from plexus.llm import (
    INVALID_ARGUMENTS_KEY,
    BlockEvent,
    FinishEvent,
    ModelEvent,
    ModelRequest,
    ReasoningDeltaEvent,
    ScriptedModel,
    TextDeltaEvent,
    ToolCallDeltaEvent,
    TurnAccumulator,
    UsageEvent,
    complete,
)


def _fold(events: Sequence[ModelEvent]) -> list[BaseBlock]:
    acc = TurnAccumulator()
    for e in events:
        acc.add(e)
    return list(acc.finish().item.blocks)


def test_continuation_chunks_without_name_are_kept_and_first_index_may_exceed_zero() -> None:
    blocks = _fold(
        [
            ToolCallDeltaEvent(index=2, call_id="c1", name="search", arguments='{"q": '),
            ToolCallDeltaEvent(index=2, arguments='"pl'),
            ToolCallDeltaEvent(index=2, call_id="c1", name="search", arguments='exus"}'),  # vLLM repeats
        ]
    )
    assert blocks == [ToolUseBlock(call_id="c1", tool_name="search", arguments={"q": "plexus"})]


def test_zero_argument_tool_gets_an_empty_object() -> None:
    blocks = _fold([ToolCallDeltaEvent(index=0, call_id="c", name="now")])
    assert blocks == [ToolUseBlock(call_id="c", tool_name="now", arguments={})]


def test_malformed_arguments_are_kept_raw_in_metadata() -> None:
    (block,) = _fold([ToolCallDeltaEvent(index=0, call_id="c", name="f", arguments='{"a": 1')])
    assert isinstance(block, ToolUseBlock)
    assert block.arguments == {}
    problem = block.metadata[INVALID_ARGUMENTS_KEY]
    assert isinstance(problem, dict)
    assert problem["raw"] == '{"a": 1'
    (block,) = _fold([ToolCallDeltaEvent(index=0, call_id="c", name="f", arguments="[1]")])
    assert isinstance(block, ToolUseBlock)
    assert INVALID_ARGUMENTS_KEY in block.metadata


def test_blocks_in_first_seen_order_with_thinking_signature() -> None:
    acc = TurnAccumulator()
    events: list[ModelEvent] = [
        ReasoningDeltaEvent(text="let me ", index=0),
        ReasoningDeltaEvent(text="think", index=0),
        ReasoningDeltaEvent(signature="sig-1", index=0),
        ReasoningDeltaEvent(signature="only-sig", index=1),
        TextDeltaEvent("Hi", index=2),
        ToolCallDeltaEvent(index=3, call_id="a", name="x", arguments="{}"),
        ToolCallDeltaEvent(index=4, call_id="b", name="y", arguments='{"n": 2}'),
        UsageEvent(Usage(input_tokens=3, output_tokens=2)),
        FinishEvent(FinishReason.tool_call("tool_use")),
    ]
    for e in events:
        acc.add(e)
    turn = acc.finish()
    assert turn.item.blocks == [
        ThinkingBlock(content="let me think", signature="sig-1"),
        ThinkingBlock(content="", signature="only-sig"),
        TextBlock(text="Hi"),
        ToolUseBlock(call_id="a", tool_name="x", arguments={}),
        ToolUseBlock(call_id="b", tool_name="y", arguments={"n": 2}),
    ]
    assert turn.usage.total_tokens == 5
    assert turn.finish_reason.kind is FinishReasonKind.TOOL_CALL
    assert [c.call_id for c in turn.tool_calls] == ["a", "b"]


def test_a_whole_block_is_kept_in_stream_order() -> None:
    unknown = UnknownBlock.from_dict(
        {"type": "vendor_item", "item": {"type": "web_search_call", "id": "ws_1"}}
    )
    blocks = _fold(
        [
            TextDeltaEvent("a", index=0),
            BlockEvent(unknown, index=1),
            ToolCallDeltaEvent(index=2, call_id="c", name="x", arguments="{}"),
        ]
    )
    assert blocks == [TextBlock(text="a"), unknown, ToolUseBlock(call_id="c", tool_name="x", arguments={})]


def test_missing_finish_is_inferred() -> None:
    acc = TurnAccumulator()
    acc.add(TextDeltaEvent("x"))
    assert acc.finish().finish_reason.kind is FinishReasonKind.COMPLETED
    acc.add(ToolCallDeltaEvent(index=0, name="t"))
    turn = acc.finish()
    assert turn.finish_reason.kind is FinishReasonKind.TOOL_CALL
    assert turn.tool_calls[0].call_id  # an id is made up so the result can be paired


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@given(
    calls=st.lists(st.dictionaries(st.text(max_size=4), _json_values, max_size=3), min_size=1, max_size=4),
    offset=st.integers(min_value=0, max_value=5),
    data=st.data(),
)
def test_any_chunking_of_any_arguments_folds_back(
    calls: list[dict[str, object]], offset: int, data: st.DataObject
) -> None:
    """Property: split each call's JSON at arbitrary points and interleave the calls; the fold restores
    every call exactly, whatever index the first one has."""
    streams: list[list[ToolCallDeltaEvent]] = []
    for i, args in enumerate(calls):
        text = json.dumps(args)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=4)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        first = ToolCallDeltaEvent(index=offset + i, call_id=f"c{i}", name=f"t{i}", arguments=pieces[0])
        streams.append([first, *(ToolCallDeltaEvent(index=offset + i, arguments=p) for p in pieces[1:])])
    merged: list[ToolCallDeltaEvent] = []
    while any(streams):
        pick = data.draw(st.sampled_from([s for s in streams if s]))
        merged.append(pick.pop(0))
    blocks = _fold(list(merged))
    expected = [ToolUseBlock(call_id=f"c{i}", tool_name=f"t{i}", arguments=a) for i, a in enumerate(calls)]
    assert sorted(blocks, key=lambda b: b.call_id) == expected  # type: ignore[attr-defined]


async def test_complete_is_the_fold_of_the_stream() -> None:
    from plexus.llm import ScriptedTurn

    model = ScriptedModel([ScriptedTurn(text="hello there world", tool_calls=[("c", "f", {"a": 1})])])
    turn = await complete(model, ModelRequest(items=[]))
    assert turn.item.blocks == [
        TextBlock(text="hello there world"),
        ToolUseBlock(call_id="c", tool_name="f", arguments={"a": 1}),
    ]
    assert turn.item.metadata == {"plexus.llm.model": "scripted"}
    assert len(model.requests) == 1


def test_made_up_ids_are_unique_across_turns() -> None:
    # Two turns whose calls carry no id: the transcript's ids must not repeat (the conversion refuses that).
    ids = []
    for _ in range(2):
        acc = TurnAccumulator()
        acc.add(ToolCallDeltaEvent(index=0, name="t", arguments="{}"))
        acc.add(ToolCallDeltaEvent(index=1, name="t", arguments="{}"))
        ids += [c.call_id for c in acc.finish().tool_calls]
    assert len(set(ids)) == 4


@pytest.mark.parametrize("raw", ['{"a": 1e999}', '{"a": NaN}', '{"a": -Infinity}', '{"a": [1, Infinity]}'])
def test_non_finite_numbers_are_invalid_arguments_not_a_crash(raw: str) -> None:
    (block,) = _fold([ToolCallDeltaEvent(index=0, call_id="c", name="f", arguments=raw)])
    assert isinstance(block, ToolUseBlock)
    assert block.arguments == {}
    problem = block.metadata[INVALID_ARGUMENTS_KEY]
    assert isinstance(problem, dict)
    assert problem["raw"] == raw
    assert "not valid JSON" in str(problem["problem"])
