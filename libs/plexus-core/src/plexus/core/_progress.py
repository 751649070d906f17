"""Progress and stream events: what an observer of a run tree sees while it runs.

`AgentProgress` is published once per step of every agent in a tree; ``root_id`` names the tree so one
subscription (topic ``agent.progress/{root_id}``) covers all of it, and ``seq`` orders one run's events and
lets a subscriber drop duplicates. `StreamEvent` is the token-level stream of one model call.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Self

import msgspec
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from ._blocks_json import content_blocks_to_json
from ._content import BaseBlock, ContentBlock
from ._ids import RunId, parsed_run_id
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
    "delta_event_json",
    "progress_event_json",
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


_METADATA: TypeAdapter[dict[str, Any]] = TypeAdapter(Metadata)
_ENCODER = msgspec.json.Encoder()
_SORTED_ENCODER = msgspec.json.Encoder(order="sorted")
#: Nesting a metadata bag may have for the quick path (deeper ones take the model's way).
_PLAIN_DEPTH = 8


def _plain_json(value: object, depth: int) -> bool:
    """Whether msgspec writes `value` exactly as the metadata model does: dicts with string keys, lists,
    strings, bools, None, ints within 64 bits and floats it formats alike (no exponent)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -(2**63) <= value < 2**63  # type: ignore[operator]
    if kind is float:
        return value == 0.0 or 1e-4 <= abs(value) < 1e15  # type: ignore[arg-type]  # (NaN fails both)
    if depth >= _PLAIN_DEPTH:
        return False
    if kind is dict:
        return all(type(k) is str and _plain_json(v, depth + 1) for k, v in value.items())  # type: ignore[attr-defined]
    if kind is list:
        return all(_plain_json(v, depth + 1) for v in value)  # type: ignore[attr-defined]
    return False


_EMPTY = msgspec.Raw(b"{}")
_NO_CONTENT = msgspec.Raw(b"[]")


def progress_event_json(
    *,
    agent_id: str,
    step: AgentStep,
    content: Sequence[BaseBlock],
    run_id: str,
    root_id: str,
    parent_id: str | None,
    depth: int,
    seq: int,
    ts: float,
    metadata: Mapping[str, Any],
) -> bytes:
    """``AgentProgress(...).model_dump_json()`` as bytes, without building the model (a progress event is
    written on every step of every agent; the model costs ≈ 15 µs, this ≈ 3).

    The bytes are the model's. Inputs outside the common case (a dict for a block, an inconsistent tree
    position, a bad id, a number JSON would write differently) go through the model, which raises the
    errors it always did.
    """
    try:
        for run in (run_id, root_id) if parent_id is None else (run_id, root_id, parent_id):
            parsed_run_id(run)
        ids_ok = True
    except (ValueError, TypeError):
        ids_ok = False
    fast = (
        ids_ok
        and type(step) is AgentStep
        and type(agent_id) is str
        and agent_id
        and type(depth) is int
        and type(seq) is int
        and seq >= 0
        and type(ts) is float
        and 0.0 <= ts < 1e15  # where msgspec and pydantic write a float alike (no exponent)
        and all(isinstance(block, BaseBlock) for block in content)
        and (
            (parent_id is None and depth == 0 and root_id == run_id)
            or (parent_id is not None and depth > 0 and parent_id != run_id)
        )
    )
    meta = _EMPTY
    if fast and metadata:
        if _plain_json(metadata, 0):  # the common bag (ids, counts, names): sorted as the model sorts it
            meta = msgspec.Raw(_SORTED_ENCODER.encode(metadata))
        else:
            try:
                meta = msgspec.Raw(_METADATA.dump_json(_METADATA.validate_python(dict(metadata))))
            except ValueError:  # the model says what is wrong, at its own location
                fast = False
    if not fast:
        event = AgentProgress(
            agent_id=agent_id,
            step=step,
            content=list(content),
            run_id=run_id,
            root_id=root_id,
            parent_id=parent_id,
            depth=depth,
            seq=seq,
            ts=ts,
            metadata=dict(metadata),
        )
        return event.model_dump_json().encode()
    return _ENCODER.encode(
        {
            "agent_id": agent_id,
            "step": step.value,
            "content": msgspec.Raw(content_blocks_to_json(content)) if content else _NO_CONTENT,
            "run_id": run_id,
            "root_id": root_id,
            "parent_id": parent_id,
            "depth": depth,
            "seq": seq,
            "ts": ts,
            "metadata": meta,
        }
    )


def delta_event_json(text: str, *, reasoning: bool = False) -> bytes:
    """``TextDelta(text=text)`` (or `ReasoningDelta`) as JSON bytes, without building the model."""
    if type(text) is not str:
        event = ReasoningDelta(text=text) if reasoning else TextDelta(text=text)  # raises as it did
        return event.model_dump_json().encode()
    return _ENCODER.encode({"type": "reasoning_delta" if reasoning else "text_delta", "text": text})


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
