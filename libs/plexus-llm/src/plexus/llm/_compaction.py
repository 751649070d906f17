"""Compaction (seeds 002/004): strategies that shrink a transcript, and a pipeline that triggers them.

Every strategy keeps tool pairs whole: a ``tool_use`` and its ``tool_result`` are both kept or both dropped,
because providers reject a result without its call (OpenHands #7512) and a call without its result.
System, developer and context items are never dropped by a strategy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

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
from ._errors import ProviderError
from ._memo import transcript_bytes
from ._tokencount import TokenCounter, estimate_request_tokens, estimate_tokens

__all__ = [
    "CompactionPipeline",
    "CompactionStrategy",
    "DropFailedToolResults",
    "DropReasoning",
    "KeepRecent",
    "SummarizeOlder",
    "safe_cuts",
]

_log = logging.getLogger(__name__)
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
    the agent's state holds it) is larger than ``max_bytes``, or when its tokens exceed ``context_window -
    reserve_tokens``.

    ``token_count="estimate"`` (the default) takes the last call's input tokens when given, else
    `estimate_tokens` (4 characters a token, each item measured once): no provider call. ``"provider"`` asks
    the model's count endpoint (`TokenCounter`) once before each model call, with the request the agent
    would send; a model without one is estimated, and so is a request whose count failed recoverably (a 429,
    a 5xx: logged). A count that fails otherwise (a 400, a bad key) raises its `ProviderError`."""

    strategies: Sequence[CompactionStrategy]
    max_items: int | None = None
    context_window: int | None = None
    reserve_tokens: int = 4096
    max_bytes: int | None = None
    token_count: Literal["estimate", "provider"] = "estimate"

    def __post_init__(self) -> None:
        if self.token_count not in ("estimate", "provider"):
            raise ValueError(f"token_count must be 'estimate' or 'provider', got {self.token_count!r}")

    def _oversized(self, items: Sequence[Item]) -> bool:
        if self.max_items is not None and len(items) > self.max_items:
            return True
        return self.max_bytes is not None and transcript_bytes(items) > self.max_bytes

    def triggered(self, items: Sequence[Item], last_input_tokens: int | None = None) -> bool:
        """Whether `run` compacts ``items``, with the tokens estimated (no provider call)."""
        if self._oversized(items):
            return True
        if self.context_window is not None:
            tokens = last_input_tokens if last_input_tokens is not None else estimate_tokens(items)
            return tokens > self.context_window - self.reserve_tokens
        return False

    async def count_tokens(
        self,
        items: Sequence[Item],
        last_input_tokens: int | None = None,
        *,
        model: object = None,
        request: Callable[[Sequence[Item]], ModelRequest] | None = None,
    ) -> int:
        """The tokens the trigger compares with ``context_window - reserve_tokens``. ``request`` makes the
        model request of ``items`` (the agent's system prompt, tools and settings: what the provider counts;
        by default the items alone)."""
        if self.token_count == "provider" and isinstance(model, TokenCounter):
            counted = request(items) if request is not None else ModelRequest(items=items)
            try:
                return await model.count_tokens(counted)
            except ProviderError as exc:
                if not exc.recoverable:
                    raise
                _log.warning("token count failed (%s); compaction estimates this call's tokens", exc)
                return estimate_request_tokens(counted)
        return last_input_tokens if last_input_tokens is not None else estimate_tokens(items)

    async def run(
        self,
        items: list[Item],
        last_input_tokens: int | None = None,
        *,
        model: object = None,
        request: Callable[[Sequence[Item]], ModelRequest] | None = None,
    ) -> list[Item]:
        """``items`` compacted when a limit is passed, else ``items`` themselves. ``model`` (the client about
        to be called) and ``request`` serve ``token_count="provider"`` (`count_tokens`)."""
        due = self._oversized(items)
        if not due and self.context_window is not None:
            tokens = await self.count_tokens(items, last_input_tokens, model=model, request=request)
            due = tokens > self.context_window - self.reserve_tokens
        if not due:
            return items
        for strategy in self.strategies:
            items = await strategy.apply(items)
        return items
