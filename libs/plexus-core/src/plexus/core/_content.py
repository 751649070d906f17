"""Content blocks: the universal payload primitive, with an extensible `type` registry.

Every payload between agents, the LLM and tools is a ``list[ContentBlock]``. ``ContentBlock`` is the common
base class ``BaseBlock`` annotated so that pydantic dispatches dicts on their ``type`` through a runtime
registry (so ``register_block_type`` also reaches blocks nested in ``ToolResultBlock.content``) and
serializes each block by its runtime class. Unknown types become ``UnknownBlock``, which re-serializes
byte-for-byte, so mixed-version deployments lose nothing.
"""

from __future__ import annotations

import base64
import binascii
import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializeAsAny,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from ._json import JsonValue, sort_keys_deep
from ._mime import sniff_mime

__all__ = [
    "AudioBlock",
    "BaseBlock",
    "CodeBlock",
    "ContentBlock",
    "DataBlock",
    "DataRef",
    "DocumentBlock",
    "ErrorBlock",
    "Handle",
    "ImageBlock",
    "InlineBytes",
    "InlineText",
    "MediaBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "UIResourceBlock",
    "UnknownBlock",
    "Uri",
    "VideoBlock",
    "content_block_from_dict",
    "content_block_to_dict",
    "model_facing",
    "register_block_type",
    "registered_block_types",
]


# --------------------------------------------------------------------------------------------------------
# Inline bytes: raw `bytes` in Python, standard base64 text on the wire.


def _bytes_from_wire(value: object) -> object:
    # Only `str` is treated as base64: a Python `bytes` value is already raw data and must never be decoded.
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"data must be raw bytes or a standard base64 string: {exc}") from None
    return value


def _bytes_to_base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


InlineData = Annotated[
    bytes,
    BeforeValidator(_bytes_from_wire),
    PlainSerializer(_bytes_to_base64, return_type=str, when_used="json"),
]


# --------------------------------------------------------------------------------------------------------
# Base class


class BaseBlock(BaseModel):
    """Common base of every content block: a ``type`` discriminator and a metadata map.

    ``metadata`` (seed: every part carries a MetadataMap) is for hosts and observability; it never reaches a
    model and serializes with recursively sorted keys so equal blocks give identical JSON.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Subclasses narrow this to `Literal["..."]`; `str` here lets `block.type` type-check on the base.
    type: str
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @field_serializer("metadata")
    def _serialize_metadata(self, metadata: dict[str, JsonValue]) -> JsonValue:
        return sort_keys_deep(metadata)

    def for_model(self) -> Self:
        """Copy without the parts that never reach a model (metadata; see `ToolResultBlock`)."""
        return self.model_copy(update={"metadata": {}}) if self.metadata else self


# --------------------------------------------------------------------------------------------------------
# Unknown types


class UnknownBlock(BaseBlock):
    """A block of an unregistered ``type``, kept verbatim.

    ``raw`` is the original wire dict; serialization emits exactly it (same keys, same order, metadata
    unsorted), so relaying a newer peer's block through an older node changes nothing.
    """

    raw: dict[str, JsonValue]

    @model_validator(mode="before")
    @classmethod
    def _derive_metadata(cls, values: Any) -> Any:
        # `metadata` mirrors raw["metadata"] so generic code sees it; it must never disagree with `raw`,
        # which is what gets serialized.
        if isinstance(values, dict) and isinstance(raw := values.get("raw"), dict):
            raw_metadata = raw.get("metadata")
            derived = raw_metadata if isinstance(raw_metadata, dict) else {}
            if "metadata" in values and values["metadata"] != derived:
                raise ValueError("UnknownBlock.metadata must equal raw['metadata'] (it is derived from raw)")
            values = {**values, "metadata": derived}
        return values

    @model_validator(mode="after")
    def _check_type(self) -> Self:
        if self.raw.get("type") != self.type:
            raise ValueError(
                f"UnknownBlock.type {self.type!r} must equal raw['type'] {self.raw.get('type')!r}"
            )
        return self

    @model_serializer(mode="plain")
    def _serialize_raw(self) -> dict[str, JsonValue]:
        return self.raw

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnknownBlock:
        """Wrap a wire dict whose ``type`` has no registered class."""
        return cls(type=data["type"], raw=dict(data))

    def for_model(self) -> Self:
        """Copy with the raw ``metadata`` key removed."""
        if "metadata" not in self.raw:
            return self
        raw = {k: v for k, v in self.raw.items() if k != "metadata"}
        return self.model_copy(update={"raw": raw, "metadata": {}})


# --------------------------------------------------------------------------------------------------------
# Registry and the ContentBlock field type

_REGISTRY: dict[str, type[BaseBlock]] = {}
_B = TypeVar("_B", bound=BaseBlock)


def _validate_block(value: object) -> BaseBlock:
    if isinstance(value, BaseBlock):
        return value
    if isinstance(value, dict | Mapping):  # exact dict first: the ABC check is slow on the hot path
        return content_block_from_dict(value)
    raise ValueError(f"a content block must be a dict or a BaseBlock instance, not {type(value).__name__}")


# Statically this is just `BaseBlock` (custom types make a closed union impossible); at runtime pydantic
# validates through the registry and serializes by each value's own class rather than the base's fields.
ContentBlock = Annotated[
    SerializeAsAny[BaseBlock],
    PlainValidator(_validate_block, json_schema_input_type=dict[str, Any]),
]


def _literal_type_value(cls: type[BaseBlock]) -> str:
    """The single string of ``cls``'s ``type: Literal["x"]`` field, or a ValueError saying what is wrong."""
    field = cls.model_fields.get("type")
    annotation = field.annotation if field is not None else None
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is not Literal or len(args) != 1 or not isinstance(args[0], str):
        raise ValueError(
            f'{cls.__name__} must declare `type: Literal["name"]` with exactly one string, got {annotation!r}'
        )
    if not args[0]:
        raise ValueError(f"{cls.__name__}: the type literal must be a non-empty string")
    return args[0]


