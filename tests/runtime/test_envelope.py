"""The wire envelope: round trips, every WireError reason, forward compatibility, headers."""

from __future__ import annotations

import json
import pickle
from typing import Any

import msgspec
import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.propagate import inject
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from plexus.core._content import (
    BaseBlock,
    DataBlock,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UnknownBlock,
)
from plexus.core._errors import BudgetExhaustedError, KernelError
from plexus.runtime.ops._server import NatsServer
from plexus.runtime.wire._envelope import (
    HDR_MSG_ID,
    HDR_VERSION,
    WIRE_VERSION,
    Envelope,
    Reply,
    RunInfo,
    WireError,
    blocks_from_payload,
    decode_envelope,
    decode_envelope_body,
    decode_reply,
    encode_envelope,
    encode_reply,
    make_headers,
    payload_from_blocks,
    trace_headers,
)

MSG_ID = "01JD3W6Q2V6C7X4N8B9M0P1R2S"
texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False)
json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts


def _env(**over: Any) -> Envelope:
    fields: dict[str, Any] = {
        "id": MSG_ID,
        "kind": "send",
        "target": "echo/k1",
        "payload": payload_from_blocks([TextBlock(text="hi")]),
        "sent_at": 1700000000.5,
    }
    return Envelope(**{**fields, **over})


