"""Kernel messages (seed 001) and run events: the entries of an agent's EventLog.

Every entry is a frozen pydantic model discriminated on ``type`` and carries ``id`` (a ULID string) and
``timestamp``. The timestamp is a float of *seconds* since the epoch (Python's ``time.time()``), not the
JavaScript milliseconds of the seed: seconds are what every Python clock API and ``asyncio`` speak, and a
float keeps sub-millisecond order. The id is minted from the same instant, so ids sort like timestamps.

Field names are snake_case on the wire too (``call_id``, ``mime_type``), like the rest of Plexus.

The set of entry types is open: ``register_message_type`` adds one, and a ``type`` this process does not
know becomes an ``UnknownMessage`` that keeps every field exactly as received, so an old worker can read,
store and forward what a newer one wrote.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, TypeVar, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    Tag,
    TypeAdapter,
    model_serializer,
    model_validator,
)

from ._errors import WIRE_ERROR_VERSION, KernelError
from ._ids import MessageId, RunId, ToolCallId
from ._json import JsonValue
from ._ulids import mint_ulid
from ._usage import FinishReason, Usage

__all__ = [
    "ErrorInfo",
    "EventLogEntry",
    "FileAttachment",
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
    "ToolCall",
    "ToolCallsMessage",
    "ToolResult",
    "ToolResultsMessage",
    "UnknownMessage",
    "entry_from_json",
    "entry_to_json",
    "kernel_message_from_dict",
    "register_message_type",
]


def _new_id(data: dict[str, Any]) -> MessageId:
    # A bare ULID, as the seed says, minted from the message's own timestamp so ids sort like timestamps.
    # float(): an int timestamp is seconds too (python-ulid, the fork-safe path, reads an int as
    # milliseconds). A timestamp that failed validation is absent from `data`; the model is rejected
    # anyway, so any id will do.
    ts = data.get("timestamp")
    return MessageId(mint_ulid(float(ts) if isinstance(ts, int | float) else None))


_ULID_MAX_SECONDS = (2**48 - 1) / 1000


def _b64_in(value: object) -> object:
    """Accept raw bytes, or a base64 string (the JSON form) which is decoded strictly."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"file data given as a string must be base64: {exc}") from None
    return value


def _b64_out(value: bytes, info: SerializationInfo) -> bytes | str:
    return base64.b64encode(value).decode("ascii") if info.mode_is_json() else value


_Base64Bytes = Annotated[bytes, BeforeValidator(_b64_in), PlainSerializer(_b64_out)]
"""Bytes in Python, standard base64 text in JSON (a string given to the validator is always base64)."""


# -- shared payload values ------------------------------------------------------------------------------


class ErrorInfo(BaseModel):
    """A failure carried as data, in the same shape as ``KernelError.to_wire()``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = WIRE_ERROR_VERSION
    error_type: str = Field(min_length=1)
    message: str = ""
    fields: dict[str, JsonValue] = Field(default_factory=dict)

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        """Describe any exception; a KernelError keeps its typed fields so it can be re-raised as itself."""
        if isinstance(exc, KernelError):
            # Error fields are plain Python values (tuples, ids, ...); squeeze them through JSON so an odd
            # field degrades to its repr instead of making the error itself unreportable.
            return cls.model_validate(json.loads(json.dumps(exc.to_wire(), default=repr)))
        return cls(error_type=type(exc).__name__, message=str(exc))

    def to_exception(self) -> KernelError:
        """The KernelError this describes (an unknown type becomes ``RemoteKernelError``)."""
        return KernelError.from_wire(self.model_dump(mode="json"))


class FileAttachment(BaseModel):
    """A file sent with user input. ``data`` is raw bytes; JSON carries it as base64."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data: _Base64Bytes
    filename: str | None = None
    mime_type: str | None = None


class ToolCall(BaseModel):
    """One tool invocation requested by the model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: ToolCallId
    name: str = Field(min_length=1)
    args: JsonValue = None


class ToolResult(BaseModel):
    """The outcome of one tool call; ``call_id`` links back to ``ToolCall.id``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call_id: ToolCallId | None = None
    name: str | None = None
    output: JsonValue
    error: ErrorInfo | None = None


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


