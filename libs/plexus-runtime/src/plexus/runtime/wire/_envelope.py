"""The versioned wire envelope: msgspec Structs encoded as JSON, with the payload embedded as raw JSON.

`Envelope` carries one message to an agent inbox, `Reply` answers it, `RunInfo` says which run tree the
message belongs to. ``v`` is the wire major version: it is always written (even though it defaults to
`WIRE_VERSION`), and a reader rejects a missing or different major with `WireError(reason="version")`.
Minor additions are new optional fields, which older readers ignore (unknown fields are allowed).

The payload stays a `msgspec.Raw` JSON array of content blocks: a worker relays or stores it without
re-encoding, and blocks are only built (through `plexus.core._content`) when a handler needs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypeVar

import msgspec
from pydantic import ValidationError

from plexus.core import BaseBlock, content_blocks_from_json, content_blocks_to_json

__all__ = [
    "HDR_MSG_ID",
    "HDR_TOPIC_TO",
    "HDR_VERSION",
    "RESEND",
    "RESEND_DUPLICATE",
    "RESEND_ID_SEP",
    "RESEND_PROBE",
    "TRACE_HEADERS",
    "WIRE_VERSION",
    "Envelope",
    "EnvelopeKind",
    "Reply",
    "RunInfo",
    "WireError",
    "WireErrorReason",
    "blocks_from_payload",
    "decode_envelope",
    "decode_envelope_body",
    "decode_reply",
    "encode_envelope",
    "encode_reply",
    "make_headers",
    "payload_from_blocks",
    "topic_copy_id",
    "trace_headers",
]

WIRE_VERSION = 1

HDR_VERSION = "Plexus-V"
HDR_MSG_ID = "Nats-Msg-Id"
# A topic publication is one message; this header lists the stateless agent types it is for (space
# separated, escaped tokens), so a worker's per-type queue group skips the others without decoding.
HDR_TOPIC_TO = "Plexus-To"
#: Metadata key of a resend: a copy of an envelope the worker answers from the checkpoint and never runs the
#: handler for. Its `Nats-Msg-Id` is the envelope id, `RESEND_ID_SEP` and a suffix. Value `RESEND_DUPLICATE`:
#: JetStream de-duplicated the first copy (an agent that does not remember the message answers
#: ProtocolError); `RESEND_PROBE`: the caller's connection was interrupted while it awaited the reply, which
#: may have been lost (one not handled yet is dropped without an answer: its own handling will answer).
RESEND = "plexus.resend"
RESEND_DUPLICATE = "1"
RESEND_PROBE = "probe"
_RESEND_KINDS = (RESEND_DUPLICATE, RESEND_PROBE)
RESEND_ID_SEP = "~resend~"
#: W3C trace context (and baggage) headers, copied from an incoming message to the messages it causes.
TRACE_HEADERS = ("traceparent", "tracestate", "baggage")

EnvelopeKind: TypeAlias = Literal["send", "publish", "spawn"]
WireErrorReason: TypeAlias = Literal["garbage", "version", "schema", "header"]
_KINDS = frozenset(("send", "publish", "spawn"))


class WireError(ValueError):
    """Bytes that cannot be read as a Plexus message; the worker dead-letters them under `reason`.

    Reasons: ``garbage`` (not JSON or not an object), ``version`` (``v`` missing or another major),
    ``schema`` (a field missing or ill-typed), ``header`` (a required NATS header missing or inconsistent).
    """

    def __init__(self, reason: WireErrorReason, detail: str) -> None:
        self.reason: WireErrorReason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")

    def __reduce__(self) -> tuple[type[WireError], tuple[WireErrorReason, str]]:
        return type(self), (self.reason, self.detail)


def _wire_version() -> int:
    # A default_factory rather than a plain default: omit_defaults never omits a factory default, so `v`
    # is written on every message while callers need not pass it.
    return WIRE_VERSION


class RunInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run a message belongs to: its place in the run tree, priority, deadline (epoch s) and budget."""

    run_id: str
    root_id: str
    parent_id: str | None = None
    depth: int = 0
    priority: int = 0
    session_id: str | None = None
    deadline: float | None = None
    budget: dict[str, Any] | None = None
    #: True when the orchestrator owns this run tree (cluster-wide budgets, spawn slots, retries).
    orchestrated: bool = False
    retry: dict[str, Any] | None = None  # RetryPolicy JSON


class Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message to an agent. ``target``/``sender`` are `AgentId` string forms, ``topic`` a `TopicId`'s.

    ``id`` is the message id (a ULID; also the ``Nats-Msg-Id`` for JetStream de-duplication), ``payload``
    a raw JSON array of content blocks, ``sent_at``/``deadline`` epoch seconds.
    """

    v: int = msgspec.field(default_factory=_wire_version)
    id: str
    kind: EnvelopeKind
    target: str
    sender: str | None = None
    topic: str | None = None
    reply_to: str | None = None
    payload: msgspec.Raw
    run: RunInfo | None = None
    attempt: int = 0
    sent_at: float
    deadline: float | None = None
    metadata: dict[str, str] = {}


class Reply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The answer to an `Envelope` (``id`` = the envelope's id): blocks when ``ok``, else a wire error.

    ``error`` is `KernelError.to_wire()`; ``handled_by`` is the id of the worker that ran the handler.
    """

    v: int = msgspec.field(default_factory=_wire_version)
    id: str
    ok: bool
    payload: msgspec.Raw | None = None
    error: dict[str, Any] | None = None
    handled_by: str | None = None
    #: Set when the handler ended waiting for decisions (`Context.await_approval`): the ids it waits for.
    awaiting: list[str] | None = None
    #: With ``awaiting``: the id of that wait, when the agent names one.
    suspension: str | None = None


_NULL = msgspec.Raw(b"null")


class _ReplyWire(msgspec.Struct, frozen=True, kw_only=True):
    """What `Reply` decodes through: msgspec cannot decode ``Raw | None`` (the union only accepts null)."""

    v: int = msgspec.field(default_factory=_wire_version)
    id: str
    ok: bool
    payload: msgspec.Raw = _NULL
    error: dict[str, Any] | None = None
    handled_by: str | None = None
    awaiting: list[str] | None = None
    suspension: str | None = None


# Built once: msgspec compiles the type's decoding plan at construction.
_ENCODER = msgspec.json.Encoder()
_ENVELOPE_DECODER = msgspec.json.Decoder(Envelope)
_REPLY_DECODER = msgspec.json.Decoder(_ReplyWire)
_ANY_DECODER = msgspec.json.Decoder()
# msgspec writes fields in declaration order, so our own messages start with this; anything else (another
# encoder, reordered keys, no `v`) takes the slow path that looks at `v` before the schema.
_OWN_HEAD = b'{"v":'

_S = TypeVar("_S", Envelope, _ReplyWire)


# --------------------------------------------------------------------------------------------------------
# Encoding


def _check_finite(what: str, value: float | None) -> None:
    # msgspec writes NaN/inf as `null`, which would turn a deadline into "none" or fail the reader.
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")


def encode_envelope(env: Envelope) -> bytes:
    """JSON bytes of ``env``; raises ValueError for values the wire cannot carry faithfully."""
    if env.v != WIRE_VERSION:
        raise ValueError(f"this node writes wire version {WIRE_VERSION}, not {env.v!r}")
    if env.kind not in _KINDS:
        raise ValueError(f"envelope kind must be one of {sorted(_KINDS)}, got {env.kind!r}")
    _check_finite("sent_at", env.sent_at)
    _check_finite("deadline", env.deadline)
    if env.run is not None:
        _check_finite("run.deadline", env.run.deadline)
    return _ENCODER.encode(env)


def encode_reply(reply: Reply) -> bytes:
    """JSON bytes of ``reply``."""
    if reply.v != WIRE_VERSION:
        raise ValueError(f"this node writes wire version {WIRE_VERSION}, not {reply.v!r}")
    return _ENCODER.encode(reply)


# --------------------------------------------------------------------------------------------------------
# Decoding


def _is_json_array(raw: msgspec.Raw) -> bool:
    view = memoryview(raw)
    return len(view) > 0 and view[0] == 0x5B  # "[": msgspec.Raw spans the value without surrounding space


