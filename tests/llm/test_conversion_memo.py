"""Each transcript item is converted once while it lives (`ItemMemo`), and the results stay what a fresh
conversion gives: in any surrounding transcript, for new objects with the same content, and whatever a caller
does to what it got back."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest

from plexus.core import (
    Item,
    ItemKind,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    custom_item,
)
from plexus.llm import ItemMemo, anthropic_messages, openai_messages

CANCELLED = "[no result: the call was cancelled before it finished]"


def _user(text: str) -> Item:
    return Item(kind=ItemKind.USER, blocks=[TextBlock(text=text)])


def _transcript() -> list[Item]:
    return [
        Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="Be brief.")]),
        custom_item("ui.note", [TextBlock(text="never sent")]),
        _user("look"),
        Item(
            kind=ItemKind.ASSISTANT,
            blocks=[
                ThinkingBlock(content="plan", signature="sig"),
                TextBlock(text="Searching.", metadata={"plexus.llm.model": "m"}),
                ToolUseBlock(call_id="c1", tool_name="search", arguments={"q": "x"}),
                ToolUseBlock(call_id="c2", tool_name="slow", arguments={}),
            ],
        ),
        Item(
            kind=ItemKind.TOOL,
            blocks=[ToolResultBlock(call_id="c1", content=[TextBlock(text="found")], terminate=True)],
        ),
        _user("and?"),
    ]


def _fresh(items: list[Item]) -> list[Item]:
    """The same content as new objects (what a new activation validates from its state)."""
    return [Item.model_validate(i.model_dump(mode="json")) for i in items]


def test_memo_converts_each_item_once_and_forgets_it_with_the_item() -> None:
    calls: list[str] = []

    def convert(item: Item) -> str:
        calls.append(item.text)
        return item.text.upper()

    memo = ItemMemo(convert)
    a, b = _user("a"), _user("b")
    assert [memo(a), memo(b), memo(a), memo(b)] == ["A", "B", "A", "B"]
    assert calls == ["a", "b"]
    assert memo(_user("a")) == "A"
    assert calls == ["a", "b", "a"]
    del a
    gc.collect()
    assert len(memo) == 1  # b's entry only: a's went with a (and the temporary's with it)
    for _ in range(50):  # ids the interpreter hands out again never find another item's result
        item = _user(f"n{_}")
        assert memo(item) == f"N{_}"
        del item


@pytest.mark.parametrize("convert", [openai_messages, anthropic_messages], ids=["openai", "anthropic"])
def test_conversion_is_a_fresh_ones_in_every_transcript_it_is_part_of(convert: Callable[..., Any]) -> None:
    items = _transcript()
    # A transcript growing by a turn at a time, as a run's does: the same objects, each prefix converted.
    for n in range(1, len(items) + 1):
        assert convert(items[:n]) == convert(_fresh(items[:n]))
    # The assistant turn converted above with both calls unanswered is, one item later, answered for c1 only.
    last = convert(items)
    text = str(last)
    assert "found" in text
    assert text.count(CANCELLED) == 1


def test_what_a_caller_changes_in_a_conversion_does_not_reach_the_next() -> None:
    items = _transcript()
    changed = openai_messages(items)
    changed[0]["content"] = "changed"
    changed[2]["tool_calls"][0]["function"]["name"] = "changed"
    changed.append({"role": "user", "content": "extra"})
    assert openai_messages(items) == openai_messages(_fresh(items))

    system, messages = anthropic_messages(items)
    system[0]["text"] = "changed"
    messages[0]["content"][0]["cache_control"] = {"type": "ephemeral"}  # what prompt caching users add
    assert anthropic_messages(items) == anthropic_messages(_fresh(items))