def _wire(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _env_dict(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = json.loads(encode_envelope(_env()))
    base.update(over)
    return base


# --------------------------------------------------------------------------------------------------------
# Strategies

blocks: st.SearchStrategy[BaseBlock] = st.one_of(
    st.builds(TextBlock, text=texts),
    st.builds(DataBlock, data=st.dictionaries(texts, json_leaf, max_size=3)),
    st.builds(
        ToolUseBlock, call_id=texts, tool_name=texts, arguments=st.dictionaries(texts, json_leaf, max_size=3)
    ),
    st.builds(ImageBlock, data=st.binary(min_size=1, max_size=16)),
    st.builds(
        lambda name, fields: UnknownBlock.from_dict({"type": "x-" + name, **fields}),
        texts,
        st.dictionaries(texts.filter(lambda k: k not in ("type", "metadata")), json_leaf, max_size=3),
    ),
)
block_lists = st.lists(blocks, max_size=4)
run_infos = st.builds(
    RunInfo,
    run_id=texts,
    root_id=texts,
    parent_id=st.none() | texts,
    depth=st.integers(0, 50),
    priority=st.integers(-10, 10),
    session_id=st.none() | texts,
    deadline=st.none() | finite,
    budget=st.none() | st.dictionaries(texts, json_leaf, max_size=3),
)
envelopes = st.builds(
    Envelope,
    id=texts,
    kind=st.sampled_from(["send", "publish", "spawn"]),
    target=texts,
    sender=st.none() | texts,
    topic=st.none() | texts,
    reply_to=st.none() | texts,
    payload=block_lists.map(payload_from_blocks),
    run=st.none() | run_infos,
    attempt=st.integers(0, 1000),
    sent_at=finite,
    deadline=st.none() | finite,
    metadata=st.dictionaries(texts, texts, max_size=3),
)
replies = st.builds(
    Reply,
    id=texts,
    ok=st.booleans(),
    payload=st.none() | block_lists.map(payload_from_blocks),
    error=st.none() | st.just(BudgetExhaustedError("tokens", 10, 5).to_wire()),
    handled_by=st.none() | texts,
)


# --------------------------------------------------------------------------------------------------------
# Round trips


@given(envelopes)
def test_envelope_round_trips_with_its_headers(env: Envelope) -> None:
    data = encode_envelope(env)
    assert decode_envelope(data, make_headers(env)) == env
    assert decode_envelope_body(data) == env


@given(replies)
def test_reply_round_trips(reply: Reply) -> None:
    assert decode_reply(encode_reply(reply)) == reply


@given(block_lists)
def test_payload_round_trips_blocks(items: list[BaseBlock]) -> None:
    assert blocks_from_payload(payload_from_blocks(items)) == items


def test_v_is_always_written_and_defaults_are_omitted() -> None:
    env = _env()
    assert env.v == WIRE_VERSION
    assert encode_envelope(env) == (
        b'{"v":1,"id":"01JD3W6Q2V6C7X4N8B9M0P1R2S","kind":"send","target":"echo/k1",'
        b'"payload":[{"type":"text","metadata":{},"text":"hi"}],"sent_at":1700000000.5}'
    )
    assert encode_reply(Reply(id="m", ok=True)) == b'{"v":1,"id":"m","ok":true}'
    run = RunInfo(run_id="r", root_id="r")
    assert msgspec.json.encode(run) == b'{"run_id":"r","root_id":"r"}'


def test_reply_payload_null_or_absent_is_none() -> None:
    assert decode_reply(b'{"v":1,"id":"m","ok":true,"payload":null}').payload is None
    assert decode_reply(b'{"v":1,"id":"m","ok":true}').payload is None
    reply = decode_reply(b'{"v":1,"id":"m","ok":true,"payload":[]}')
    assert reply.payload is not None
    assert blocks_from_payload(reply.payload) == []


def test_a_reply_carries_a_kernel_error_back() -> None:
    error = BudgetExhaustedError("cost", 1.5, 1.0)
    reply = decode_reply(encode_reply(Reply(id="m", ok=False, error=error.to_wire(), handled_by="w1")))
    assert reply.error is not None
    assert KernelError.from_wire(reply.error) == error
    assert reply.handled_by == "w1"


def test_unknown_blocks_survive_decode_and_encode_unchanged() -> None:
    # A newer peer's block: odd key order and spacing, unknown type. Relaying the envelope must not touch it.
    payload = b'[ {"z": 1, "type": "x-hologram", "a": {"k": [1, "two"]}, "metadata": {"b": 1, "a": 2}} ]'
    data = _wire(_env_dict(payload=None)).replace(b'"payload":null', b'"payload": ' + payload)
    env = decode_envelope_body(data)
    assert bytes(env.payload) == payload.strip()
    assert payload.strip() in encode_envelope(env)
    [block] = blocks_from_payload(env.payload)
    assert isinstance(block, UnknownBlock)
    assert block.type == "x-hologram"
    compact = json.dumps(json.loads(payload), separators=(",", ":")).encode()
    assert bytes(payload_from_blocks([block])) == compact  # same keys, same order


def test_nested_blocks_survive() -> None:
    items: list[BaseBlock] = [
        ToolResultBlock(call_id="c1", content=[TextBlock(text="ok"), ImageBlock(data=b"\x89PNG")]),
    ]
    env = decode_envelope_body(encode_envelope(_env(payload=payload_from_blocks(items))))
    assert blocks_from_payload(env.payload) == items


def test_forward_compatibility_ignores_unknown_fields() -> None:
    wire = _env_dict(
        future_field={"anything": [1, 2]},
        run={"run_id": "r", "root_id": "r", "new_run_field": 3},
        attempt=2,
    )
    env = decode_envelope(_wire(wire), {HDR_VERSION: "1.4"})  # a newer minor version
    assert env.run == RunInfo(run_id="r", root_id="r")
    assert env.attempt == 2
    reply = decode_reply(b'{"v":1,"id":"m","ok":true,"cost":{"usd":1}}')
    assert reply == Reply(id="m", ok=True)


def test_keys_in_another_order_decode() -> None:
    # Another encoder may write `v` last; only the fast path assumes it comes first.
    wire = _env_dict()
    v = wire.pop("v")
    data = _wire({**wire, "v": v})
    assert decode_envelope_body(data) == _env()


# --------------------------------------------------------------------------------------------------------
# WireError reasons


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"", "not JSON"),
        (b"not json", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b'{"v":1,', "not JSON"),  # our head, then truncated
        (b'{"v":1,"id":"m"} trailing', "not JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b'"text"', "must be a JSON object, got str"),
        (b"null", "must be a JSON object, got NoneType"),
    ],
)
def test_garbage(data: bytes, detail: str) -> None:
    with pytest.raises(WireError, match=detail) as info:
        decode_envelope_body(data)
    assert info.value.reason == "garbage"
    with pytest.raises(WireError) as info:
        decode_reply(data)
    assert info.value.reason == "garbage"


def test_non_bytes_input_is_garbage() -> None:
    with pytest.raises(WireError, match="must be bytes, got str") as info:
        decode_envelope_body('{"v":1}')  # type: ignore[arg-type]
    assert info.value.reason == "garbage"


