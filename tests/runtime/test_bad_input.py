"""End to end against a real nats-server: bad input is dead-lettered, the worker keeps serving and callers get
typed errors; unknown blocks survive a hop; handler failures, missing hosts and oversized payloads surface as
the right `KernelError`; large media travel as artifact handles."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from plexus.core import (
    AgentId,
    AgentNotFoundError,
    BaseBlock,
    BudgetExhaustedError,
    HandlerError,
    ImageBlock,
    MessageId,
    ProtocolError,
    ReplyTimeoutError,
    RunId,
    RunMessageReceived,
    TextBlock,
    UnknownBlock,
    content_blocks_to_json,
)
from plexus.runtime import Interceptor, NatsServer, PayloadTooLargeError, Runtime, SendInput
from plexus.runtime.store._artifacts import is_artifact_id
from plexus.runtime.wire._envelope import Envelope, RunInfo, decode_reply, encode_envelope

from .apps_misc import (
    DEADLINE,
    Served,
    acked,
    arrived_on_key,
    dead_letters,
    envelope,
    good_headers,
    reply_error,
    send_raw,
    serving,
)
from .conftest import WorkerProcess

PING: list[BaseBlock] = [TextBlock(text="ping")]

#: Tests on the module's shared server and worker run on the module's event loop.
shared = pytest.mark.asyncio(loop_scope="module")

# --------------------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """One server and worker for the module: starting them per test costs ~2 s each."""
    async with serving(tmp_path_factory.mktemp("nats")) as served:
        yield served


@pytest.fixture
def key() -> str:
    """A key of its own per test, so tests on the shared server never see each other's messages."""
    return f"k-{uuid.uuid4().hex[:12]}"


def as_dict(env: Envelope) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.json.decode(encode_envelope(env))
    return out


def raw(obj: object) -> bytes:
    return msgspec.json.encode(obj)


# --------------------------------------------------------------------------------------------------------
# Undecodable messages: (id, expected reason, make(target) -> (body, headers))

Make = Callable[[str], tuple[bytes, Mapping[str, str] | None]]


def _valid(target: str) -> tuple[Envelope, bytes]:
    env = envelope(target)
    return env, encode_envelope(env)