def register_block_type(cls: type[_B]) -> type[_B]:
    """Add a block class to the ``type`` registry; usable as a class decorator. Call once at import time.

    Raises TypeError when ``cls`` is not a frozen subclass of ``BaseBlock`` and ValueError when its ``type``
    field is not a one-string Literal or the type name is already taken by another class.
    """
    if not isinstance(cls, type) or not issubclass(cls, BaseBlock):
        raise TypeError(f"register_block_type expects a subclass of BaseBlock, got {cls!r}")
    if issubclass(cls, UnknownBlock):
        raise TypeError("UnknownBlock and its subclasses are the fallback for unregistered types")
    if cls.model_config.get("frozen") is not True:
        raise TypeError(f"{cls.__name__} must be frozen (model_config = ConfigDict(frozen=True, ...))")
    name = _literal_type_value(cls)
    existing = _REGISTRY.get(name)
    if existing is cls:
        return cls  # idempotent, so re-importing a module that registers is harmless
    if existing is not None:
        raise ValueError(f"block type {name!r} is already registered to {existing.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def registered_block_types() -> dict[str, type[BaseBlock]]:
    """A snapshot of the registry: type name → block class."""
    return dict(_REGISTRY)


def content_block_from_dict(data: Mapping[str, Any]) -> BaseBlock:
    """Build a block from its wire dict, dispatching on ``type``; unregistered types become UnknownBlock.

    Raises ValueError when ``type`` is missing or not a string, and pydantic's ValidationError (a
    ValueError) when the fields do not fit the registered class.
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"content block data must be a mapping, not {type(data).__name__}")
    if "type" not in data:
        raise ValueError("content block dict has no 'type' key")
    name = data["type"]
    if not isinstance(name, str):
        raise ValueError(f"content block 'type' must be a string, got {type(name).__name__}")
    cls = _REGISTRY.get(name)
    if cls is None:
        return UnknownBlock.from_dict(data)
    return cls.model_validate(data)


def content_block_to_dict(block: BaseBlock) -> dict[str, JsonValue]:
    """The JSON-ready wire dict of ``block`` (bytes as base64, metadata keys sorted)."""
    result: dict[str, JsonValue] = block.model_dump(mode="json")
    return result


def model_facing(block: _B) -> _B:
    """``block`` without what never reaches a model: all metadata, and ToolResultBlock.terminate."""
    return block.for_model()


# --------------------------------------------------------------------------------------------------------
# Text & data


@register_block_type
class TextBlock(BaseBlock):
    """Plain text."""

    type: Literal["text"] = "text"
    text: str


@register_block_type
class CodeBlock(BaseBlock):
    """Program code with an optional syntax-highlighting hint."""

    type: Literal["code"] = "code"
    code: str
    language: str | None = None


@register_block_type
class DataBlock(BaseBlock):
    """Structured JSON data, optionally tied to a schema id and/or an inline JSON Schema."""

    type: Literal["data"] = "data"
    data: dict[str, JsonValue]
    schema_id: str | None = None
    # Named `json_schema` because `schema` shadows a BaseModel attribute.
    json_schema: dict[str, JsonValue] | None = None


@register_block_type
class ErrorBlock(BaseBlock):
    """A failure as content, detectable without string matching; ``details`` carries typed error fields."""

    type: Literal["error"] = "error"
    error_type: str
    message: str
    recoverable: bool = False
    details: dict[str, JsonValue] = Field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------
# DataRef (seed 002): a storage-agnostic pointer to binary content


class InlineText(BaseModel):
    """UTF-8 text; for media, an already base64-encoded payload."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["inline_text"] = "inline_text"
    text: str


class InlineBytes(BaseModel):
    """Raw bytes (base64 on the wire)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["inline_bytes"] = "inline_bytes"
    data: InlineData


class Uri(BaseModel):
    """Content hosted at a URL."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["uri"] = "uri"
    uri: str


class Handle(BaseModel):
    """Content held in a host-managed artifact store."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["handle"] = "handle"
    artifact_id: str


DataRef = Annotated[InlineText | InlineBytes | Uri | Handle, Field(discriminator="kind")]


# --------------------------------------------------------------------------------------------------------
# Media


class MediaBlock(BaseBlock):
    """Base of media blocks: at least one of ``url``, ``data`` (inline bytes) or ``file_id``.

    When ``data`` is given without ``mime_type``, the MIME type is sniffed from its magic bytes.
    """

    url: str | None = None
    data: InlineData | None = None
    file_id: str | None = None
    # validate_default so the sniffing validator also runs when mime_type is omitted.
    mime_type: str | None = Field(default=None, validate_default=True)

    _SOURCES: ClassVar[tuple[str, ...]] = ("url", "data", "file_id")

    @field_validator("mime_type", mode="after")
    @classmethod
    def _sniff_mime_type(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None and isinstance(data := info.data.get("data"), bytes):
            return sniff_mime(data)
        return value

    @model_validator(mode="after")
    def _require_source(self) -> Self:
        if self.url is None and self.data is None and self.file_id is None:
            raise ValueError(f"{type(self).__name__} needs at least one of url, data or file_id")
        return self

    @property
    def data_ref(self) -> DataRef:
        """The content as a DataRef, preferring inline data, then the artifact handle, then the URL."""
        if self.data is not None:
            return InlineBytes(data=self.data)
        if self.file_id is not None:
            return Handle(artifact_id=self.file_id)
        assert self.url is not None  # guaranteed by _require_source
        return Uri(uri=self.url)

    @classmethod
    def from_data_ref(cls, ref: DataRef, **fields: Any) -> Self:
        """Build from a DataRef: Handle → file_id, Uri → url, InlineBytes → data, InlineText → base64 data."""
        source: dict[str, Any]
        match ref:
            case InlineBytes(data=raw):
                source = {"data": raw}
            case InlineText(text=text):
                source = {"data": text}  # str is decoded as base64 by the `data` validator
            case Uri(uri=uri):
                source = {"url": uri}
            case Handle(artifact_id=artifact_id):
                source = {"file_id": artifact_id}
        return cls.model_validate({**fields, **source})


@register_block_type
class ImageBlock(MediaBlock):
    """An image by URL, inline bytes or storage file id."""

    type: Literal["image"] = "image"
    alt: str | None = None


@register_block_type
class AudioBlock(MediaBlock):
    """Audio with an optional speech-to-text transcript."""

    type: Literal["audio"] = "audio"
    transcript: str | None = None


@register_block_type
class VideoBlock(MediaBlock):
    """A video file or URL."""

    type: Literal["video"] = "video"


@register_block_type
class DocumentBlock(MediaBlock):
    """A document (e.g. PDF/DOCX) attached to context."""

    type: Literal["document"] = "document"
    filename: str | None = None


# --------------------------------------------------------------------------------------------------------
# Agentic


@register_block_type
class ToolUseBlock(BaseBlock):
    """A model's request to run a tool; ``kind`` is an optional UI hint (seed ToolKind)."""

    type: Literal["tool_use"] = "tool_use"
    call_id: str
    tool_name: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    kind: str | None = None


@register_block_type
class ToolResultBlock(BaseBlock):
    """A tool's output, itself a list of blocks.

    ``terminate`` asks the engine to skip the follow-up LLM call; like ``metadata`` it is internal and
    stripped by `for_model`.
    """

    type: Literal["tool_result"] = "tool_result"
    call_id: str
    content: list[ContentBlock]
    is_error: bool = False
    terminate: bool = False

    def for_model(self) -> Self:
        """Copy with metadata and ``terminate`` removed here and in every nested block."""
        return self.model_copy(
            update={"metadata": {}, "terminate": False, "content": [b.for_model() for b in self.content]}
        )


@register_block_type
class ThinkingBlock(BaseBlock):
    """Model reasoning; ``signature`` is Anthropic's opaque token and must be re-submitted unchanged."""

    type: Literal["thinking"] = "thinking"
    content: str
    redacted: bool = False
    signature: str | None = None


@register_block_type
class UIResourceBlock(BaseBlock):
    """A ``ui://`` resource rendered by the frontend in a sandbox; models only ever see text."""

    type: Literal["ui_resource"] = "ui_resource"
    uri: str
    render_mode: str
