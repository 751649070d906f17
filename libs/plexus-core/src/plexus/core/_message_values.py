"""Payload values inside EventLog entries: errors as data, file attachments, tool calls and results."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
)

from ._errors import WIRE_ERROR_VERSION, KernelError
from ._ids import ToolCallId
from ._json import JsonValue

__all__ = ["ErrorInfo", "FileAttachment", "ToolCall", "ToolResult"]


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
