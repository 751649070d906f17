"""Compaction (seeds 002/004): strategies that shrink a transcript, and a pipeline that triggers them.

Every strategy keeps tool pairs whole: a ``tool_use`` and its ``tool_result`` are both kept or both dropped,
because providers reject a result without its call (OpenHands #7512) and a call without its result.
System, developer and context items are never dropped by a strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from plexus.core import (
    TOKENS_BEFORE_KEY,
    Item,
    ItemKind,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    compaction_summary_item,
)

from ._client import ModelClient, ModelRequest, complete
from ._convert import blocks_text
from ._memo import transcript_bytes

__all__ = [
    "CompactionPipeline",
    "CompactionStrategy",
    "DropFailedToolResults",
    "DropReasoning",
    "KeepRecent",
    "SummarizeOlder",
    "safe_cuts",
]

_PINNED = frozenset({ItemKind.SYSTEM, ItemKind.DEVELOPER, ItemKind.CONTEXT})


class CompactionStrategy(Protocol):
    async def apply(self, items: list[Item]) -> list[Item]: ...


def safe_cuts(items: Sequence[Item]) -> list[int]:
    """Indexes ``i`` where ``items[i:]`` may start a transcript: no call before ``i`` is answered after it."""
    where_called: dict[str, int] = {}
    for i, item in enumerate(items):
        for b in item.blocks:
            if isinstance(b, ToolUseBlock):
                where_called[b.call_id] = i
    # A cut at i is unsafe when a result at >= i belongs to a call at < i.
    unsafe: set[int] = set()
    for j, item in enumerate(items):
        for b in item.blocks:
            if isinstance(b, ToolResultBlock) and b.call_id in where_called:
                unsafe.update(range(where_called[b.call_id] + 1, j + 1))
    return [i for i in range(len(items) + 1) if i not in unsafe]


def _split(items: Sequence[Item]) -> tuple[list[Item], list[Item]]:
    return [i for i in items if i.kind in _PINNED], [i for i in items if i.kind not in _PINNED]


def _last_user(items: Sequence[Item]) -> int:
    return max((i for i, item in enumerate(items) if item.kind is ItemKind.USER), default=-1)


@dataclass(frozen=True)
class DropReasoning:
    """Remove thinking blocks from turns before the last user item (the turn in flight keeps them: Anthropic
    needs them back inside a tool-use turn)."""

    async def apply(self, items: list[Item]) -> list[Item]:
        last = _last_user(items)
        out: list[Item] = []
        for i, item in enumerate(items):
            if i < last and any(isinstance(b, ThinkingBlock) for b in item.blocks):
                blocks = [b for b in item.blocks if not isinstance(b, ThinkingBlock)]
                if not blocks:
                    continue
                item = item.model_copy(update={"blocks": blocks})
            out.append(item)
        return out


@dataclass(frozen=True)
class DropFailedToolResults:
    """Remove failed tool results together with their calls (before the last user item)."""

    async def apply(self, items: list[Item]) -> list[Item]:
        last = _last_user(items)
        failed = {
            b.call_id
            for i, item in enumerate(items)
            if i < last
            for b in item.blocks
            if isinstance(b, ToolResultBlock) and b.is_error
        }
        if not failed:
            return list(items)
        out: list[Item] = []
        for item in items:
            blocks = [
                b
                for b in item.blocks
                if not (isinstance(b, ToolUseBlock | ToolResultBlock) and b.call_id in failed)
            ]
            if blocks:
                out.append(
                    item if len(blocks) == len(item.blocks) else item.model_copy(update={"blocks": blocks})
                )
        return out


@dataclass(frozen=True)
class KeepRecent:
    """Keep the pinned items and the last ``n`` others, moving the cut earlier until no pair is split."""

    n: int

    async def apply(self, items: list[Item]) -> list[Item]:
        pinned, rest = _split(items)
        start = _safe_start(rest, len(rest) - self.n)
        return [*pinned, *rest[start:]]


def _safe_start(rest: Sequence[Item], wanted: int) -> int:
    if wanted <= 0:
        return 0
    return max(c for c in safe_cuts(rest) if c <= wanted)


@dataclass(frozen=True)
class SummarizeOlder:
    """Replace all but the last ``keep`` non-pinned items with a summary written by ``model``."""

    model: ModelClient
    keep: int = 6
    instruction: str = "Summarise the conversation so far in a few sentences, keeping facts and decisions."

    async def apply(self, items: list[Item]) -> list[Item]:
        pinned, rest = _split(items)
        start = _safe_start(rest, len(rest) - self.keep)
        if start == 0:
            return list(items)
        older = "\n\n".join(f"{i.kind.value}: {blocks_text(i.blocks)}" for i in rest[:start])
        prompt = Item(kind=ItemKind.USER, blocks=[TextBlock(text=f"{self.instruction}\n\n{older}")])
        turn = await complete(self.model, ModelRequest(items=[prompt]))
        summary = compaction_summary_item(turn.item.text or "(empty summary)")
        summary = summary.model_copy(
            update={"metadata": {**summary.metadata, TOKENS_BEFORE_KEY: len(older) // 4}}
        )
        return [*pinned, summary, *rest[start:]]


@dataclass(frozen=True)
class CompactionPipeline:
    """Run ``strategies`` in order when the transcript has more than ``max_items`` items, when its JSON (as
    the agent's state holds it) is larger than ``max_bytes``, or when its estimated tokens exceed
    ``context_window - reserve_tokens`` (estimate: the last call's input tokens when given, else 4
    characters a token)."""

    strategies: Sequence[CompactionStrategy]
    max_items: int | None = None
    context_window: int | None = None
    reserve_tokens: int = 4096
    max_bytes: int | None = None

    def triggered(self, items: Sequence[Item], last_input_tokens: int | None = None) -> bool:
        if self.max_items is not None and len(items) > self.max_items:
            return True
        if self.max_bytes is not None and transcript_bytes(items) > self.max_bytes:
            return True
        if self.context_window is not None:
            tokens = last_input_tokens
            if tokens is None:
                tokens = sum(len(blocks_text(i.blocks)) for i in items) // 4
            return tokens > self.context_window - self.reserve_tokens
        return False

    async def run(self, items: list[Item], last_input_tokens: int | None = None) -> list[Item]:
        if not self.triggered(items, last_input_tokens):
            return items
        for strategy in self.strategies:
            items = await strategy.apply(items)
        return items