@pytest.mark.parametrize(
    ("v", "detail"),
    [
        (None, "has wire version None"),
        (2, "has wire version 2"),
        (0, "has wire version 0"),
        ("1", "has wire version '1'"),
        (True, "has wire version True"),
        (1.0, "has wire version 1.0"),
    ],
)
def test_version_mismatch(v: object, detail: str) -> None:
    for data in (_wire(_env_dict(v=v)), _wire({"id": MSG_ID, "v": v, "kind": "send"})):
        with pytest.raises(WireError, match=detail) as info:
            decode_envelope_body(data)
        assert info.value.reason == "version"


def test_missing_version() -> None:
    wire = _env_dict()
    del wire["v"]
    with pytest.raises(WireError, match="has no 'v'") as info:
        decode_envelope_body(_wire(wire))
    assert info.value.reason == "version"
    with pytest.raises(WireError, match="has no 'v'") as info:
        decode_reply(b'{"id":"m","ok":true}')
    assert info.value.reason == "version"


def test_a_future_major_with_another_schema_is_a_version_error_not_a_schema_error() -> None:
    for data in (b'{"v":2,"message":{"totally":"different"}}', b'{"message":{},"v":2}'):
        with pytest.raises(WireError) as info:
            decode_envelope_body(data)
        assert info.value.reason == "version"


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"id": None}, r"Expected `str`, got `null` - at `\$.id`"),
        ({"kind": "teleport"}, r"Invalid enum value 'teleport' - at `\$.kind`"),
        ({"payload": {"type": "text"}}, "payload must be a JSON array"),
        ({"payload": None}, "payload must be a JSON array"),
        ({"payload": "[]"}, "payload must be a JSON array"),
        ({"attempt": "2"}, r"at `\$.attempt`"),
        ({"metadata": {"k": 1}}, r"at `\$.metadata\[...\]`"),
        ({"run": {"root_id": "r"}}, r"missing required field `run_id` - at `\$.run`"),
        ({"sent_at": "now"}, r"at `\$.sent_at`"),
    ],
)
def test_schema_errors(change: dict[str, Any], detail: str) -> None:
    with pytest.raises(WireError, match=detail) as info:
        decode_envelope_body(_wire(_env_dict(**change)))
    assert info.value.reason == "schema"


def test_missing_required_field_is_a_schema_error() -> None:
    wire = _env_dict()
    del wire["target"]
    with pytest.raises(WireError, match="missing required field `target`") as info:
        decode_envelope_body(_wire(wire))
    assert info.value.reason == "schema"


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b'{"v":1,"id":"m"}', "missing required field `ok`"),
        (b'{"v":1,"id":"m","ok":"yes"}', r"at `\$.ok`"),
        (b'{"v":1,"id":"m","ok":true,"payload":{"a":1}}', "reply payload must be a JSON array"),
        (b'{"v":1,"id":"m","ok":true,"payload":"[]"}', "reply payload must be a JSON array"),
        (b'{"v":1,"id":"m","ok":false,"error":"boom"}', r"at `\$.error`"),
    ],
)
def test_reply_schema_errors(data: bytes, detail: str) -> None:
    with pytest.raises(WireError, match=detail) as info:
        decode_reply(data)
    assert info.value.reason == "schema"


def test_bad_blocks_in_a_payload_are_a_schema_error() -> None:
    with pytest.raises(WireError, match="payload blocks do not validate") as info:
        blocks_from_payload(msgspec.Raw(b'[{"type":"text"}]'))
    assert info.value.reason == "schema"


@pytest.mark.parametrize(
    ("headers", "reason", "detail"),
    [
        (None, "header", "Plexus-V header is missing"),
        ({}, "header", "Plexus-V header is missing"),
        ({HDR_MSG_ID: MSG_ID}, "header", "Plexus-V header is missing"),
        ({HDR_VERSION: "one"}, "header", "'one' is not a version number"),
        ({HDR_VERSION: ""}, "header", "is not a version number"),
        ({HDR_VERSION: "2"}, "version", "Plexus-V '2'"),
        ({HDR_VERSION: "2.0"}, "version", "Plexus-V '2.0'"),
        (
            {HDR_VERSION: "1", HDR_MSG_ID: "other"},
            "header",
            "Nats-Msg-Id 'other' differs from the envelope id",
        ),
    ],
)
def test_header_errors(headers: dict[str, str] | None, reason: str, detail: str) -> None:
    with pytest.raises(WireError, match=detail) as info:
        decode_envelope(encode_envelope(_env()), headers)
    assert info.value.reason == reason


def test_the_version_header_is_checked_before_the_body() -> None:
    with pytest.raises(WireError) as info:
        decode_envelope(b"garbage of a future version", {HDR_VERSION: "7"})
    assert info.value.reason == "version"