def _diagnose(data: bytes | bytearray | memoryview, what: str) -> None:
    """Slow path: classify input the typed decoder refused (or that lacks our head) as garbage or version."""
    try:
        obj = _ANY_DECODER.decode(data)
    except Exception as exc:  # not only DecodeError: deep nesting, bad UTF-8, … are bad input too
        raise WireError("garbage", f"{what} is not JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("garbage", f"{what} must be a JSON object, got {type(obj).__name__}")
    if "v" not in obj:
        raise WireError("version", f"{what} has no 'v' (wire version) field")
    v = obj["v"]
    if type(v) is not int or v != WIRE_VERSION:
        raise WireError("version", f"{what} has wire version {v!r}; this node reads version {WIRE_VERSION}")


def _decode(data: bytes | bytearray | memoryview, decoder: msgspec.json.Decoder[_S], what: str) -> _S:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError("garbage", f"{what} must be bytes, got {type(data).__name__}")
    if data[:5] != _OWN_HEAD:
        _diagnose(data, what)
    try:
        msg = decoder.decode(data)
    except msgspec.ValidationError as exc:
        _diagnose(data, what)  # raises when the version is the problem, not the schema
        raise WireError("schema", f"{what}: {exc}") from None
    except WireError:
        raise
    except Exception as exc:  # DecodeError, RecursionError, UnicodeDecodeError, …: all bad input
        raise WireError("garbage", f"{what} is not JSON: {type(exc).__name__}: {exc}") from None
    if msg.v != WIRE_VERSION:
        raise WireError(
            "version", f"{what} has wire version {msg.v!r}; this node reads version {WIRE_VERSION}"
        )
    return msg


def decode_envelope_body(data: bytes | bytearray | memoryview) -> Envelope:
    """Decode envelope bytes that travelled without NATS headers (a stored copy); checks only the body."""
    env = _decode(data, _ENVELOPE_DECODER, "envelope")
    if not _is_json_array(env.payload):
        raise WireError("schema", "envelope payload must be a JSON array of content blocks")
    return env


def decode_envelope(data: bytes | bytearray | memoryview, headers: Mapping[str, str] | None) -> Envelope:
    """Decode a received message: its headers (``msg.headers``; None when it had none) and body.

    ``Plexus-V`` is required and checked before the body is parsed; a ``Nats-Msg-Id`` must equal the
    envelope id, since de-duplication and the checkpoint's handled-message record must agree.
    """
    if headers is None or HDR_VERSION not in headers:
        raise WireError("header", f"the {HDR_VERSION} header is missing")
    major = headers[HDR_VERSION].split(".", 1)[0].strip()
    # The length cap keeps `int()` away from its digit limit (a ValueError that is not a WireError).
    if not (major.isascii() and major.isdigit() and len(major) <= 9):
        raise WireError(
            "header", f"the {HDR_VERSION} header {headers[HDR_VERSION][:32]!r} is not a version number"
        )
    if int(major) != WIRE_VERSION:
        raise WireError(
            "version",
            f"{HDR_VERSION} {headers[HDR_VERSION][:32]!r}: this node reads wire version {WIRE_VERSION}",
        )
    env = decode_envelope_body(data)
    msg_id = headers.get(HDR_MSG_ID)
    if msg_id is not None and msg_id != env.id and not _is_resend_of(msg_id, env):
        raise WireError("header", f"{HDR_MSG_ID} {msg_id!r} differs from the envelope id {env.id!r}")
    return env


def _is_resend_of(msg_id: str, env: Envelope) -> bool:
    # A resend carries its own de-duplication id (the original's is taken) and says so in its metadata.
    return env.metadata.get(RESEND) in _RESEND_KINDS and msg_id.startswith(env.id + RESEND_ID_SEP)


def decode_reply(data: bytes | bytearray | memoryview) -> Reply:
    """Decode reply bytes (body only: replies are also replayed from checkpoints without headers)."""
    wire = _decode(data, _REPLY_DECODER, "reply")
    payload: msgspec.Raw | None = wire.payload
    if wire.payload == _NULL:
        payload = None
    elif not _is_json_array(wire.payload):
        raise WireError("schema", "reply payload must be a JSON array of content blocks")
    return Reply(
        v=wire.v,
        id=wire.id,
        ok=wire.ok,
        payload=payload,
        error=wire.error,
        handled_by=wire.handled_by,
        awaiting=wire.awaiting,
        suspension=wire.suspension,
    )


# --------------------------------------------------------------------------------------------------------
# Payload and headers


def payload_from_blocks(blocks: Sequence[BaseBlock]) -> msgspec.Raw:
    """Encode content blocks once into the raw JSON array an envelope or reply embeds."""
    return msgspec.Raw(content_blocks_to_json(blocks))


def blocks_from_payload(raw: msgspec.Raw) -> list[BaseBlock]:
    """Build the content blocks of a payload; unknown block types come back as `UnknownBlock` verbatim.

    Raises `WireError` (``schema``) when a block does not validate.
    """
    try:
        return content_blocks_from_json(bytes(raw))
    except ValidationError as exc:
        raise WireError("schema", f"payload blocks do not validate: {exc}") from None
    except Exception as exc:  # deep nesting, bad UTF-8 inside a string, …: bad input, not a crash
        raise WireError("schema", f"payload blocks do not decode: {type(exc).__name__}: {exc}") from None


def _check_header(name: str, value: str) -> None:
    # A CR/LF would end the NATS header block early and corrupt the message for every reader.
    if not isinstance(name, str) or not name or any(c in name for c in ": \t\r\n"):
        raise ValueError(f"invalid header name {name!r}")
    if not isinstance(value, str) or "\r" in value or "\n" in value:
        raise ValueError(f"header {name!r} must be a str without CR/LF, got {value!r}")


def topic_copy_id(publication_id: str, agent_type: str) -> str:
    """The message id of agent type `agent_type`'s copy of a topic publication."""
    return f"{publication_id}.{agent_type}"


def make_headers(env: Envelope, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """NATS headers for ``env``: ``Nats-Msg-Id``, ``Plexus-V`` and ``extra`` (trace context, …).

    Raises ValueError when ``extra`` holds a malformed header or contradicts the two Plexus headers.
    """
    own = {HDR_MSG_ID: env.id, HDR_VERSION: str(env.v)}
    headers: dict[str, str] = {}
    if extra:
        for name, value in extra.items():
            _check_header(name, value)
            if name in own and value != own[name]:
                raise ValueError(f"header {name!r}={value!r} contradicts the envelope's {own[name]!r}")
            headers[name] = value
    headers.update(own)
    return headers


def trace_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The W3C trace-context headers of an incoming message, to pass on to the messages it causes."""
    if not headers:
        return {}
    return {name.lower(): value for name, value in headers.items() if name.lower() in TRACE_HEADERS}
