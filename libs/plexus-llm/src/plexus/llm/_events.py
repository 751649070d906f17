"""The events of one streamed model call: the only primitive a `ModelClient` has to provide.

Adapters translate their SDK's stream into these; `TurnAccumulator` folds them into one assistant item.
Frozen slotted dataclasses, not pydantic models: thousands are made per call and they never cross a wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexus.core import BaseBlock, FinishReason, Usage

__all__ = [
    "BlockEvent",
    "FinishEvent",
    "ModelEvent",
    "ReasoningDeltaEvent",
    "ResponseEvent",
    "TextDeltaEvent",
    "ToolCallDeltaEvent",
    "UsageEvent",
]


@dataclass(frozen=True, slots=True)
class TextDeltaEvent:
    """A chunk of answer text. ``index`` tells apart text blocks of providers that stream several."""

    text: str
    index: int = 0


@dataclass(frozen=True, slots=True)
class ReasoningDeltaEvent:
    """A chunk of reasoning, and/or (part of) its opaque ``signature``; a block may carry only a signature.

    ``redacted`` marks a block whose content the provider withheld (Anthropic ``redacted_thinking``: the
    opaque payload travels in ``signature`` and must be re-submitted verbatim). ``provider`` names the adapter
    that made it (`_provenance`): only that provider is sent the block back.
    """

    text: str = ""
    signature: str = ""
    index: int = 0
    redacted: bool = False
    provider: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallDeltaEvent:
    """A piece of one tool call, keyed by ``index``.

    The first piece of a call usually carries ``call_id`` and ``name``; continuation pieces often carry only
    ``arguments`` (a fragment of the JSON text) and must never be dropped.
    """

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """A whole block no delta event describes (an output item of a type Plexus does not know, as an
    `UnknownBlock`): kept in the turn, in stream order, never dropped."""

    block: BaseBlock
    index: int = 0


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """Token counts (and cost) of the call so far; later events replace earlier ones."""

    usage: Usage


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """Why the model stopped, normalised; the provider's own value is in ``reason.raw``."""

    reason: FinishReason


@dataclass(frozen=True, slots=True)
class ResponseEvent:
    """Which response this is: the provider's id of it and the model that answered (which may name a version
    of the model asked for). GenAI telemetry reads them (`GenAITelemetry`); either may be None."""

    response_id: str | None = None
    model: str | None = None


ModelEvent = (
    TextDeltaEvent
    | ReasoningDeltaEvent
    | ToolCallDeltaEvent
    | BlockEvent
    | UsageEvent
    | FinishEvent
    | ResponseEvent
)