def test_wire_error_is_a_value_error_and_pickles() -> None:
    err = WireError("schema", "bad field")
    assert isinstance(err, ValueError)
    assert str(err) == "schema: bad field"
    again = pickle.loads(pickle.dumps(err))
    assert (again.reason, again.detail, str(again)) == ("schema", "bad field", "schema: bad field")


# --------------------------------------------------------------------------------------------------------
# Encoding guards


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"sent_at": float("nan")}, "sent_at must be a finite number"),
        ({"deadline": float("inf")}, "deadline must be a finite number"),
        ({"run": RunInfo(run_id="r", root_id="r", deadline=float("-inf"))}, "run.deadline must be a finite"),
        ({"kind": "teleport"}, "envelope kind must be one of"),
        ({"v": 2}, "writes wire version 1, not 2"),
    ],
)
def test_encode_refuses_what_the_wire_cannot_carry(change: dict[str, Any], detail: str) -> None:
    with pytest.raises(ValueError, match=detail):
        encode_envelope(_env(**change))


def test_encode_reply_refuses_another_version() -> None:
    with pytest.raises(ValueError, match="writes wire version 1, not 3"):
        encode_reply(Reply(v=3, id="m", ok=True))


# --------------------------------------------------------------------------------------------------------
# Headers


def test_make_headers() -> None:
    env = _env()
    assert make_headers(env) == {HDR_MSG_ID: MSG_ID, HDR_VERSION: "1"}
    extra = {"traceparent": "00-abc-def-01", HDR_MSG_ID: MSG_ID}
    assert make_headers(env, extra) == {"traceparent": "00-abc-def-01", HDR_MSG_ID: MSG_ID, HDR_VERSION: "1"}


@pytest.mark.parametrize(
    ("extra", "detail"),
    [
        ({HDR_MSG_ID: "other"}, "contradicts the envelope's"),
        ({HDR_VERSION: "2"}, "contradicts the envelope's"),
        ({"x-note": "a\r\nInjected: 1"}, "without CR/LF"),
        ({"x-note": 5}, "without CR/LF"),
        ({"bad name": "v"}, "invalid header name"),
        ({"bad:name": "v"}, "invalid header name"),
        ({"": "v"}, "invalid header name"),
    ],
)
def test_make_headers_rejects_bad_extras(extra: dict[str, Any], detail: str) -> None:
    with pytest.raises(ValueError, match=detail):
        make_headers(_env(), extra)


def test_trace_context_passes_through() -> None:
    span = NonRecordingSpan(
        SpanContext(
            trace_id=0x1234, span_id=0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
    )
    carrier: dict[str, str] = {}
    inject(carrier, context=set_span_in_context(span))
    assert "traceparent" in carrier
    incoming = make_headers(_env(), carrier)
    assert trace_headers(incoming) == carrier
    assert trace_headers({"TraceParent": "x", "other": "y", "tracestate": "s"}) == {
        "traceparent": "x",
        "tracestate": "s",
    }
    assert trace_headers(None) == {}


# --------------------------------------------------------------------------------------------------------
# Against a real nats-server


async def test_headers_survive_jetstream_and_dedupe_on_the_message_id(nats_server: NatsServer) -> None:
    env = _env(run=RunInfo(run_id="r", root_id="r"), metadata={"k": "v"})
    data = encode_envelope(env)
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="T", subjects=["t.>"])
        first = await js.publish("t.a", data, headers=make_headers(env, {"traceparent": "00-x-y-01"}))
        again = await js.publish("t.a", data, headers=make_headers(env))
        assert again.duplicate
        assert again.seq == first.seq
        sub = await js.pull_subscribe("t.a", durable="c", stream="T")
        [msg] = await sub.fetch(1, timeout=5)
        assert decode_envelope(msg.data, msg.headers) == env
        assert trace_headers(msg.headers) == {"traceparent": "00-x-y-01"}
        await msg.ack()

        # A message that arrives without headers at all is refused with reason "header".
        await nc.publish("t.b", data)
        [bare] = await (await js.pull_subscribe("t.b", durable="d", stream="T")).fetch(1, timeout=5)
        assert bare.headers is None
        with pytest.raises(WireError) as info:
            decode_envelope(bare.data, bare.headers)
        assert info.value.reason == "header"
    finally:
        await nc.close()
