"""`TurnAccumulator`: folds a model stream into one assistant `Item`, tool calls accumulated by index.

Plexus keeps its own accumulator rather than the SDKs' helpers (research wave2 §2): chunks that repeat an
``index`` or carry only argument fragments without a name are merged, never dropped; the first call may
arrive at index > 0; a call with no argument text means ``{}``; arguments that are not a JSON object at
the end are kept raw in the block's metadata under `INVALID_ARGUMENTS_KEY`, and the loop answers that
call with an ErrorBlock the model sees instead of running the tool.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field

from plexus.core import (
    BaseBlock,
    FinishReason,
    Item,
    ItemKind,
    JsonValue,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)

from ._events import (
    BlockEvent,
    FinishEvent,
    ModelEvent,
    ReasoningDeltaEvent,
    ResponseEvent,
    TextDeltaEvent,
    ToolCallDeltaEvent,
    UsageEvent,
)
from ._provenance import made_by

__all__ = ["INVALID_ARGUMENTS_KEY", "ModelTurn", "TurnAccumulator"]

#: Metadata key of a ToolUseBlock whose streamed arguments were not a JSON object: the raw text and why.
INVALID_ARGUMENTS_KEY = "plexus.llm.invalid_arguments"


@dataclass(frozen=True)
class ModelTurn:
    """One completed model call: the assistant item, its usage and its normalised finish reason; the
    provider's response id and answering model when it said them (not journaled: a replayed turn has none)."""

    item: Item
    usage: Usage
    finish_reason: FinishReason
    response_id: str | None = None
    response_model: str | None = None

    @property
    def tool_calls(self) -> list[ToolUseBlock]:
        return [b for b in self.item.blocks if isinstance(b, ToolUseBlock)]


@dataclass
class _Call:
    call_id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Reasoning:
    text: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    redacted: bool = False
    provider: str = ""


class TurnAccumulator:
    """Feed `ModelEvent`s with `add`, then call `finish` once for the `ModelTurn`.

    Blocks come out in the order their first event arrived (reasoning, text and tool calls interleave as
    the provider sent them), which is what Anthropic needs to accept thinking blocks back.
    """

    def __init__(self) -> None:
        # (kind, index) in first-seen order; the dicts hold the parts.
        self._order: list[tuple[str, int]] = []
        self._texts: dict[int, list[str]] = {}
        self._reasoning: dict[int, _Reasoning] = {}
        self._calls: dict[int, _Call] = {}
        self._blocks: dict[int, BaseBlock] = {}
        self._usage = Usage()
        self._finish: FinishReason | None = None
        self._response: ResponseEvent | None = None

    def add(self, event: ModelEvent) -> None:
        if isinstance(event, TextDeltaEvent):
            parts = self._texts.get(event.index)
            if parts is None:
                parts = self._texts[event.index] = []
                self._order.append(("text", event.index))
            parts.append(event.text)
        elif isinstance(event, ToolCallDeltaEvent):
            call = self._calls.get(event.index)
            if call is None:
                call = self._calls[event.index] = _Call()
                self._order.append(("tool", event.index))
            # Later chunks that repeat the id or name (vLLM does) must not erase what came first.
            if event.call_id:
                call.call_id = call.call_id or event.call_id
            if event.name:
                call.name = call.name or event.name
            if event.arguments:
                call.arguments.append(event.arguments)
        elif isinstance(event, ReasoningDeltaEvent):
            reasoning = self._reasoning.get(event.index)
            if reasoning is None:
                reasoning = self._reasoning[event.index] = _Reasoning()
                self._order.append(("reasoning", event.index))
            if event.text:
                reasoning.text.append(event.text)
            if event.signature:
                reasoning.signature.append(event.signature)
            reasoning.redacted = reasoning.redacted or event.redacted
            if event.provider:
                reasoning.provider = event.provider
        elif isinstance(event, BlockEvent):
            if event.index not in self._blocks:
                self._order.append(("block", event.index))
            self._blocks[event.index] = event.block
        elif isinstance(event, UsageEvent):
            self._usage = event.usage
        elif isinstance(event, FinishEvent):
            self._finish = event.reason
        elif isinstance(event, ResponseEvent):
            self._response = event

    def finish(self, *, metadata: dict[str, JsonValue] | None = None) -> ModelTurn:
        """The turn so far. A stream without a finish event ends COMPLETED, or TOOL_CALL when it has calls."""
        blocks: list[BaseBlock] = []
        for kind, index in self._order:
            if kind == "text":
                text = "".join(self._texts[index])
                if text:
                    blocks.append(TextBlock(text=text))
            elif kind == "reasoning":
                r = self._reasoning[index]
                signature = "".join(r.signature) or None
                text = "".join(r.text)
                meta = made_by(r.provider)
                blocks.append(
                    ThinkingBlock(content=text, signature=signature, redacted=r.redacted, metadata=meta)
                )
            elif kind == "block":
                blocks.append(self._blocks[index])
            else:
                blocks.append(_tool_block(self._calls[index]))
        finish = self._finish
        if finish is None:
            has_calls = any(isinstance(b, ToolUseBlock) for b in blocks)
            finish = FinishReason.tool_call() if has_calls else FinishReason.completed()
        item = Item(kind=ItemKind.ASSISTANT, blocks=blocks, metadata=dict(metadata or {}))
        said = self._response
        if said is None:
            return ModelTurn(item=item, usage=self._usage, finish_reason=finish)
        return ModelTurn(item, self._usage, finish, said.response_id, said.model)


def _tool_block(call: _Call) -> ToolUseBlock:
    raw = "".join(call.arguments)
    # A provider that never sent an id still needs one: results are matched to calls by it, and ids must
    # be unique in the whole transcript (a position-based id repeats in the next turn and the conversion
    # refuses the transcript). A replayed turn comes from the journal, so the id need not be reproducible.
    call_id = call.call_id or f"call_{uuid.uuid4().hex[:24]}"
    name = call.name or ""
    if not raw.strip():
        return ToolUseBlock(call_id=call_id, tool_name=name, arguments={})  # zero-argument tool
    problem: str
    try:
        # NaN, Infinity and 1e999 parse, but no JSON value of a block may be non-finite.
        value = json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
    except ValueError as exc:
        problem = f"arguments are not valid JSON: {exc}"
    else:
        if isinstance(value, dict):
            return ToolUseBlock(call_id=call_id, tool_name=name, arguments=value)
        problem = f"arguments must be a JSON object, got {type(value).__name__}"
    return ToolUseBlock(
        call_id=call_id,
        tool_name=name,
        arguments={},
        metadata={INVALID_ARGUMENTS_KEY: {"raw": raw, "problem": problem}},
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")
