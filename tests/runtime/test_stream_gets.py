"""`StreamGets.get_last_msg` answers and fails as ``js.get_last_msg`` does, against a real nats-server; a
`CheckpointStore` reading through it loads what one reading through ``kv.get`` loads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from plexus.runtime.ops._server import NatsServer
from plexus.runtime.store._checkpoints import CheckpointStore
from plexus.runtime.store._gets import StreamGets
from plexus.runtime.store._topology import ensure_topology

STREAM = "GETS"


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_server.url)
    try:
        await conn.jetstream().add_stream(name=STREAM, subjects=["gets.>"])
        yield conn
    finally:
        await conn.close()


async def _outcome(read: Any) -> tuple[str, Any]:
    try:
        msg = await read
    except Exception as exc:
        return type(exc).__name__, (getattr(exc, "code", None), getattr(exc, "err_code", None))
    return "ok", (msg.subject, msg.seq, msg.data, msg.headers, msg.time, msg.stream)


async def test_last_messages_and_errors_are_js_get_last_msgs(nc: NATS) -> None:
    js, gets = nc.jetstream(), StreamGets(nc)
    await js.publish("gets.a", b"first")
    await js.publish("gets.a", b"\x00\xffbinary", headers={"X-One": "1", "X-Two": "two words"})
    await js.publish("gets.empty", b"")
    await js.publish("gets.b", b'{"json": true}')
    cases = [
        (STREAM, "gets.a"),  # the last of two, with headers
        (STREAM, "gets.empty"),  # an empty body
        (STREAM, "gets.b"),
        (STREAM, "gets.none"),  # nothing stored on it: NotFoundError 10037
        ("NO_SUCH_STREAM", "gets.a"),  # NotFoundError 10059
    ]
    for stream, subject in cases:
        ours = await _outcome(gets.get_last_msg(stream, subject))
        theirs = await _outcome(js.get_last_msg(stream, subject))
        assert ours == theirs, (stream, subject)
    assert (await gets.get_last_msg(STREAM, "gets.a")).headers == {"X-One": "1", "X-Two": "two words"}


async def test_concurrent_reads_each_get_their_own_answer(nc: NATS) -> None:
    js, gets = nc.jetstream(), StreamGets(nc)
    for i in range(50):
        await js.publish(f"gets.k{i}", str(i).encode())
    found = await asyncio.gather(*(gets.get_last_msg(STREAM, f"gets.k{i}") for i in range(50)))
    assert [m.data for m in found] == [str(i).encode() for i in range(50)]


async def test_no_jetstream_answering_is_service_unavailable_as_with_nats_py(nc: NATS) -> None:
    ours = await _outcome(StreamGets(nc, api_prefix="$NOJS.API").get_last_msg(STREAM, "gets.a"))
    theirs = await _outcome(nc.jetstream(prefix="$NOJS.API").get_last_msg(STREAM, "gets.a"))
    assert ours == theirs
    assert ours[0] == "ServiceUnavailableError"


async def test_a_bad_stream_name_is_refused_before_sending(nc: NATS) -> None:
    for bad in ("", "a.b", "a b", "a*", "a>"):
        with pytest.raises(ValueError, match="stream name"):
            await StreamGets(nc).get_last_msg(bad, "gets.a")


async def test_a_checkpoint_store_reading_through_it_loads_what_kv_get_loads(nc: NATS) -> None:
    topology = await ensure_topology(nc.jetstream())
    kv = topology.checkpoints
    plain = CheckpointStore(kv)
    lean = CheckpointStore(
        kv, bucket=topology.names.checkpoints_bucket, get_last_msg=StreamGets(nc).get_last_msg
    )

    async def same(key: str) -> None:
        assert await lean.load(key) == await plain.load(key), key

    await same("ns.t.missing")
    r1 = await plain.save("ns.t.k", b'{"n": 1}', None)
    await same("ns.t.k")
    await plain.save("ns.t.k", b"", r1)  # an empty state is a state
    await same("ns.t.k")
    await plain.save("ns.t.gone", b"x", None)
    await kv.delete("ns.t.gone")
    assert await plain.load("ns.t.gone") is None
    await same("ns.t.gone")
    await plain.save("ns.t.purged", b"x", None)
    await kv.purge("ns.t.purged")
    await same("ns.t.purged")


async def test_kv_entries_are_what_kv_get_reads(nc: NATS) -> None:
    """`StreamGets.kv_entry`: the value and revision ``kv.get`` gives, None where it raises KeyNotFoundError
    (never put, deleted, purged, no such bucket)."""
    js, gets = nc.jetstream(), StreamGets(nc)
    kv = await js.create_key_value(bucket="gets_kv")

    async def same(key: str, bucket: str = "gets_kv") -> None:
        ours = await gets.kv_entry(bucket, key)
        try:
            entry = await (await js.key_value(bucket)).get(key) if bucket == "gets_kv" else None
        except nats.js.errors.KeyNotFoundError:
            entry = None
        theirs = None if entry is None else (entry.value or b"", entry.revision)
        assert (None if ours is None else (ours.data or b"", ours.seq)) == theirs, key

    await same("missing")
    await kv.put("k", b"one")
    await kv.put("k", b"two")
    await same("k")
    await kv.put("empty", b"")
    await same("empty")
    await kv.put("gone", b"x")
    await kv.delete("gone")
    await same("gone")
    await kv.put("purged", b"x")
    await kv.purge("purged")
    await same("purged")
    assert await gets.kv_entry("no_such_bucket", "k") is None


async def test_stop_unsubscribes_and_a_later_read_subscribes_again(nc: NATS) -> None:
    js, gets = nc.jetstream(), StreamGets(nc)
    await js.publish("gets.s", b"x")
    assert (await gets.get_last_msg(STREAM, "gets.s")).data == b"x"
    subscriptions = len(nc._subs)
    await gets.stop()
    assert len(nc._subs) == subscriptions - 1
    assert (await gets.get_last_msg(STREAM, "gets.s")).data == b"x"
    assert len(nc._subs) == subscriptions


async def test_a_read_swallowed_by_a_leader_election_is_asked_again(nc: NATS) -> None:
    """A read sent while the stream elects its leader is never answered; it is asked again every second (a
    read is safe to repeat), so it waits about as long as the election, not its 5 s timeout. The relay
    drops the first copy and passes the next ones to the real API."""
    await nc.jetstream().publish("gets.e", b"stored")
    copies: list[float] = []

    async def relay(msg: Any) -> None:
        copies.append(asyncio.get_running_loop().time())
        if len(copies) > 1:
            real = await nc.request(f"$JS.API.STREAM.MSG.GET.{STREAM}", msg.data, timeout=5)
            await msg.respond(real.data)

    await nc.subscribe(f"$ELECT.API.STREAM.MSG.GET.{STREAM}", cb=relay)
    await nc.flush()
    started = asyncio.get_running_loop().time()
    got = await StreamGets(nc, api_prefix="$ELECT.API").get_last_msg(STREAM, "gets.e")
    assert got.data == b"stored"
    assert len(copies) == 2
    assert 0.8 < copies[1] - started < 2.0
