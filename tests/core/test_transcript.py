"""Transcript items: ordering, determinism, tool pairing, role constraints, session-only items."""

from __future__ import annotations

import json
import math
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from plexus.core._content import (
    AudioBlock,
    BaseBlock,
    CodeBlock,
    DataBlock,
    DocumentBlock,
    ErrorBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UIResourceBlock,
    UnknownBlock,
    VideoBlock,
    content_block_from_dict,
)
from plexus.core._errors import ProtocolError
from plexus.core._ids import MessageId
from plexus.core._json import JsonValue
from plexus.core._transcript import (
    ANTHROPIC_ROLE,
    ANTHROPIC_SYSTEM_KINDS,
    BRANCH_FROM_KEY,
    CUSTOM_TYPE_KEY,
    MODEL_KINDS,
    OPENAI_ROLE,
    ROLE_BLOCK_TYPES,
    SESSION_ONLY_KINDS,
    SUMMARY_OF_KEY,
    TOKENS_BEFORE_KEY,
    Item,
    ItemKind,
    ItemView,
    branch_summary_item,
    check_tool_pairing,
    compaction_summary_item,
    custom_item,
    model_items,
    validate_roles,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8

# One sample block of every built-in type, plus blocks no role accepts.
SAMPLES: dict[str, BaseBlock] = {
    "text": TextBlock(text="hi"),
    "image": ImageBlock(data=PNG),
    "audio": AudioBlock(url="https://x/a.mp3"),
    "video": VideoBlock(url="https://x/v.mp4"),
    "document": DocumentBlock(url="https://x/d.pdf", filename="d.pdf"),
    "data": DataBlock(data={"k": 1}),
    "code": CodeBlock(code="print(1)", language="python"),
    "thinking": ThinkingBlock(content="hmm", signature="sig"),
    "tool_use": ToolUseBlock(call_id="c1", tool_name="fs.read", arguments={"path": "a"}),
    "tool_result": ToolResultBlock(call_id="c1", content=[TextBlock(text="ok")]),
    "error": ErrorBlock(error_type="E", message="m"),
    "ui_resource": UIResourceBlock(uri="ui://x", render_mode="iframe"),
    "future_block": content_block_from_dict({"type": "future_block", "x": 1}),
}

# -- strategies -----------------------------------------------------------------------------------------

keys = st.text(alphabet=string.ascii_lowercase + ".", min_size=1, max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)
metadatas = st.dictionaries(keys, json_values, max_size=4)
blocks = st.sampled_from(list(SAMPLES.values())) | st.builds(TextBlock, text=st.text(max_size=20))
items = st.builds(
    Item,
    id=st.none() | st.text(alphabet=string.ascii_letters, min_size=1, max_size=10).map(MessageId),
    kind=st.sampled_from(sorted(MODEL_KINDS)),
    blocks=st.lists(blocks, max_size=4),
    metadata=metadatas,
)


def _reorder(value: JsonValue, rng: random.Random) -> JsonValue:
    """The same JSON value with every object's keys in a shuffled insertion order."""
    if isinstance(value, dict):
        keys_ = list(value)
        rng.shuffle(keys_)
        return {k: _reorder(value[k], rng) for k in keys_}
    if isinstance(value, list):
        return [_reorder(v, rng) for v in value]
    return value


def _user(*blocks_: BaseBlock) -> Item:
    return Item(kind=ItemKind.USER, blocks=list(blocks_))


def _assistant(*blocks_: BaseBlock) -> Item:
    return Item(kind=ItemKind.ASSISTANT, blocks=list(blocks_))


def _tool(*blocks_: BaseBlock) -> Item:
    return Item(kind=ItemKind.TOOL, blocks=list(blocks_))


def _call(call_id: str) -> ToolUseBlock:
    return ToolUseBlock(call_id=call_id, tool_name="t")


def _result(call_id: str) -> ToolResultBlock:
    return ToolResultBlock(call_id=call_id, content=[TextBlock(text="r")])


# -- ItemKind -------------------------------------------------------------------------------------------


def test_item_kind_order_is_the_seed_order_then_session_only_kinds() -> None:
    expected = [
        ItemKind.SYSTEM,
        ItemKind.DEVELOPER,
        ItemKind.USER,
        ItemKind.ASSISTANT,
        ItemKind.TOOL,
        ItemKind.CONTEXT,
        ItemKind.CUSTOM,
        ItemKind.BRANCH_SUMMARY,
        ItemKind.COMPACTION_SUMMARY,
    ]
    shuffled = expected[:]
    random.Random(7).shuffle(shuffled)
    assert sorted(shuffled) == expected
    assert ItemKind.SYSTEM < ItemKind.DEVELOPER < ItemKind.USER < ItemKind.ASSISTANT
    assert ItemKind.ASSISTANT < ItemKind.TOOL < ItemKind.CONTEXT < ItemKind.CUSTOM
    assert ItemKind.TOOL >= ItemKind.TOOL >= ItemKind.USER
    assert ItemKind.CONTEXT > ItemKind.SYSTEM
    assert ItemKind.USER <= ItemKind.USER
    assert not ItemKind.CONTEXT < ItemKind.TOOL  # alphabetical order would say otherwise
    assert max(ItemKind.USER, ItemKind.SYSTEM) is ItemKind.USER


def test_item_kind_does_not_compare_with_strings() -> None:
    with pytest.raises(TypeError):
        _ = ItemKind.USER < "zzz"
    as_text: object = "user"
    assert as_text != ItemKind.USER  # a plain Enum, not a StrEnum
    assert ItemKind(as_text) is ItemKind.USER


def test_session_only_kinds() -> None:
    assert {ItemKind.CUSTOM, ItemKind.BRANCH_SUMMARY, ItemKind.COMPACTION_SUMMARY} == SESSION_ONLY_KINDS
    assert all(k.is_session_only for k in SESSION_ONLY_KINDS)
    assert not any(k.is_session_only for k in MODEL_KINDS)
    assert set(ItemKind) == MODEL_KINDS | SESSION_ONLY_KINDS


# -- role tables ----------------------------------------------------------------------------------------


def test_openai_roles_follow_the_seed_table() -> None:
    assert dict(OPENAI_ROLE) == {
        ItemKind.SYSTEM: "system",
        ItemKind.DEVELOPER: "system",
        ItemKind.USER: "user",
        ItemKind.ASSISTANT: "assistant",
        ItemKind.TOOL: "tool",
        ItemKind.CONTEXT: "system",
    }


def test_anthropic_roles_lift_system_kinds_and_send_tool_results_as_user() -> None:
    assert dict(ANTHROPIC_ROLE) == {
        ItemKind.SYSTEM: "system",
        ItemKind.DEVELOPER: "system",
        ItemKind.CONTEXT: "system",
        ItemKind.USER: "user",
        ItemKind.TOOL: "user",
        ItemKind.ASSISTANT: "assistant",
    }
    assert {ItemKind.SYSTEM, ItemKind.DEVELOPER, ItemKind.CONTEXT} == ANTHROPIC_SYSTEM_KINDS


def test_session_only_kinds_have_no_provider_role() -> None:
    for kind in SESSION_ONLY_KINDS:
        assert kind not in OPENAI_ROLE
        assert kind not in ANTHROPIC_ROLE
        assert kind not in ROLE_BLOCK_TYPES


# -- Item: round trip, immutability, determinism --------------------------------------------------------


@given(items)
def test_item_json_round_trip(item: Item) -> None:
    again = Item.model_validate_json(item.model_dump_json())
    assert again == item
    assert [type(b) for b in again.blocks] == [type(b) for b in item.blocks]
    assert again.model_dump_json() == item.model_dump_json()


def test_item_kind_is_a_lowercase_string_on_the_wire() -> None:
    wire = json.loads(Item(kind=ItemKind.BRANCH_SUMMARY, blocks=[TextBlock(text="s")]).model_dump_json())
    assert wire["kind"] == "branch_summary"
    with pytest.raises(ValidationError, match="kind"):
        Item.model_validate({"kind": "moderator"})


@given(metadatas, st.randoms(use_true_random=False))
def test_metadata_serializes_the_same_whatever_the_insertion_order(
    metadata: dict[str, JsonValue], rng: random.Random
) -> None:
    shuffled = _reorder(metadata, rng)
    assert isinstance(shuffled, dict)
    first = Item(kind=ItemKind.USER, blocks=[TextBlock(text="x")], metadata=metadata)
    second = Item(kind=ItemKind.USER, blocks=[TextBlock(text="x")], metadata=shuffled)
    assert first.model_dump_json() == second.model_dump_json()


def test_metadata_keys_are_sorted_at_every_depth() -> None:
    item = Item(kind=ItemKind.USER, metadata={"z": {"b": 1, "a": 2}, "a": [{"d": 1, "c": 2}]})
    assert item.model_dump_json() == (
        '{"id":null,"kind":"user","blocks":[],"metadata":{"a":[{"c":2,"d":1}],"z":{"a":2,"b":1}}}'
    )


def test_item_is_frozen() -> None:
    item = _user(TextBlock(text="x"))
    with pytest.raises(ValidationError, match="frozen"):
        item.kind = ItemKind.SYSTEM  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        item.blocks = []  # type: ignore[misc]


def test_item_rejects_unknown_fields_and_non_json_metadata() -> None:
    with pytest.raises(ValidationError, match="role"):
        Item.model_validate({"kind": "user", "role": "user"})
    with pytest.raises(ValidationError, match="metadata"):
        Item(kind=ItemKind.USER, metadata={"x": object()})


def test_item_text_joins_text_blocks() -> None:
    assert _assistant(TextBlock(text="a"), _call("c"), TextBlock(text="b")).text == "a\nb"


def test_item_satisfies_item_view() -> None:
    assert isinstance(_user(TextBlock(text="x")), ItemView)


# -- tool pairing ---------------------------------------------------------------------------------------


def test_well_paired_transcript_passes_strict_check() -> None:
    transcript = [
        Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="sys")]),
        _user(TextBlock(text="read it")),
        _assistant(TextBlock(text="ok"), _call("c1"), _call("c2")),
        _tool(_result("c2"), _result("c1")),
        _assistant(_call("c3")),
        _user(_result("c3")),  # Anthropic style: results in a user turn
        _assistant(TextBlock(text="done")),
    ]
    check_tool_pairing(transcript, strict=True)


