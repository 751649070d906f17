"""Regression tests for issue 9's bad-input defects (items 1, 2, 4 and 7), each with the exact input that
disabled or misled a worker before its fix, against a real nats-server and an in-process worker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, MessageId, ProtocolError, RunId, TextBlock
from plexus.runtime.client._supervisor import child_run_id
from plexus.runtime.wire._envelope import Envelope, encode_envelope

from .apps_misc import (
    DEADLINE,
    Served,
    acked,
    arrived_on_key,
    dead_letters,
    envelope,
    good_headers,
    reply_error,
    serving,
)

PING: list[BaseBlock] = [TextBlock(text="ping")]

shared = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    async with serving(tmp_path_factory.mktemp("nats")) as served:
        yield served


@pytest.fixture
def key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


def _body_with(env: Envelope, **fields: object) -> bytes:
    obj = msgspec.json.decode(encode_envelope(env))
    obj.update(fields)
    return msgspec.json.encode(obj)


async def _still_serving(served: Served, key: str) -> None:
    """The worker's connection is open and it answers both kinds of agent."""
    assert not served.worker.rt.nc.is_closed
    assert await served.rt.send_message(PING, AgentId("echo", key), timeout=DEADLINE) == PING
    assert await served.rt.send_message(PING, AgentId("echo-eph", key), timeout=DEADLINE) == PING


# --------------------------------------------------------------------------------------------------------
# Items 1 and 7: reply addresses are validated at intake, and a reply only ever goes to a reply subject

BAD_REPLY_TO = [
    # Item 1: published unchecked, the server answered "maximum control line exceeded" and nats-py closed the
    # worker's connection for good.
    ("5000-chars", "_INBOX." + "x" * 5000),
    # Item 7: the reply was appended to the victim's EventLog, fencing its next message and corrupting it.
    ("other-agents-evlog", "px.default.evlog.echo.{victim}"),
    ("wildcard", "_INBOX.*"),
    ("full-wildcard", "_INBOX.>"),
    ("space", "_INBOX.a b"),
    ("empty-token", "_INBOX..x"),
    ("not-an-inbox", "px.default.in.echo.{victim}"),
]


@shared
@pytest.mark.parametrize("reply_to", [c[1] for c in BAD_REPLY_TO], ids=[c[0] for c in BAD_REPLY_TO])
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "ephemeral"])
async def test_bad_reply_address_is_dead_lettered_and_worker_keeps_its_connection(
    served: Served, key: str, reply_to: str, durable: bool
) -> None:
    rt = served.rt
    victim = f"victim-{key}"
    # The victim has history: a reply written into its log would fence its next commit.
    assert await rt.send_message(PING, AgentId("echo", victim), timeout=DEADLINE) == PING
    before = await rt.event_log(AgentId("echo", victim)).read()

    host = "echo" if durable else "echo-eph"
    env = envelope(f"{host}/{key}", reply_to=reply_to.format(victim=victim))
    async with dead_letters(rt) as dlq:
        if durable:
            ack = await rt.js.publish(
                rt.subjects.inbox(host, key), encode_envelope(env), headers=good_headers(env)
            )
        else:
            await rt.nc.publish(
                rt.subjects.ephemeral(host, key), encode_envelope(env), headers=good_headers(env)
            )
        dead = await dlq.expect(arrived_on_key(key))
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == "reply_to"
    if durable:
        await acked(rt, ack.seq)

    await _still_serving(served, key)
    # The victim's log holds only its own entries and still reads; its next message is not fenced.
    assert await rt.event_log(AgentId("echo", victim)).read() == before
    assert await rt.send_message(PING, AgentId("echo", victim), timeout=DEADLINE) == PING


@shared
async def test_core_request_from_a_state_subject_is_not_answered(served: Served, key: str) -> None:
    """Item 7 for core requests: the reply subject of an ephemeral request is checked like `reply_to`."""
    rt = served.rt
    victim = f"victim-{key}"
    assert await rt.send_message(PING, AgentId("echo", victim), timeout=DEADLINE) == PING
    before = await rt.event_log(AgentId("echo", victim)).read()
    env = envelope(f"echo-eph/{key}")
    async with dead_letters(rt) as dlq:
        await rt.nc.publish(
            rt.subjects.ephemeral("echo-eph", key),
            encode_envelope(env),
            reply=rt.subjects.evlog("echo", victim),
            headers=good_headers(env),
        )
        dead = await dlq.expect(arrived_on_key(key))
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == "reply_to"
    assert await rt.event_log(AgentId("echo", victim)).read() == before
    await _still_serving(served, key)


