"""Compaction strategies and the pipeline; a tool_use/tool_result pair is never split (property test)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from plexus.core import (
    ErrorBlock,
    Item,
    ItemKind,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    check_tool_pairing,
)
from plexus.llm import (
    CompactionPipeline,
    DropFailedToolResults,
    DropReasoning,
    KeepRecent,
    ScriptedModel,
    ScriptedTurn,
    SummarizeOlder,
)


def _text(kind: ItemKind, text: str) -> Item:
    return Item(kind=kind, blocks=[TextBlock(text=text)])


@st.composite
def transcripts(draw: st.DrawFn) -> list[Item]:
    """A system item, then user/assistant exchanges where assistant turns may call 1-3 tools whose results
    follow in one tool item (or, sometimes, spread over two)."""
    items = [_text(ItemKind.SYSTEM, "sys")]
    n = 0
    for _ in range(draw(st.integers(1, 8))):
        items.append(_text(ItemKind.USER, "q"))
        for _ in range(draw(st.integers(0, 3))):
            calls = [f"c{n + i}" for i in range(draw(st.integers(1, 3)))]
            n += len(calls)
            items.append(
                Item(kind=ItemKind.ASSISTANT, blocks=[ToolUseBlock(call_id=c, tool_name="t") for c in calls])
            )
            results = [
                ToolResultBlock(call_id=c, content=[TextBlock(text="r")], is_error=draw(st.booleans()))
                for c in calls
            ]
            split = draw(st.integers(1, len(results)))
            items.append(Item(kind=ItemKind.TOOL, blocks=results[:split]))
            if results[split:]:
                items.append(Item(kind=ItemKind.TOOL, blocks=results[split:]))
        items.append(_text(ItemKind.ASSISTANT, "a"))
    return items


def _pairs_whole(items: list[Item]) -> None:
    check_tool_pairing(items, strict=True)  # no result without its call, no call without its result


@given(items=transcripts(), n=st.integers(0, 30))
async def test_keep_recent_never_splits_a_pair(items: list[Item], n: int) -> None:
    out = await KeepRecent(n).apply(items)
    _pairs_whole(out)
    assert out[0].kind is ItemKind.SYSTEM
    rest = [i for i in out if i.kind is not ItemKind.SYSTEM]
    assert len(rest) >= min(n, len(items) - 1)
    assert rest == items[len(items) - len(rest) :]  # a suffix of the original


@given(items=transcripts())
async def test_drop_failed_results_drops_their_calls_too(items: list[Item]) -> None:
    items = [*items, _text(ItemKind.USER, "latest")]
    out = await DropFailedToolResults().apply(items)
    _pairs_whole(out)
    assert not any(isinstance(b, ToolResultBlock) and b.is_error for i in out for b in i.blocks)


@given(items=transcripts(), keep=st.integers(1, 10))
async def test_summarize_older_never_splits_a_pair(items: list[Item], keep: int) -> None:
    model = ScriptedModel([ScriptedTurn(text="they asked things")])
    out = await SummarizeOlder(model, keep=keep).apply(items)
    _pairs_whole(out)
    if len(model.requests) == 1:
        assert out[1].kind is ItemKind.COMPACTION_SUMMARY
        assert out[1].text == "they asked things"


async def test_drop_reasoning_keeps_the_turn_in_flight() -> None:
    old = Item(
        kind=ItemKind.ASSISTANT, blocks=[ThinkingBlock(content="x", signature="s"), TextBlock(text="a")]
    )
    only_thinking = Item(kind=ItemKind.ASSISTANT, blocks=[ThinkingBlock(content="y")])
    current = Item(
        kind=ItemKind.ASSISTANT,
        blocks=[ThinkingBlock(content="z", signature="s2"), ToolUseBlock(call_id="c", tool_name="t")],
    )
    items = [_text(ItemKind.USER, "q1"), old, only_thinking, _text(ItemKind.USER, "q2"), current]
    out = await DropReasoning().apply(items)
    assert out == [items[0], Item(kind=ItemKind.ASSISTANT, blocks=[TextBlock(text="a")]), items[3], current]


async def test_pipeline_triggers() -> None:
    items = [_text(ItemKind.SYSTEM, "s"), *[_text(ItemKind.USER, "x" * 40) for _ in range(5)]]
    by_count = CompactionPipeline([KeepRecent(2)], max_items=4)
    assert len(await by_count.run(items)) == 3
    assert await CompactionPipeline([KeepRecent(2)], max_items=10).run(items) == items
    by_tokens = CompactionPipeline([KeepRecent(1)], context_window=100, reserve_tokens=40)
    assert by_tokens.triggered(items) is False  # ~50 estimated tokens <= 60
    assert by_tokens.triggered(items, last_input_tokens=61) is True
    assert len(await by_tokens.run(items, last_input_tokens=61)) == 2
    errors = Item(kind=ItemKind.TOOL, blocks=[ErrorBlock(error_type="E", message="m")])
    assert await CompactionPipeline([DropReasoning()], max_items=0).run([errors]) == [errors]
    size = len(json.dumps([i.model_dump(mode="json") for i in items], separators=(",", ":")))
    by_bytes = CompactionPipeline([KeepRecent(2)], max_bytes=size)
    assert by_bytes.triggered(items) is False  # exactly at the limit
    assert CompactionPipeline([KeepRecent(2)], max_bytes=size - 1).triggered(items) is True
    assert len(await CompactionPipeline([KeepRecent(2)], max_bytes=size - 1).run(items)) == 3
    # Measured exactly as the transcript grows (each size goes on from the last one's) and when it does not.
    for n in [*range(len(items) + 1), 2, len(items)]:
        part = items[:n]
        size = len(json.dumps([i.model_dump(mode="json") for i in part], separators=(",", ":")))
        assert CompactionPipeline([KeepRecent(2)], max_bytes=size).triggered(part) is False
        assert CompactionPipeline([KeepRecent(2)], max_bytes=size - 1).triggered(part) is True