# -- unknown entries ------------------------------------------------------------------------------------


class UnknownMessage(BaseModel):
    """An entry whose ``type`` this process does not know, kept verbatim in ``raw``.

    It serializes to exactly ``raw`` (same keys, same order, no defaults added, nothing coerced), so a node
    running an older Plexus can store and relay a newer peer's entries without loss.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    raw: dict[str, JsonValue]

    @model_validator(mode="after")
    def _check_type(self) -> Self:
        if self.raw.get("type") != self.type:
            raise ValueError(
                f"UnknownMessage.type {self.type!r} must equal raw['type'] {self.raw.get('type')!r}"
            )
        return self

    @model_serializer(mode="plain")
    def _dump(self) -> dict[str, JsonValue]:
        return self.raw

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnknownMessage:
        """Wrap a wire dict whose ``type`` has no registered class."""
        if not isinstance(data, Mapping):
            raise ValueError(f"an event log entry must be an object, got {type(data).__name__}")
        if not isinstance(data.get("type"), str):
            raise ValueError("an event log entry needs a string 'type'")
        return cls(type=data["type"], raw=dict(data))

    @property
    def id(self) -> str | None:
        value = self.raw.get("id")
        return value if isinstance(value, str) else None

    @property
    def timestamp(self) -> float | None:
        value = self.raw.get("timestamp")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# -- registry -------------------------------------------------------------------------------------------

_BUILTIN: tuple[type[KernelMessage], ...] = (
    InputMessage,
    ReplyMessage,
    ReasoningMessage,
    ToolCallsMessage,
    ToolResultsMessage,
    SystemMessage,
    RunStarted,
    RunMessageReceived,
    RunToolCalled,
    RunToolResult,
    RunChildSpawned,
    RunChildCompleted,
    RunSuspended,
    RunCompleted,
    RunFailed,
    RunCancelled,
    RunTextDelta,
    RunLlmCall,
)

# Internal union tags; real types never start with "<".
_UNKNOWN_TAG = "<unknown>"
_EXTENSION_TAG = "<extension>"


def _type_tag(cls: type[KernelMessage]) -> str:
    field = cls.model_fields.get("type")
    args = get_args(field.annotation) if field is not None else ()
    if (
        field is None
        or get_origin(field.annotation) is not Literal
        or len(args) != 1
        or not isinstance(args[0], str)
        or field.default != args[0]
    ):
        raise TypeError(f"{cls.__name__} must declare `type: Literal['<name>'] = '<name>'`")
    tag: str = args[0]
    if not tag or tag.startswith("<"):
        raise TypeError(f"{cls.__name__} has an invalid type tag {tag!r}")
    return tag


_REGISTRY: dict[str, type[KernelMessage]] = {_type_tag(c): c for c in _BUILTIN}
_M = TypeVar("_M", bound=KernelMessage)
_BUILTIN_TAGS = frozenset(_REGISTRY)


def register_message_type(cls: type[_M]) -> type[_M]:
    """Make ``cls`` decodable by its ``type``; call once at import time. Usable as a class decorator.

    Registering the same class again is a no-op. Raises TypeError when ``cls`` is not a frozen
    KernelMessage subclass with a ``type: Literal["name"] = "name"`` field, and ValueError when the name
    is taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, KernelMessage)):
        raise TypeError(f"register_message_type expects a KernelMessage subclass, got {cls!r}")
    if cls.model_config.get("frozen") is not True:
        raise TypeError(f"{cls.__name__} must be frozen, like every EventLog entry")
    tag = _type_tag(cls)
    existing = _REGISTRY.get(tag)
    if existing is not None and existing is not cls:
        raise ValueError(f"message type {tag!r} is already registered to {existing.__qualname__}")
    _REGISTRY[tag] = cls
    return cls


def kernel_message_from_dict(data: Mapping[str, Any]) -> KernelMessage | UnknownMessage:
    """Decode one entry from its dict form; an unregistered ``type`` gives an ``UnknownMessage``."""
    result: KernelMessage | UnknownMessage = _ADAPTER.validate_python(data)
    return result