def test_result_without_a_call_is_an_error() -> None:
    with pytest.raises(
        ProtocolError, match=r"item 1: tool result for 'nope' has no matching earlier tool call"
    ):
        check_tool_pairing([_assistant(_call("c1")), _tool(_result("nope"))])


def test_result_before_its_call_is_an_error() -> None:
    with pytest.raises(ProtocolError, match="item 0: tool result for 'c1' has no matching earlier"):
        check_tool_pairing([_tool(_result("c1")), _assistant(_call("c1"))])


def test_duplicate_call_ids_are_an_error() -> None:
    with pytest.raises(ProtocolError, match=r"item 2: duplicate tool call id 'c1' \(first used in item 0\)"):
        check_tool_pairing([_assistant(_call("c1")), _tool(_result("c1")), _assistant(_call("c1"))])
    with pytest.raises(ProtocolError, match="item 0: duplicate tool call id 'c1'"):
        check_tool_pairing([_assistant(_call("c1"), _call("c1"))])


def test_second_result_for_one_call_is_an_error() -> None:
    with pytest.raises(ProtocolError, match="item 2: second tool result for call 'c1'"):
        check_tool_pairing([_assistant(_call("c1")), _tool(_result("c1")), _tool(_result("c1"))])


def test_unanswered_calls_fail_only_in_strict_mode() -> None:
    transcript = [_assistant(_call("c1"), _call("c2"), _call("c3")), _tool(_result("c2"))]
    check_tool_pairing(transcript)  # mid-turn: calls may be in flight
    with pytest.raises(ProtocolError, match="tool calls without a result: 'c1', 'c3'"):
        check_tool_pairing(transcript, strict=True)


