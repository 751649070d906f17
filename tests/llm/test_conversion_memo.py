"""Each transcript item is converted once while it lives (`ItemMemo`), and the results stay what a fresh
conversion gives: in any surrounding transcript, for new objects with the same content, and whatever a caller
does to what it got back."""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plexus.core import (
    Item,
    ItemKind,
    ProtocolError,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    custom_item,
)
from plexus.llm import ItemMemo, PrefixFold, anthropic_messages, openai_messages

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


@pytest.mark.parametrize("convert", [openai_messages, anthropic_messages], ids=["openai", "anthropic"])
def test_a_transcript_that_does_not_extend_the_last_one_is_converted_as_it_is(
    convert: Callable[..., Any],
) -> None:
    items = _transcript()
    convert(items)
    # Same first item and length, one item in the middle replaced (what compaction does): not the old prefix.
    replaced = [*items[:2], _user("instead"), *items[3:]]
    assert convert(replaced) == convert(_fresh(replaced))
    assert "instead" in str(convert(replaced))
    # Shorter, then two branches from one prefix taken in turns (a turn middleware calling call_next twice).
    assert convert(items[:4]) == convert(_fresh(items[:4]))
    left, right = [*items[:4], _user("left")], [*items[:4], _user("right")]
    for _ in range(2):
        assert convert(left) == convert(_fresh(left))
        assert convert(right) == convert(_fresh(right))
    # A transcript whose pairing is broken is refused, and the one before it still converts.
    with pytest.raises(ProtocolError, match="second tool result"):
        convert([*items, items[4]])
    assert convert(items) == convert(_fresh(items))


def test_prefix_fold_adds_only_the_items_new_since_the_last_call() -> None:
    added: list[str] = []

    def add(state: list[str], item: Item) -> None:
        if item.text == "boom":
            raise ValueError("boom")
        added.append(item.text)
        state.append(item.text)

    fold: PrefixFold[list[str]] = PrefixFold(list, add)
    a, b, c = _user("a"), _user("b"), _user("c")
    assert fold([a, b]) == ["a", "b"]
    assert fold([a, b, c]) == ["a", "b", "c"]
    assert added == ["a", "b", "c"]  # the second call added c only
    assert fold([a, c]) == ["a", "c"]  # not an extension of [a, b, c]: folded from the start
    assert added == ["a", "b", "c", "a", "c"]
    other = _user("x")
    assert fold([other]) == ["x"]
    assert len(fold) == 2  # one run per conversation (per first item)
    with pytest.raises(ValueError, match="boom"):
        fold([a, c, _user("boom")])
    assert len(fold) == 1  # the failed run is dropped: its state was half-changed
    assert fold([a, c]) == ["a", "c"]
    del c
    gc.collect()
    assert len(fold) == 1  # a's run went with c; x's stays
    for n in range(50):  # ids handed out again never resume another conversation's run
        item = _user(f"n{n}")
        assert fold([a, item]) == ["a", f"n{n}"]
        del item


@st.composite
def _conversations(draw: st.DrawFn) -> list[Item]:
    """Transcripts with what makes a conversion depend on the neighbours: calls answered late, partly or
    never, results spread over items, users speaking while calls are open, system-like and session-only
    items in between, assistant turns with nothing a model is sent (thinking without a signature)."""
    items: list[Item] = []
    open_calls: list[str] = []
    n = 0
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["user", "assistant", "results", "system", "custom", "thinking"]))
        if kind == "user":
            items.append(_user(f"u{len(items)}"))
        elif kind == "assistant":
            calls = [f"c{n + i}" for i in range(draw(st.integers(0, 3)))]
            n += len(calls)
            text = [TextBlock(text="t")] if draw(st.booleans()) or not calls else []
            thinking = [ThinkingBlock(content="p", signature="s")] if draw(st.booleans()) else []
            blocks = [*thinking, *text, *(ToolUseBlock(call_id=c, tool_name="f") for c in calls)]
            items.append(Item(kind=ItemKind.ASSISTANT, blocks=blocks))
            open_calls.extend(calls)
        elif kind == "results" and open_calls:
            answered = draw(st.lists(st.sampled_from(open_calls), min_size=1, unique=True))
            results = [ToolResultBlock(call_id=c, content=[TextBlock(text=f"r{c}")]) for c in answered]
            items.append(Item(kind=ItemKind.TOOL, blocks=results))
            open_calls = [c for c in open_calls if c not in answered]
        elif kind == "system":
            items.append(Item(kind=ItemKind.DEVELOPER, blocks=[TextBlock(text="rule")]))
        elif kind == "custom":
            items.append(custom_item("ui.note", [TextBlock(text="never sent")]))
        elif kind == "thinking":
            items.append(Item(kind=ItemKind.ASSISTANT, blocks=[ThinkingBlock(content="unsigned")]))
    return items