def _route(value: Any) -> str:
    """Pick the union member for a dict (validation) or an instance (serialization)."""
    if isinstance(value, UnknownMessage):
        return _UNKNOWN_TAG
    tag = value.get("type") if isinstance(value, Mapping) else getattr(value, "type", None)
    if not isinstance(tag, str):
        return _UNKNOWN_TAG  # UnknownMessage.from_dict reports the problem
    if tag in _BUILTIN_TAGS:
        return tag
    if tag in _REGISTRY:
        return _EXTENSION_TAG
    return _UNKNOWN_TAG


def _validate_extension(value: Any) -> KernelMessage:
    # Types registered after this module was imported cannot be members of the static union below,
    # so they are dispatched through the registry at validation time.
    if isinstance(value, KernelMessage):
        return value
    return _REGISTRY[value["type"]].model_validate(value)


def _validate_unknown(value: Any) -> UnknownMessage:
    if isinstance(value, UnknownMessage):
        return value
    if isinstance(value, KernelMessage):
        raise ValueError(
            f"{type(value).__name__} (type {value.type!r}) is not registered; see register_message_type"
        )
    return UnknownMessage.from_dict(value)


def _dump_unknown(value: UnknownMessage) -> dict[str, JsonValue]:
    # Explicit: a PlainValidator replaces the model schema, and with it the model's own serializer.
    return value.raw


def _dump_extension(value: KernelMessage, info: SerializationInfo) -> Any:
    return value.model_dump(mode=info.mode)


_Extension = Annotated[
    KernelMessage,
    PlainValidator(_validate_extension),
    PlainSerializer(_dump_extension),
]

EventLogEntry = Annotated[
    Annotated[InputMessage, Tag("input")]
    | Annotated[ReplyMessage, Tag("reply")]
    | Annotated[ReasoningMessage, Tag("reasoning")]
    | Annotated[ToolCallsMessage, Tag("tool-calls")]
    | Annotated[ToolResultsMessage, Tag("tool-results")]
    | Annotated[SystemMessage, Tag("system")]
    | Annotated[RunStarted, Tag("run.started")]
    | Annotated[RunMessageReceived, Tag("msg.received")]
    | Annotated[RunToolCalled, Tag("tool.called")]
    | Annotated[RunToolResult, Tag("tool.result")]
    | Annotated[RunChildSpawned, Tag("child.spawned")]
    | Annotated[RunChildCompleted, Tag("child.completed")]
    | Annotated[RunSuspended, Tag("run.suspended")]
    | Annotated[RunCompleted, Tag("run.completed")]
    | Annotated[RunFailed, Tag("run.failed")]
    | Annotated[RunCancelled, Tag("run.cancelled")]
    | Annotated[RunTextDelta, Tag("text.delta")]
    | Annotated[RunLlmCall, Tag("llm.call")]
    | Annotated[_Extension, Tag(_EXTENSION_TAG)]
    | Annotated[
        UnknownMessage, PlainValidator(_validate_unknown), PlainSerializer(_dump_unknown), Tag(_UNKNOWN_TAG)
    ],
    Discriminator(_route),
]
"""Any EventLog entry, as a pydantic field type: built-in, registered extension, or ``UnknownMessage``."""

_ADAPTER: TypeAdapter[KernelMessage | UnknownMessage] = TypeAdapter(
    EventLogEntry, config=ConfigDict(title="EventLogEntry")
)


def entry_to_json(entry: KernelMessage | UnknownMessage) -> bytes:
    """Serialize one EventLog entry to compact JSON bytes."""
    # Every entry is a model that knows its own serializer; going through the union would only add the
    # discriminator call (about 3x slower on this hot path).
    return entry.__pydantic_serializer__.to_json(entry)


def entry_from_json(data: bytes | str) -> KernelMessage | UnknownMessage:
    """Parse one EventLog entry from JSON; errors are pydantic ``ValidationError`` naming the field."""
    return _ADAPTER.validate_json(data)