# --------------------------------------------------------------------------------------------------------
# Item 2: decode errors that escaped the wire-error path (the durable slot leaked, the caller timed out)


def _deep_payload(env: Envelope) -> tuple[bytes, dict[str, str]]:
    nested = b"[" * 5000 + b"]" * 5000
    body = encode_envelope(env)
    start = body.index(b'"payload":') + len(b'"payload":')
    end = body.index(b"]", start) + 1
    return body[:start] + b"[" + nested + b"]" + body[end:], good_headers(env)


def _deep_body(env: Envelope) -> tuple[bytes, dict[str, str]]:
    return b'{"v":1,"x":' + b"[" * 5000 + b"]" * 5000 + b"}", good_headers(env)


def _bad_utf8(env: Envelope) -> tuple[bytes, dict[str, str]]:
    body = encode_envelope(env).replace(b'"ping"', b'"\xff\xfe\xfd"')
    assert b"\xff" in body
    return body, good_headers(env)


def _bad_utf8_target(env: Envelope) -> tuple[bytes, dict[str, str]]:
    body = encode_envelope(env).replace(b'"target":"', b'"target":"\xc3\x28', 1)
    assert b"\xc3\x28" in body
    return body, good_headers(env)


def _huge_version(env: Envelope) -> tuple[bytes, dict[str, str]]:
    return encode_envelope(env), {**good_headers(env), "Plexus-V": "1" * 5000}


DECODE_ERRORS = [
    ("nested-5000-payload", _deep_payload),
    ("nested-5000-body", _deep_body),
    ("invalid-utf8-in-string", _bad_utf8),
    ("invalid-utf8-in-target", _bad_utf8_target),
    ("plexus-v-5000-digits", _huge_version),
]


@shared
@pytest.mark.parametrize("make", [c[1] for c in DECODE_ERRORS], ids=[c[0] for c in DECODE_ERRORS])
async def test_decode_errors_on_the_durable_path_are_dead_lettered_and_acked(
    served: Served, key: str, make: object
) -> None:
    rt = served.rt
    env = envelope(f"echo/{key}")
    data, headers = make(env)  # type: ignore[operator]
    async with dead_letters(rt) as dlq:
        ack = await rt.js.publish(rt.subjects.inbox("echo", key), data, headers=headers)
        dead = await dlq.expect(arrived_on_key(key))
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] in ("garbage", "schema", "header")
    await acked(rt, ack.seq)
    await _still_serving(served, key)


@shared
async def test_more_undecodable_messages_than_handler_slots_do_not_stall_the_worker(
    served: Served, key: str
) -> None:
    """Each such message used to leak one of the worker's 4 x concurrency handler slots (256 here) and stay
    unacked: about 300 stopped the worker pulling. 320 now leave it serving, every one acked."""
    rt = served.rt
    slots = 4 * served.worker.config.concurrency
    seqs = []
    async with dead_letters(rt) as dlq:
        for i in range(slots + 64):
            env = envelope(f"echo/{key}")
            data, headers = DECODE_ERRORS[i % len(DECODE_ERRORS)][1](env)
            seqs.append((await rt.js.publish(rt.subjects.inbox("echo", key), data, headers=headers)).seq)
        for _ in seqs:
            await dlq.expect(arrived_on_key(key))
    for seq in seqs:
        await acked(rt, seq)
    await _still_serving(served, key)


@shared
@pytest.mark.parametrize("make", [c[1] for c in DECODE_ERRORS], ids=[c[0] for c in DECODE_ERRORS])
async def test_decode_errors_on_the_ephemeral_path_get_protocol_error(
    served: Served, key: str, make: object
) -> None:
    rt = served.rt
    env = envelope(f"echo-eph/{key}")
    data, headers = make(env)  # type: ignore[operator]
    msg = await rt.nc.request(rt.subjects.ephemeral("echo-eph", key), data, timeout=DEADLINE, headers=headers)
    assert type(reply_error(msg)) is ProtocolError
    await _still_serving(served, key)


@shared
@pytest.mark.parametrize(
    "data",
    [
        b'{"root_id":' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"root_id":"\xff\xfe","run_id":"x","paused":true,"reason":"r"}',
        b'{"root_id":"r","run_id":"x","reason":"r","error":{"error_type":""}}',
        b'{"root_id":"r","run_id":"x","reason":"r","error":{"error_type":"BudgetExhaustedError","fields":{"dimension":5}}}',
    ],
    ids=["nested", "invalid-utf8", "empty-error-type", "unbuildable-error"],
)
async def test_control_notice_decoders_treat_any_exception_as_bad_input(served: Served, data: bytes) -> None:
    """Item 2 (pause/cancel notices): these raised out of the subscription callback with a traceback."""
    worker = served.worker
    msg = Msg(worker.rt.nc, subject="px.default.ctl.pause.r", data=data)
    await worker._run_control.on_pause_notice(msg)  # raised before the fix
    await worker._run_control.on_cancel_notice(msg)
    await _still_serving(served, f"k-{uuid.uuid4().hex[:12]}")


