"""Provider-neutral pieces of the seed 004 boundary: which items reach a model, how tool output and data
blocks become text, and base64/MIME for inline media."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import TypeVar

from plexus.core import (
    BaseBlock,
    CodeBlock,
    DataBlock,
    ErrorBlock,
    Item,
    MediaBlock,
    TextBlock,
    ToolResultBlock,
    model_facing,
    model_items,
)

from ._memo import ItemMemo
from ._provenance import foreign_reasoning

__all__ = ["CANCELLED_RESULT", "blocks_text", "media_base64", "model_facing_memo", "unanswered_calls"]

T = TypeVar("T")

#: What a model is told for a call that never got a result (cancelled, crashed): every call is answered.
CANCELLED_RESULT = "[no result: the call was cancelled before it finished]"


def model_facing_memo(convert: Callable[[Item], T], provider: str) -> ItemMemo[T | None]:
    """A memo of ``convert`` applied to each item as ``provider``'s models see it (None: none sees the item).

    As a model sees it: session-only items dropped or turned into summaries (``model_items``), reasoning
    another provider made dropped (`foreign_reasoning`), every block stripped of what never reaches a model
    (metadata, ``terminate``). That copy is made on the way and not
    kept: only the conversion is. Callers check the tool pairing on the transcript as given
    (`check_tool_pairing` skips the session-only items; the copies keep every call and result of the others).
    """

    def facing_then_convert(item: Item) -> T | None:
        for model_item in model_items([item]):  # one item in, at most one out
            blocks = [model_facing(b) for b in model_item.blocks if not foreign_reasoning(b, provider)]
            return convert(Item(kind=model_item.kind, blocks=blocks))
        return None

    return ItemMemo(facing_then_convert)


def unanswered_calls(items: Sequence[Item]) -> set[str]:
    """Call ids of tool_use blocks with no tool_result anywhere in ``items``."""
    from plexus.core import ToolUseBlock

    calls = {b.call_id for i in items for b in i.blocks if isinstance(b, ToolUseBlock)}
    results = {b.call_id for i in items for b in i.blocks if isinstance(b, ToolResultBlock)}
    return calls - results


def blocks_text(blocks: Sequence[BaseBlock]) -> str:
    """Text rendering of blocks for places that accept only text (tool results, system prompts)."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, CodeBlock):
            parts.append(f"```{block.language or ''}\n{block.code}\n```")
        elif isinstance(block, DataBlock):
            parts.append(json.dumps(block.data, sort_keys=True))
        elif isinstance(block, ErrorBlock):
            parts.append(f"Error ({block.error_type}): {block.message}")
        elif isinstance(block, ToolResultBlock):
            parts.append(blocks_text(block.content))
        elif isinstance(block, MediaBlock):
            parts.append(f"[{block.type}: {block.mime_type or 'unknown type'}]")
        else:
            parts.append(f"[{block.type}]")
    return "\n".join(parts)


def media_base64(block: MediaBlock) -> tuple[str, str] | None:
    """(base64 data, MIME type) of inline media, the type sniffed by the block; None when it has no bytes."""
    if block.data is None:
        return None
    return base64.b64encode(block.data).decode("ascii"), block.mime_type or "application/octet-stream"