def _garbage(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    return b"\x00\xff\xfe not json at all", {"Plexus-V": "1"}


def _not_object(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    return b"[1, 2, 3]", {"Plexus-V": "1"}


def _version_header(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    env, data = _valid(target)
    return data, {"Plexus-V": "2", "Nats-Msg-Id": env.id}


def _version_body(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    env, _ = _valid(target)
    return raw({**as_dict(env), "v": 2}), good_headers(env)


def _version_missing(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    env, _ = _valid(target)
    return raw({k: v for k, v in as_dict(env).items() if k != "v"}), good_headers(env)


def _schema_missing(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    return raw({"v": 1, "id": "x"}), {"Plexus-V": "1"}


def _schema_payload(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    env, _ = _valid(target)
    return raw({**as_dict(env), "payload": {"type": "text", "text": "not a list"}}), good_headers(env)


def _header_missing(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    return _valid(target)[1], None


def _header_not_a_version(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    env, data = _valid(target)
    return data, {"Plexus-V": "one", "Nats-Msg-Id": env.id}


def _header_msg_id(target: str) -> tuple[bytes, Mapping[str, str] | None]:
    return _valid(target)[1], {"Plexus-V": "1", "Nats-Msg-Id": "some-other-id"}


UNDECODABLE: list[tuple[str, str, Make]] = [
    ("garbage-bytes", "garbage", _garbage),
    ("garbage-array", "garbage", _not_object),
    ("version-header", "version", _version_header),
    ("version-body", "version", _version_body),
    ("version-missing", "version", _version_missing),
    ("schema-missing-fields", "schema", _schema_missing),
    ("schema-payload-object", "schema", _schema_payload),
    ("header-missing", "header", _header_missing),
    ("header-not-a-version", "header", _header_not_a_version),
    ("header-msg-id-mismatch", "header", _header_msg_id),
]
undecodable = pytest.mark.parametrize(
    ("reason", "make"), [c[1:] for c in UNDECODABLE], ids=[c[0] for c in UNDECODABLE]
)


@shared
@undecodable
async def test_undecodable_durable_message_is_dead_lettered_acked_and_worker_survives(
    served: Served, key: str, reason: str, make: Make
) -> None:
    rt = served.rt
    data, headers = make(f"echo/{key}")
    async with dead_letters(rt) as dlq:
        ack = await rt.js.publish(
            rt.subjects.inbox("echo", key), data, headers=dict(headers) if headers is not None else None
        )
        dead = await dlq.expect(arrived_on_key(key))
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == reason
    assert dead.headers["Plexus-Dlq-Worker"] == served.worker.worker_id
    assert dead.headers["Plexus-Dlq-Detail"]
    # Operators get the stored (partition-transformed) subject and the original bytes.
    assert ".inp.echo." in dead.headers["Plexus-Dlq-Subject"]
    assert dead.data == data
    assert dead.subject == rt.subjects.dlq("_invalid")

    # Acknowledged, so never redelivered; and the worker still serves the same agent.
    await acked(rt, ack.seq)
    assert await rt.send_message(PING, AgentId("echo", key), timeout=DEADLINE) == PING


@shared
@undecodable
async def test_undecodable_ephemeral_request_is_dead_lettered_and_answered_with_protocol_error(
    served: Served, key: str, reason: str, make: Make
) -> None:
    rt = served.rt
    data, headers = make(f"echo-eph/{key}")
    subject = rt.subjects.ephemeral("echo-eph", key)
    async with dead_letters(rt) as dlq:
        # A core request names its reply address outside the body, so even garbage gets a typed answer.
        msg = await rt.nc.request(
            subject, data, timeout=DEADLINE, headers=dict(headers) if headers is not None else None
        )
        dead = await dlq.expect(arrived_on_key(key))
    error = reply_error(msg)
    assert type(error) is ProtocolError
    assert f"({reason})" in str(error)

    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == reason
    assert dead.headers["Plexus-Dlq-Subject"] == subject
    assert dead.data == data
    assert await rt.send_message(PING, AgentId("echo-eph", key), timeout=DEADLINE) == PING


# --------------------------------------------------------------------------------------------------------
# Decodable envelopes the worker must refuse: they name a reply address, so the caller gets a typed error


@shared
@pytest.mark.parametrize(
    ("target", "dlq_type"),
    [("ghost/{key}", "ghost"), ("elsewhere/{host}/{key}", "{host}")],
    ids=["unknown-type", "other-namespace"],
)
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "ephemeral"])
async def test_envelope_for_unregistered_type_gets_agent_not_found(
    served: Served, key: str, target: str, dlq_type: str, durable: bool
) -> None:
    rt = served.rt
    host = "echo" if durable else "echo-eph"
    target = target.format(key=key, host=host)
    env = envelope(target, reply_to=rt.nc.new_inbox())
    async with dead_letters(rt) as dlq:
        msg, seq = await send_raw(rt, env, durable=durable, host=host, key=key)
        dead = await dlq.expect(arrived_on_key(key))

    error = reply_error(msg)
    assert type(error) is AgentNotFoundError
    assert error.agent_id == target
    assert decode_reply(msg.data).id == env.id
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == "unregistered"
    assert dead.subject == rt.subjects.dlq(dlq_type.format(host=host))
    assert msgspec.json.decode(dead.data)["id"] == env.id
    if seq is not None:
        await acked(rt, seq)
    assert await rt.send_message(PING, AgentId(host, key), timeout=DEADLINE) == PING


BAD_TARGETS = [
    ("no-slash", "no-slash-here", "_invalid"),
    ("bad-type", "bad type!/{key}", "bad type!"),
    # A type too long for any subject must still be dead-lettered (and acked), not retried forever.
    ("huge-type", "t" * 5000 + "/{key}", "_invalid"),
    # Targets that disagree with the subject they came on: the agent would run in another key's partition.
    ("other-key", "{host}/other-{key}", "{host}"),
    ("other-type", "{other}/{key}", "{other}"),
]


@shared
@pytest.mark.parametrize(
    ("target", "dlq_type"), [c[1:] for c in BAD_TARGETS], ids=[c[0] for c in BAD_TARGETS]
)
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "ephemeral"])
async def test_envelope_with_bad_target_is_rejected_with_protocol_error(
    served: Served, key: str, target: str, dlq_type: str, durable: bool
) -> None:
    rt = served.rt
    names = {
        "key": key,
        "host": "echo" if durable else "echo-eph",
        "other": "keys" if durable else "keys-eph",
    }
    env = envelope(target.format(**names), reply_to=rt.nc.new_inbox())
    async with dead_letters(rt) as dlq:
        msg, seq = await send_raw(rt, env, durable=durable, host=names["host"], key=key)
        dead = await dlq.expect(arrived_on_key(key))

    error = reply_error(msg)
    assert type(error) is ProtocolError
    assert "(target)" in str(error)
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == "target"
    assert dead.subject == rt.subjects.dlq(dlq_type.format(**names))
    if seq is not None:
        await acked(rt, seq)
    assert await rt.send_message(PING, AgentId(names["host"], key), timeout=DEADLINE) == PING


def _run(**fields: str) -> RunInfo:
    run_id = str(RunId.new())
    return RunInfo(**{"run_id": run_id, "root_id": run_id, **fields})  # type: ignore[arg-type]


# Ids that decode (they are plain strings on the wire) but cannot become the typed ids of EventLog entries.
BAD_IDS: list[tuple[str, dict[str, Any]]] = [
    ("id-with-space", {"id": "has space"}),
    ("id-is-a-run-id", {"id": str(RunId.new())}),
    ("id-too-long", {"id": "m" * 300}),
    ("sender-no-slash", {"sender": "no-slash"}),
    ("sender-bad-type", {"sender": "bad type/k"}),
    ("run-id-is-a-message-id", {"run": _run(run_id=str(MessageId.new()))}),
    ("root-id-control-char", {"run": _run(root_id="root\x01")}),
]


@shared
@pytest.mark.parametrize("fields", [c[1] for c in BAD_IDS], ids=[c[0] for c in BAD_IDS])
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "ephemeral"])
async def test_envelope_with_unusable_ids_is_dead_lettered_not_redelivered_forever(
    served: Served, key: str, fields: dict[str, Any], durable: bool
) -> None:
    rt = served.rt
    host = "echo" if durable else "echo-eph"
    env = msgspec.structs.replace(envelope(f"{host}/{key}", reply_to=rt.nc.new_inbox()), **fields)
    async with dead_letters(rt) as dlq:
        msg, seq = await send_raw(rt, env, durable=durable, host=host, key=key)
        dead = await dlq.expect(arrived_on_key(key))
    error = reply_error(msg)
    assert type(error) is ProtocolError
    assert "(schema)" in str(error)
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == "schema"
    if seq is not None:
        await acked(rt, seq)
    assert await rt.send_message(PING, AgentId(host, key), timeout=DEADLINE) == PING


@shared
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "ephemeral"])
async def test_envelope_without_run_is_handled_as_a_root_run(served: Served, key: str, durable: bool) -> None:
    """`run` is optional on the wire (foreign senders); the commit must not choke on its absence."""
    rt = served.rt
    host = "echo" if durable else "echo-eph"
    env = envelope(f"{host}/{key}", reply_to=rt.nc.new_inbox())
    assert env.run is None
    msg, seq = await send_raw(rt, env, durable=durable, host=host, key=key)
    reply = decode_reply(msg.data)
    assert reply.ok
    assert reply.payload is not None
    assert bytes(reply.payload) == bytes(env.payload)
    if seq is not None:
        await acked(rt, seq)
        records = await rt.event_log(AgentId(host, key)).read()
        assert isinstance(records[0].entry, RunMessageReceived)
        assert records[0].entry.message_id == env.id
        assert RunId(records[0].entry.run_id).ulid is not None  # a minted root run, not the message id


@shared
async def test_dead_letter_of_a_message_near_max_payload_is_truncated_not_fatal(
    served: Served, key: str
) -> None:
    """The DLQ copy adds headers; a body that filled max_payload must not get the worker disconnected."""
    rt = served.rt
    limit = rt.nc.max_payload
    data = b"\x00" * (limit - 200)  # garbage that just fits with its own small header
    async with dead_letters(rt) as dlq:
        ack = await rt.js.publish(rt.subjects.inbox("echo", key), data, headers={"Plexus-V": "1"})
        dead = await dlq.expect(arrived_on_key(key))
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == "garbage"
    assert dead.headers["Plexus-Dlq-Size"] == str(len(data))
    assert len(dead.data) < len(data)
    assert data.startswith(dead.data)
    await acked(rt, ack.seq)
    assert served.worker.rt.nc.is_connected
    assert await rt.send_message(PING, AgentId("echo", key), timeout=DEADLINE) == PING


# --------------------------------------------------------------------------------------------------------
# Unknown block types are not bad input: they survive a hop unchanged

HOLOGRAM = b'{"type":"hologram","x":1,"nested":{"b":[1,2.5,null,"\xe2\x98\x83"]},"metadata":{"z":1,"a":"2"}}'


@shared
@pytest.mark.parametrize("agent_type", ["echo", "echo-eph"])
async def test_unknown_block_survives_a_hop_through_send_message(
    served: Served, key: str, agent_type: str
) -> None:
    block = UnknownBlock.from_dict(msgspec.json.decode(HOLOGRAM))
    sent: list[BaseBlock] = [TextBlock(text="before"), block]
    reply = await served.rt.send_message(sent, AgentId(agent_type, key), timeout=DEADLINE)
    assert len(reply) == 2
    assert isinstance(reply[1], UnknownBlock)
    assert reply[1].raw == block.raw
    assert content_blocks_to_json(reply) == content_blocks_to_json(sent)
    assert content_blocks_to_json([reply[1]]) == b"[" + HOLOGRAM + b"]"


@shared
async def test_unknown_block_payload_bytes_are_relayed_verbatim(served: Served, key: str) -> None:
    rt = served.rt
    payload = b"[" + HOLOGRAM + b"]"
    env = msgspec.structs.replace(
        envelope(f"echo/{key}", reply_to=rt.nc.new_inbox()), payload=msgspec.Raw(payload)
    )
    msg, _ = await send_raw(rt, env, durable=True, host="echo", key=key)
    reply = decode_reply(msg.data)
    assert reply.ok
    assert reply.payload is not None
    assert bytes(reply.payload) == payload


# --------------------------------------------------------------------------------------------------------
# Missing hosts


@shared
async def test_send_to_type_nobody_hosts_fails_with_agent_not_found_by_the_deadline(served: Served) -> None:
    for agent_type in ("nobody-home", "nobody-else"):
        with pytest.raises(AgentNotFoundError) as info:
            async with asyncio.timeout(DEADLINE):  # a hang fails here instead of passing late
                await served.rt.send_message(PING, AgentId(agent_type, "k"), timeout=1)
        assert type(info.value) is AgentNotFoundError
        assert info.value.agent_id == f"{agent_type}/k"


# On the module's loop too, with a Runtime of its own: pausing that loop for longer than a lease TTL (as a
# function-loop test would) makes the shared worker lose its leases in the middle of the file.
@shared
async def test_send_after_host_died_and_heartbeat_expired_fails_with_agent_not_found(
    nats_server: NatsServer, worker_process: WorkerProcess
) -> None:
    rt = await Runtime.connect(nats_server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
    try:
        proc = worker_process("tests.runtime.apps_misc:app", "--heartbeat-ttl", "3")
        await rt.get("echo", lazy=False, timeout=30)
        await rt.get("echo-eph", lazy=False, timeout=30)
        assert await rt.send_message(PING, AgentId("echo", "k"), timeout=DEADLINE) == PING
        assert await rt.send_message(PING, AgentId("echo-eph", "k"), timeout=DEADLINE) == PING

        os.kill(proc.pid, signal.SIGKILL)  # no graceful deregistration: only the heartbeat TTL tells
        proc.wait(timeout=DEADLINE)
        for agent_type in ("echo", "echo-eph"):
            error = await _until_not_found(rt, AgentId(agent_type, "k"), rt.registry.ttl_s + DEADLINE)
            assert type(error) is AgentNotFoundError
            assert error.agent_id == f"{agent_type}/k"
    finally:
        await rt.close()


async def _until_not_found(rt: Runtime, agent_id: AgentId, timeout: float) -> AgentNotFoundError:
    """Send until the dead host's heartbeat has expired: until then a send may be published and time out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with asyncio.timeout(DEADLINE):  # each attempt ends by its own deadline, never hangs
                await rt.send_message(PING, agent_id, timeout=1)
        except AgentNotFoundError as exc:
            return exc
        except ReplyTimeoutError:
            assert time.monotonic() < deadline, f"{agent_id} still looks hosted long after its worker died"
        else:
            pytest.fail(f"{agent_id} answered although its only worker was killed")


# --------------------------------------------------------------------------------------------------------
# Handler failures travel as typed errors


@shared
@pytest.mark.parametrize("agent_type", ["fail", "fail-eph"])
async def test_handler_value_error_becomes_handler_error(served: Served, key: str, agent_type: str) -> None:
    rt = served.rt
    with pytest.raises(HandlerError) as info:
        await rt.send_message([TextBlock(text="value")], AgentId(agent_type, key), timeout=DEADLINE)
    assert type(info.value) is HandlerError
    assert info.value.cause_type == "ValueError"
    assert info.value.cause == "bad value 42"
    assert info.value.agent_id == f"{agent_type}/{key}"
    # The failure did not poison the agent: its next message is handled.
    fine = await rt.send_message([TextBlock(text="ok")], AgentId(agent_type, key), timeout=DEADLINE)
    assert fine == [TextBlock(text="fine")]


@shared
@pytest.mark.parametrize("agent_type", ["fail", "fail-eph"])
async def test_handler_kernel_error_is_reraised_as_the_same_class(
    served: Served, key: str, agent_type: str
) -> None:
    with pytest.raises(BudgetExhaustedError) as info:
        await served.rt.send_message([TextBlock(text="budget")], AgentId(agent_type, key), timeout=DEADLINE)
    assert type(info.value) is BudgetExhaustedError
    assert (info.value.dimension, info.value.used, info.value.limit) == ("tokens", 5, 4)
    assert str(info.value) == "Token budget exceeded: 5 > 4"


# --------------------------------------------------------------------------------------------------------
# Payload size and artifacts


@shared
@pytest.mark.parametrize("agent_type", ["echo", "echo-eph"])
async def test_oversized_payload_raises_payload_too_large_and_connection_survives(
    served: Served, key: str, agent_type: str
) -> None:
    rt = served.rt
    limit = rt.nc.max_payload
    with pytest.raises(PayloadTooLargeError) as info:
        await rt.send_message([TextBlock(text="x" * (2 * limit))], AgentId(agent_type, key), timeout=DEADLINE)
    assert info.value.limit == limit
    assert info.value.size > 2 * limit
    assert rt.nc.is_connected
    assert await rt.send_message(PING, AgentId(agent_type, key), timeout=DEADLINE) == PING


class _PadHeaders(Interceptor):
    """Adds a 4 KB header, so a body just under max_payload plus its headers is over it."""

    async def send(self, inp: SendInput, call_next: Any) -> list[BaseBlock]:
        inp.headers["X-Pad"] = "p" * 4000
        result: list[BaseBlock] = await call_next(inp)
        return result


@shared
@pytest.mark.parametrize("agent_type", ["echo", "echo-eph"])
async def test_headers_count_towards_max_payload(served: Served, key: str, agent_type: str) -> None:
    padded = await Runtime.connect(served.server.url, interceptors=[_PadHeaders()], heartbeat_ttl_s=3.0)
    try:
        limit = padded.nc.max_payload
        near = TextBlock(text="x" * (limit - 2000))  # body ≈ limit - 1.7 KB
        with pytest.raises(PayloadTooLargeError):
            await padded.send_message([near], AgentId(agent_type, key), timeout=DEADLINE)
        # Sent anyway, it would have made the server close the connection.
        assert padded.nc.is_connected
        assert await padded.send_message(PING, AgentId(agent_type, key), timeout=DEADLINE) == PING
    finally:
        await padded.close()


@shared
@pytest.mark.parametrize("agent_type", ["inflate", "inflate-eph"])
async def test_reply_too_large_for_the_wire_fails_typed_instead_of_timing_out(
    served: Served, key: str, agent_type: str
) -> None:
    rt = served.rt
    limit = rt.nc.max_payload
    with pytest.raises(PayloadTooLargeError) as info:
        await rt.send_message([TextBlock(text=str(limit + 10))], AgentId(agent_type, key), timeout=DEADLINE)
    assert info.value.limit == limit
    # The agent keeps working (the failed reply did not poison its checkpoint or its message).
    assert await rt.send_message([TextBlock(text="3")], AgentId(agent_type, key), timeout=DEADLINE) == [
        TextBlock(text="iii")
    ]


@shared
async def test_many_large_replies_to_one_key_keep_working(served: Served, key: str) -> None:
    """Replies remembered for redelivery must not grow the checkpoint past what the KV bucket accepts."""
    rt = served.rt
    size = rt.nc.max_payload // 8
    for _ in range(12):
        reply = await rt.send_message([TextBlock(text=str(size))], AgentId("inflate", key), timeout=DEADLINE)
        assert reply == [TextBlock(text="i" * size)]


def _png(size: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + bytes((i * 7 + i // 251) % 256 for i in range(size - 8))


@shared
@pytest.mark.parametrize("agent_type", ["echo", "echo-eph"])
async def test_large_image_travels_as_artifact_handle_and_round_trips(
    served: Served, key: str, agent_type: str
) -> None:
    rt = served.rt
    data = _png(200 * 1024)
    image = ImageBlock(data=data, alt="big")
    assert image.mime_type == "image/png"
    durable = agent_type == "echo"
    subject = rt.subjects.inbox(agent_type, key) if durable else rt.subjects.ephemeral(agent_type, key)
    spy = await rt.nc.subscribe(subject)  # core subscribers see what was published on the subject
    try:
        reply = await rt.send_message([image], AgentId(agent_type, key), timeout=DEADLINE)
        wire = await spy.next_msg(timeout=DEADLINE)
    finally:
        await spy.unsubscribe()

    assert len(wire.data) < 4096, "the envelope must carry a handle, not 200 KB of base64"
    sent = msgspec.json.decode(wire.data)["payload"][0]
    assert sent.get("data") is None
    assert is_artifact_id(sent["file_id"])

    # The reply travels as a handle too; the caller resolves it on demand.
    [handle] = reply
    assert isinstance(handle, ImageBlock)
    assert handle.data is None
    assert handle.file_id == sent["file_id"]
    [resolved] = await rt.artifacts.resolve(reply)
    assert isinstance(resolved, ImageBlock)
    assert resolved.data == data
    assert resolved.file_id is None
    assert resolved.mime_type == "image/png"
    assert resolved.alt == "big"