# --------------------------------------------------------------------------------------------------------
# Item 4: a valid envelope carrying a `Status` header was taken for a server status line by the pull fetch


@shared
@pytest.mark.parametrize("status", ["404", "408", "409", "100", "503"])
async def test_message_with_a_status_header_is_handled_and_acked(
    served: Served, key: str, status: str
) -> None:
    rt = served.rt
    env = envelope(f"echo/{key}", reply_to=rt.nc.new_inbox())
    assert env.reply_to is not None
    sub = await rt.nc.subscribe(env.reply_to)
    try:
        headers = {**good_headers(env), "Status": status, "Description": "No Messages"}
        ack = await rt.js.publish(rt.subjects.inbox("echo", key), encode_envelope(env), headers=headers)
        reply: Msg = await sub.next_msg(timeout=DEADLINE)
    finally:
        await sub.unsubscribe()
    assert msgspec.json.decode(reply.data)["ok"] is True
    await acked(rt, ack.seq)
    await _still_serving(served, key)


@shared
async def test_bad_json_in_a_reply_address_field_is_schema_not_a_crash(served: Served, key: str) -> None:
    """A reply address of the wrong type is refused by the schema (typed answer on the core path)."""
    rt = served.rt
    env = envelope(f"echo-eph/{key}")
    msg = await rt.nc.request(
        rt.subjects.ephemeral("echo-eph", key),
        _body_with(env, reply_to=12345),
        timeout=DEADLINE,
        headers=good_headers(env),
    )
    error = reply_error(msg)
    assert type(error) is ProtocolError
    assert "(schema)" in str(error)


def test_child_run_ids_are_deterministic_valid_and_keep_a_stable_time() -> None:
    """Issue 9: a crash-retried parent must spawn its children under the same run ids."""
    parent = RunId.new()
    message = str(MessageId.new())
    first = child_run_id(message, 0, str(parent))
    assert first == child_run_id(message, 0, str(parent))  # the retried handler's first spawn
    assert first != child_run_id(message, 1, str(parent))  # its second spawn
    assert RunId.parse(first).ulid is not None
    # The ULID's time is the parent message's (or, for a message id without one, the parent run's).
    assert RunId.parse(first).ulid.milliseconds == MessageId.parse(message).ulid.milliseconds  # type: ignore[union-attr]
    foreign = child_run_id(f"start-{parent}", 0, str(parent))
    assert RunId.parse(foreign).ulid.milliseconds == parent.ulid.milliseconds  # type: ignore[union-attr]


@shared
async def test_a_commit_fenced_by_someone_elses_log_write_keeps_the_keys_order(
    served: Served, key: str
) -> None:
    """Found by the fuzzer: a client appended junk to an agent's EventLog subject, the owner's next commit was
    fenced ("EventLog moved"), and the worker took itself for a zombie: it left A unacked, B and C overtook it
    and A came back only after ack_wait. The owner that still holds the partition reloads and runs A again in
    place, so A, B and C are answered in order."""
    rt = served.rt
    assert await rt.send_message(PING, AgentId("echo", key), timeout=DEADLINE) == PING  # a live activation
    await rt.js.publish(rt.subjects.evlog("echo", key), b'[{"type":"junk"}]')
    inbox = rt.nc.new_inbox()
    order: list[str] = []

    async def on_reply(msg: Msg) -> None:
        order.append(msg.subject.rsplit(".", 1)[1])

    sub = await rt.nc.subscribe(f"{inbox}.*", cb=on_reply)
    try:
        for tag in "ABC":
            env = envelope(f"echo/{key}", reply_to=f"{inbox}.{tag}")
            await rt.js.publish(
                rt.subjects.inbox("echo", key), encode_envelope(env), headers=good_headers(env)
            )
        async with asyncio.timeout(4):  # well inside the worker's 5 s ack_wait: A is not left for redelivery
            while len(order) < 3:  # noqa: ASYNC110 - replies arrive through the callback
                await asyncio.sleep(0.02)
    finally:
        await sub.unsubscribe()
    assert order == ["A", "B", "C"]
