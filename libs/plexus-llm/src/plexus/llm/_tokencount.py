"""Token counting for compaction's trigger: the provider's count endpoint, or an estimate made once per item.

A model client may offer ``async count_tokens(request) -> int`` (`TokenCounter`): `AnthropicModel` asks
``messages.count_tokens``, `OpenAIResponsesModel` ``responses.input_tokens.count`` and `GeminiModel`
``models.count_tokens``, each with the body its ``stream`` would send. Everything else, and every pipeline
not asked to count with the provider, uses `estimate_tokens`: 4 characters a token over each item's text
(tool-call arguments as JSON, reasoning text included; media as a short placeholder). The estimate of an
item is made once while the item lives, and a conversation's sum goes on from its last call's items
(`PrefixFold`), so a turn adds only its new items' share, never a pass over the whole conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from plexus.core import Item, ThinkingBlock, ToolUseBlock

from ._client import ModelRequest, ToolSpec
from ._convert import blocks_text
from ._fold import PrefixFold
from ._memo import ItemMemo

__all__ = [
    "CHARS_PER_TOKEN",
    "TokenCounter",
    "estimate_request_tokens",
    "estimate_tokens",
    "tool_chars",
]

#: The estimate's ratio: about right for English prose and JSON on current tokenizers; code, numbers and
#: most other languages take more tokens per character (the estimate runs low there).
CHARS_PER_TOKEN = 4


@runtime_checkable
class TokenCounter(Protocol):
    """A model client that can count a request's input tokens (the provider's own count, no generation)."""

    async def count_tokens(self, request: ModelRequest) -> int: ...


def _chars(item: Item) -> int:
    n = 0
    rest = []
    for block in item.blocks:
        # blocks_text renders these as a bare "[type]": the model reads (and is billed for) their content.
        if isinstance(block, ToolUseBlock):
            n += len(block.tool_name) + len(json.dumps(block.arguments))
        elif isinstance(block, ThinkingBlock):
            n += len(block.content)
        else:
            rest.append(block)
    return n + len(blocks_text(rest))


_ITEM_CHARS: ItemMemo[int] = ItemMemo(_chars)


class _Sum:
    __slots__ = ("chars",)

    def __init__(self) -> None:
        self.chars = 0


def _add(total: _Sum, item: Item) -> None:
    total.chars += _ITEM_CHARS(item)


_TRANSCRIPT_CHARS = PrefixFold(_Sum, _add)


def estimate_tokens(items: Sequence[Item]) -> int:
    """The items' tokens at `CHARS_PER_TOKEN` characters a token (each item measured once while it lives)."""
    return _TRANSCRIPT_CHARS(items).chars // CHARS_PER_TOKEN


def tool_chars(tools: Sequence[ToolSpec]) -> int:
    """The characters of the tools' declarations (names, descriptions, JSON Schemas)."""
    return sum(len(t.name) + len(t.description) + len(json.dumps(t.parameters)) for t in tools)


def estimate_request_tokens(request: ModelRequest) -> int:
    """`estimate_tokens` of the request's items plus its tool declarations (names, descriptions, schemas)."""
    return estimate_tokens(request.items) + tool_chars(request.tools) // CHARS_PER_TOKEN