def test_pairing_skips_session_only_items() -> None:
    note = custom_item("ext.note", [_result("ghost")])
    check_tool_pairing([note, _assistant(_call("c1")), _tool(_result("c1"))], strict=True)


# -- role constraints -----------------------------------------------------------------------------------

ALLOWED = {
    ItemKind.SYSTEM: {"text"},
    ItemKind.DEVELOPER: {"text"},
    ItemKind.CONTEXT: {"text"},
    ItemKind.USER: {"text", "image", "audio", "video", "document", "data", "tool_result"},
    ItemKind.ASSISTANT: {"text", "thinking", "tool_use", "code", "data"},
    ItemKind.TOOL: {"tool_result", "error"},
}


def test_role_table_matches_seed_004() -> None:
    assert {k: set(v) for k, v in ROLE_BLOCK_TYPES.items()} == ALLOWED


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
@pytest.mark.parametrize("block_type", sorted(SAMPLES))
def test_every_kind_and_block_type_combination(kind: ItemKind, block_type: str) -> None:
    item = Item(kind=kind, blocks=[TextBlock(text="first")] if kind is not ItemKind.TOOL else [])
    item = item.model_copy(update={"blocks": [*item.blocks, SAMPLES[block_type]]})
    if block_type in ALLOWED[kind]:
        item.validate_for_model()
        validate_roles([item])
        return
    with pytest.raises(ProtocolError) as info:
        item.validate_for_model()
    assert f"an item of kind {kind.value!r} may not hold a block of type {block_type!r}" in str(info.value)
    with pytest.raises(
        ProtocolError,
        match=rf"^item 1: an item of kind '{kind.value}' may not hold a block of type '{block_type}'",
    ):
        validate_roles([_user(TextBlock(text="ok")), item])


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            Item(kind=ItemKind.SYSTEM, blocks=[SAMPLES["image"]]),
            "kind 'system' may not hold a block of type 'image'",
        ),
        (
            Item(kind=ItemKind.DEVELOPER, blocks=[SAMPLES["tool_use"]]),
            "kind 'developer' may not hold a block of type 'tool_use'",
        ),
        (
            Item(kind=ItemKind.CONTEXT, blocks=[SAMPLES["data"]]),
            "kind 'context' may not hold a block of type 'data'",
        ),
        (_user(SAMPLES["thinking"]), "kind 'user' may not hold a block of type 'thinking'"),
        (_user(SAMPLES["tool_use"]), "kind 'user' may not hold a block of type 'tool_use'"),
        (_user(SAMPLES["error"]), "kind 'user' may not hold a block of type 'error'"),
        (_assistant(SAMPLES["image"]), "kind 'assistant' may not hold a block of type 'image'"),
        (_assistant(SAMPLES["tool_result"]), "kind 'assistant' may not hold a block of type 'tool_result'"),
        (_tool(SAMPLES["text"]), "kind 'tool' may not hold a block of type 'text'"),
        (_user(SAMPLES["ui_resource"]), "may not hold a block of type 'ui_resource'"),
        (_assistant(SAMPLES["future_block"]), "may not hold a block of type 'future_block'"),
    ],
)
def test_named_role_violations(item: Item, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        item.validate_for_model()


def test_violation_names_the_block_position() -> None:
    item = _assistant(TextBlock(text="a"), ThinkingBlock(content="t"), SAMPLES["image"])
    with pytest.raises(ProtocolError, match=r"\(block 2\)"):
        item.validate_for_model()


@pytest.mark.parametrize(
    "item",
    [
        custom_item("ext.note", [TextBlock(text="x")]),
        branch_summary_item("s"),
        compaction_summary_item("s"),
    ],
)
def test_session_only_items_never_validate_for_a_model(item: Item) -> None:
    with pytest.raises(ProtocolError, match="session-only and never goes to a model"):
        item.validate_for_model()
    with pytest.raises(ProtocolError, match=f"item 0: an item of kind '{item.kind.value}' is session-only"):
        validate_roles([item])


def test_unknown_block_is_kept_in_items() -> None:
    item = _assistant(SAMPLES["future_block"])
    again = Item.model_validate_json(item.model_dump_json())
    assert isinstance(again.blocks[0], UnknownBlock)
    assert again == item


# -- ItemView -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Projected:
    """A wrapped item type that is not an `Item` but satisfies `ItemView`."""

    kind: ItemKind
    blocks: Sequence[BaseBlock]
    metadata: Mapping[str, JsonValue] = field(default_factory=dict)


def test_helpers_accept_any_item_view() -> None:
    views = [Projected(ItemKind.ASSISTANT, [_call("c1")]), Projected(ItemKind.TOOL, [_result("c1")])]
    assert all(isinstance(v, ItemView) for v in views)
    validate_roles(views)
    check_tool_pairing(views, strict=True)
    with pytest.raises(
        ProtocolError, match="item 0: an item of kind 'tool' may not hold a block of type 'text'"
    ):
        validate_roles([Projected(ItemKind.TOOL, [TextBlock(text="x")])])


# -- session-only items ---------------------------------------------------------------------------------


def test_custom_item_carries_its_type_in_metadata() -> None:
    item = custom_item("ext.bookmark", [TextBlock(text="here")], metadata={"ext.colour": "red"})
    assert item.kind is ItemKind.CUSTOM
    assert item.metadata == {"ext.colour": "red", CUSTOM_TYPE_KEY: "ext.bookmark"}
    assert Item.model_validate_json(item.model_dump_json()) == item


@pytest.mark.parametrize("metadata", [{}, {CUSTOM_TYPE_KEY: ""}, {CUSTOM_TYPE_KEY: 3}])
def test_custom_item_needs_a_custom_type(metadata: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=r"plexus\.custom_type"):
        Item(kind=ItemKind.CUSTOM, metadata=metadata)


@pytest.mark.parametrize("kind", [ItemKind.BRANCH_SUMMARY, ItemKind.COMPACTION_SUMMARY])
def test_summary_items_need_a_text_block(kind: ItemKind) -> None:
    with pytest.raises(ValidationError, match=f"kind '{kind.value}' needs a text block"):
        Item(kind=kind, blocks=[DataBlock(data={})])


def test_summary_constructors_record_their_metadata() -> None:
    branch = branch_summary_item("tried X", from_id="entry-9")
    compaction = compaction_summary_item("so far", tokens_before=120_000)
    assert (branch.kind, branch.text, branch.metadata) == (
        ItemKind.BRANCH_SUMMARY,
        "tried X",
        {BRANCH_FROM_KEY: "entry-9"},
    )
    assert (compaction.kind, compaction.text, compaction.metadata) == (
        ItemKind.COMPACTION_SUMMARY,
        "so far",
        {TOKENS_BEFORE_KEY: 120_000},
    )
    assert branch_summary_item("x").metadata == {}


def test_model_items_drops_custom_and_turns_summaries_into_user_items() -> None:
    transcript = [
        Item(kind=ItemKind.SYSTEM, blocks=[TextBlock(text="sys")]),
        compaction_summary_item("we fixed the parser", tokens_before=9000, id=MessageId("m1")),
        custom_item("ext.note", [TextBlock(text="ui only")]),
        _user(TextBlock(text="next?")),
        branch_summary_item("tried the other approach", from_id="e7"),
        _assistant(TextBlock(text="ok")),
    ]
    out = model_items(transcript)
    assert [i.kind for i in out] == [
        ItemKind.SYSTEM,
        ItemKind.USER,
        ItemKind.USER,
        ItemKind.USER,
        ItemKind.ASSISTANT,
    ]
    compaction, branch = out[1], out[3]
    assert compaction.id == "m1"
    assert "<summary>\nwe fixed the parser\n</summary>" in compaction.text
    assert compaction.text.startswith("Earlier conversation history was compacted")
    assert compaction.metadata == {TOKENS_BEFORE_KEY: 9000, SUMMARY_OF_KEY: "compaction"}
    assert "tried the other approach" in branch.text
    assert branch.metadata[SUMMARY_OF_KEY] == "branch"
    assert out[0] is transcript[0]
    assert all("ui only" not in i.text for i in out)
    validate_roles(out)


def test_model_items_can_make_summaries_context_items() -> None:
    out = model_items([compaction_summary_item("s")], summary_kind=ItemKind.CONTEXT)
    assert out[0].kind is ItemKind.CONTEXT
    validate_roles(out)


def test_model_items_rejects_other_summary_kinds() -> None:
    with pytest.raises(ValueError, match="not assistant"):
        model_items([], summary_kind=ItemKind.ASSISTANT)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, {"x": [1.0, math.inf]}])
def test_non_finite_numbers_are_refused_not_silently_nulled(bad: object) -> None:
    with pytest.raises(pydantic.ValidationError, match="must be finite"):
        Item(kind=ItemKind.USER, metadata={"a": bad})
