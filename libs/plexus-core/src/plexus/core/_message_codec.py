"""Decoding EventLog entries: the open registry of entry types, ``UnknownMessage`` and the JSON codec.

The set of entry types is open: ``register_message_type`` adds one, and a ``type`` this process does not
know becomes an ``UnknownMessage`` that keeps every field exactly as received, so an old worker can read,
store and forward what a newer one wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, TypeVar, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    Tag,
    TypeAdapter,
    model_serializer,
    model_validator,
)

from ._json import JsonValue
from ._messages import (
    InputMessage,
    KernelMessage,
    ReasoningMessage,
    ReplyMessage,
    RunCancelled,
    RunChildCompleted,
    RunChildSpawned,
    RunCompleted,
    RunFailed,
    RunLlmCall,
    RunMessageReceived,
    RunStarted,
    RunSuspended,
    RunTextDelta,
    RunToolCalled,
    RunToolResult,
    SystemMessage,
    ToolCallsMessage,
    ToolResultsMessage,
)

__all__ = [
    "EventLogEntry",
    "UnknownMessage",
    "entry_from_json",
    "entry_to_json",
    "kernel_message_from_dict",
    "register_message_type",
]


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
