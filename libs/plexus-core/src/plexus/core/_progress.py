"""Progress and stream events: what an observer of a run tree sees while it runs.

`AgentProgress` is published once per step of every agent in a tree; ``root_id`` names the tree so one
subscription (topic ``agent.progress/{root_id}``) covers all of it, and ``seq`` orders one run's events and
lets a subscriber drop duplicates. `StreamEvent` is the token-level stream of one model call.
"""

from __future__ import annotations

import enum
import time
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from ._content import ContentBlock
from ._ids import RunId
from ._transcript import Metadata
from ._usage import FinishReason, Usage

__all__ = [
    "AgentProgress",
    "AgentStep",
    "CompletionEvent",
    "ReasoningDelta",
    "StreamDone",
    "StreamEvent",
    "TextDelta",
    "stream_event_from_json",
    "stream_event_to_json",
]


class AgentStep(enum.StrEnum):
    """The step an agent just took."""

    STARTED = "started"
    THINKING = "thinking"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    HANDOFF = "handoff"
    PAUSED = "paused"
    DONE = "done"
    ERROR = "error"


class AgentProgress(BaseModel):
    """One progress event of one agent in a run tree.

    ``parent_id`` is the parent *run*; a root run has none, ``depth`` 0 and ``root_id == run_id`` (the
    default when ``root_id`` is omitted). ``ts`` is epoch seconds, like kernel message timestamps.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_id: str = Field(min_length=1)
    step: AgentStep
    content: list[ContentBlock] = Field(default_factory=list)
    run_id: RunId
    # Defaults to run_id (declared above, so already validated when this factory runs): a root run.
    root_id: RunId = Field(default_factory=lambda data: data.get("run_id"))
    parent_id: RunId | None = None
    depth: int = Field(default=0, ge=0)
    seq: int = Field(ge=0)
    ts: float = Field(default_factory=time.time)
    metadata: Metadata = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_tree_position(self) -> Self:
        if self.parent_id is None:
            if self.depth != 0:
                raise ValueError(f"a run without parent_id is a root and has depth 0, not {self.depth}")
            if self.root_id != self.run_id:
                raise ValueError(f"a root run is its own root: root_id {self.root_id!r} != run_id")
        elif self.depth == 0:
            raise ValueError("a run with a parent_id is a child and has depth >= 1")
        elif self.parent_id == self.run_id:
            raise ValueError("a run cannot be its own parent")
        return self


class TextDelta(BaseModel):
    """A chunk of answer text."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["text_delta"] = "text_delta"
    text: str


class ReasoningDelta(BaseModel):
    """A chunk of model reasoning."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["reasoning_delta"] = "reasoning_delta"
    text: str


class CompletionEvent(BaseModel):
    """The model call finished: what it cost and why it stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["completion"] = "completion"
    usage: Usage
    finish_reason: FinishReason


class StreamDone(BaseModel):
    """End of stream; nothing follows."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["done"] = "done"


StreamEvent = Annotated[
    TextDelta | ReasoningDelta | CompletionEvent | StreamDone, Field(discriminator="type")
]
"""One event of a model stream, discriminated on ``type``."""

_STREAM_ADAPTER: TypeAdapter[TextDelta | ReasoningDelta | CompletionEvent | StreamDone] = TypeAdapter(
    StreamEvent
)


def stream_event_to_json(event: TextDelta | ReasoningDelta | CompletionEvent | StreamDone) -> bytes:
    """Compact JSON bytes of one stream event."""
    return event.__pydantic_serializer__.to_json(event)


def stream_event_from_json(data: bytes | str) -> TextDelta | ReasoningDelta | CompletionEvent | StreamDone:
    """Parse one stream event; an unknown ``type`` or bad field raises pydantic's ValidationError."""
    return _STREAM_ADAPTER.validate_json(data)
