"""Kernel messages (seed 001) and run events: the entries of an agent's EventLog.

Every entry is a frozen pydantic model discriminated on ``type`` and carries ``id`` (a ULID string) and
``timestamp``. The timestamp is a float of *seconds* since the epoch (Python's ``time.time()``), not the
JavaScript milliseconds of the seed: seconds are what every Python clock API and ``asyncio`` speak, and a
float keeps sub-millisecond order. The id is minted from the same instant, so ids sort like timestamps.

Field names are snake_case on the wire too (``call_id``, ``mime_type``), like the rest of Plexus.

The set of entry types is open; decoding, the registry of types and ``UnknownMessage`` live in
``_message_codec``, the payload values (``ToolCall``, ``ErrorInfo``, ...) in ``_message_values``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ._ids import MessageId, RunId, ToolCallId
from ._json import JsonValue
from ._message_values import ErrorInfo, FileAttachment, ToolCall, ToolResult
from ._ulids import mint_ulid
from ._usage import FinishReason, Usage

__all__ = [
    "InputMessage",
    "KernelMessage",
    "ReasoningMessage",
    "ReplyMessage",
    "RunCancelled",
    "RunChildCompleted",
    "RunChildSpawned",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunLlmCall",
    "RunMessageReceived",
    "RunStarted",
    "RunSuspended",
    "RunTextDelta",
    "RunToolCalled",
    "RunToolResult",
    "SystemMessage",
    "ToolCallsMessage",
    "ToolResultsMessage",
]


def _new_id(data: dict[str, Any]) -> MessageId:
    # A bare ULID, as the seed says, minted from the message's own timestamp so ids sort like timestamps.
    # float(): an int timestamp is seconds too (python-ulid, the fork-safe path, reads an int as
    # milliseconds). A timestamp that failed validation is absent from `data`; the model is rejected
    # anyway, so any id will do.
    ts = data.get("timestamp")
    return MessageId(mint_ulid(float(ts) if isinstance(ts, int | float) else None))


_ULID_MAX_SECONDS = (2**48 - 1) / 1000


# -- kernel messages ------------------------------------------------------------------------------------


class KernelMessage(BaseModel):
    """Base of every EventLog entry. Subclasses narrow ``type`` to a one-value ``Literal`` with a default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    # Upper bound: the largest instant a ULID can encode (year 10889).
    timestamp: float = Field(default_factory=time.time, ge=0, le=_ULID_MAX_SECONDS, allow_inf_nan=False)
    # Decoding accepts any MessageId (foreign producers may not mint ULIDs); new messages get a ULID.
    id: MessageId = Field(default_factory=_new_id)


class InputMessage(KernelMessage):
    """User input: text and/or file attachments (at least one of the two)."""

    type: Literal["input"] = "input"
    text: str | None = None
    files: list[FileAttachment] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> InputMessage:
        if self.text is None and not self.files:
            raise ValueError("an input message needs text, files, or both")
        return self


class ReplyMessage(KernelMessage):
    """A direct response to the user, to be displayed or spoken."""

    type: Literal["reply"] = "reply"
    text: str


class ReasoningMessage(KernelMessage):
    """Internal reasoning surfaced by a reasoning model."""

    type: Literal["reasoning"] = "reasoning"
    title: str
    summary: str


class ToolCallsMessage(KernelMessage):
    """Tool executions requested together in one model turn."""

    type: Literal["tool-calls"] = "tool-calls"
    calls: list[ToolCall]


class ToolResultsMessage(KernelMessage):
    """Results (or errors) of tool executions."""

    type: Literal["tool-results"] = "tool-results"
    results: list[ToolResult]


class SystemMessage(KernelMessage):
    """A system prompt or a status note from the kernel."""

    type: Literal["system"] = "system"
    text: str


# -- run events -----------------------------------------------------------------------------------------


class RunEvent(KernelMessage):
    """A lifecycle fact about one run, logged beside the kernel messages. ``agent_id`` is ``str(AgentId)``."""

    run_id: RunId
    agent_id: str = Field(min_length=1)


class RunStarted(RunEvent):
    type: Literal["run.started"] = "run.started"
    parent_run_id: RunId | None = None
    root_run_id: RunId | None = None
    depth: int = Field(default=0, ge=0)


class RunMessageReceived(RunEvent):
    """The agent took a message off its inbox (``message_id`` is the envelope's id)."""

    type: Literal["msg.received"] = "msg.received"
    message_id: MessageId
    sender: str | None = None


class RunToolCalled(RunEvent):
    type: Literal["tool.called"] = "tool.called"
    call_id: ToolCallId
    tool_name: str = Field(min_length=1)
    arguments: JsonValue = None


class RunToolResult(RunEvent):
    type: Literal["tool.result"] = "tool.result"
    call_id: ToolCallId
    tool_name: str | None = None
    output: JsonValue = None
    error: ErrorInfo | None = None


class RunChildSpawned(RunEvent):
    type: Literal["child.spawned"] = "child.spawned"
    child_run_id: RunId
    child_agent_id: str = Field(min_length=1)


class RunChildCompleted(RunEvent):
    """A child run ended; ``status`` tells how, and the outcomes are never collapsed into one."""

    type: Literal["child.completed"] = "child.completed"
    child_run_id: RunId
    child_agent_id: str = Field(min_length=1)
    status: Literal["completed", "failed", "cancelled"] = "completed"
    output: JsonValue = None
    error: ErrorInfo | None = None
    usage: Usage | None = None


class RunSuspended(RunEvent):
    type: Literal["run.suspended"] = "run.suspended"
    reason: str


class RunCompleted(RunEvent):
    type: Literal["run.completed"] = "run.completed"
    output: JsonValue = None
    usage: Usage | None = None


class RunFailed(RunEvent):
    type: Literal["run.failed"] = "run.failed"
    error: ErrorInfo
    usage: Usage | None = None


class RunCancelled(RunEvent):
    type: Literal["run.cancelled"] = "run.cancelled"
    reason: str | None = None


class RunTextDelta(RunEvent):
    """A chunk of streamed model text, logged so a crashed stream can be replayed."""

    type: Literal["text.delta"] = "text.delta"
    text: str


class RunLlmCall(RunEvent):
    """One completed model call and what it cost."""

    type: Literal["llm.call"] = "llm.call"
    model: str | None = None
    usage: Usage | None = None
    finish_reason: FinishReason | None = None
    duration_s: float | None = Field(default=None, ge=0)