def _converts_as_fresh(items: list[Item]) -> None:
    """Both conversions of ``items`` are a from-scratch one's (refused alike when the pairing is wrong)."""
    try:
        expected = openai_messages(_fresh(items)), anthropic_messages(_fresh(items))
    except ProtocolError:  # an edit made the pairing wrong (a second result, say)
        with pytest.raises(ProtocolError):
            openai_messages(items)
        with pytest.raises(ProtocolError):
            anthropic_messages(items)
        return
    assert (openai_messages(items), anthropic_messages(items)) == expected


@settings(max_examples=60, deadline=None)
@given(items=_conversations(), edits=st.lists(st.tuples(st.integers(0, 20), st.booleans()), max_size=6))
def test_a_conversation_converted_as_it_grows_and_changes_is_what_a_fresh_conversion_gives(
    items: list[Item], edits: list[tuple[int, bool]]
) -> None:
    """Each call goes on from the last one's state when it can (the same objects, grown) and starts over when
    it cannot (cut, or an item replaced); either way the result is a from-scratch conversion's."""
    current: list[Item] = []
    for n in range(1, len(items) + 1):  # growing one item at a time
        current = items[:n]
        _converts_as_fresh(current)
    for at, replace in edits:  # then cut back, or one item replaced by a copy of the last, and grown again
        if not current:
            break
        at %= len(current)
        current = [*current[:at], _fresh([current[-1]])[0], *current[at + 1 :]] if replace else current[:at]
        _converts_as_fresh(current)
        current = [*current, *items[len(current) :]]
        _converts_as_fresh(current)


def test_conversations_converted_in_threads_side_by_side_stay_their_own() -> None:
    """Threads sharing a first item (a module's system prompt) take turns on its run: none sees another's
    items, and each gets what a fresh conversion gives."""
    system = Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="shared")])
    wrong: list[str] = []

    def converse(tag: str) -> None:
        for round_ in range(40):
            items = [system]
            for n in range(8):
                call = f"{tag}-{round_}-{n}"
                items += [
                    _user(f"{tag} {n}"),
                    Item(kind=ItemKind.ASSISTANT, blocks=[ToolUseBlock(call_id=call, tool_name="f")]),
                    Item(
                        kind=ItemKind.TOOL,
                        blocks=[ToolResultBlock(call_id=call, content=[TextBlock(text="r")])],
                    ),
                ]
                if openai_messages(items) != openai_messages(_fresh(items)):
                    wrong.append(f"{tag} round {round_} item {len(items)}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: a race shows within a few calls
    try:
        threads = [threading.Thread(target=converse, args=(tag,)) for tag in "ABCD"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert wrong == []


def test_a_prefix_fold_nobody_uses_goes_with_its_last_reference() -> None:
    class State(list[str]):
        pass

    def add(state: State, item: Item) -> None:
        state.append(item.text)

    items = [_user("a"), _user("b")]
    fold: PrefixFold[State] = PrefixFold(State, add)
    state = weakref.ref(fold(items))
    gc.disable()  # freed by reference counting alone, not at a collection
    try:
        del fold
        assert state() is None
    finally:
        gc.enable()
