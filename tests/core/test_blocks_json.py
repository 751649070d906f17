"""The msgspec fast paths of `content_blocks_from_json`/`_to_json` against the full pydantic adapter.

The adapter is the definition: the fast reader must accept exactly what it accepts, build equal blocks and
raise the same errors; the fast writer must produce the very same bytes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from plexus.core import (
    BaseBlock,
    DataBlock,
    TextBlock,
    ToolUseBlock,
    content_block_to_dict,
    content_blocks_from_json,
    content_blocks_to_json,
)
from plexus.core._blocks_json import _BLOCK_LIST_ADAPTER
from tests.core.strategies import content_blocks, json_values, texts

_FIELDS = st.sampled_from(
    ["type", "text", "metadata", "call_id", "tool_name", "arguments", "data", "code", "language",
     "error_type", "message", "recoverable", "details", "content", "signature", "redacted", "url",
     "mime_type", "uri", "render_mode", "kind", "is_error", "terminate", "extra"]
)  # fmt: skip


def _reference(data: bytes | str) -> list[BaseBlock] | list[Any]:
    try:
        return _BLOCK_LIST_ADAPTER.validate_json(data)
    except ValidationError as exc:
        return ["error", exc.errors(include_url=False, include_context=False)]


def _fast(data: bytes | str) -> list[BaseBlock] | list[Any]:
    try:
        return content_blocks_from_json(data)
    except ValidationError as exc:
        return ["error", exc.errors(include_url=False, include_context=False)]


@st.composite
def _mutated_items(draw: st.DrawFn) -> object:
    """A block's wire dict, sometimes with a field changed, removed or added — or no dict at all."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(json_values)  # a list item that is not a block
    item: dict[str, Any] = content_block_to_dict(draw(content_blocks(max_leaves=3)))
    if kind <= 3:
        item[draw(_FIELDS)] = draw(json_values)
    elif kind == 4 and item:
        item.pop(draw(st.sampled_from(sorted(item))))
    return item


@settings(max_examples=400)
@given(st.lists(_mutated_items(), max_size=4))
def test_the_fast_reader_accepts_builds_and_refuses_what_the_adapter_does(
    items: list[object],
) -> None:
    data = json.dumps(items)
    assert _fast(data) == _reference(data)
    assert _fast(data.encode()) == _reference(data.encode())


@pytest.mark.parametrize(
    "data",
    [
        b'[{"type":"text","text":"x","metadata":{"n":1e999}}]',  # msgspec refuses it, the adapter explains
        b'[{"type":"data","data":{"n":-1E400}}]',
        b'{"type":"text","text":"x"}',
        b'[{"type":"text","text":"x"},{"text":"no type"}]',
        b'[{"type":7}]',
        b"[1]",
        b"[{",
        b'["\\ud800"]',
        b'[{"type":"text","text":"x","text":5}]',
        b'[{"type":"tool_result","call_id":"c","content":[{"type":"image"}]}]',
        b'[{"type":"x-new","anything":[1,2.5e300]}]',
        b"\xff",
    ],
)
def test_the_fast_reader_matches_the_adapter_on_edge_input(data: bytes) -> None:
    assert _fast(data) == _reference(data)


@settings(max_examples=300)
@given(st.lists(content_blocks(), max_size=4))
def test_the_fast_writer_gives_the_adapters_bytes(blocks: list[BaseBlock]) -> None:
    assert content_blocks_to_json(blocks) == _BLOCK_LIST_ADAPTER.dump_json(blocks)


@given(texts, st.dictionaries(texts, json_values, max_size=3), json_values)
def test_plain_blocks_with_metadata_and_floats_give_the_adapters_bytes(
    text: str, metadata: dict[str, Any], value: Any
) -> None:
    blocks: list[BaseBlock] = [
        TextBlock(text=text, metadata=metadata),
        ToolUseBlock(call_id="c", tool_name="t", arguments={"v": value}),
        DataBlock(data={"v": value, "exp": 1e22}),
    ]
    for block in blocks:
        assert content_blocks_to_json([block]) == _BLOCK_LIST_ADAPTER.dump_json([block])
