"""EventLog against a real nats-server: atomic batches, fencing by expected sequence, read and tail."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from plexus.core._errors import ConcurrentAppendError, KernelError
from plexus.core._message_codec import UnknownMessage
from plexus.core._messages import InputMessage, ReplyMessage
from plexus.runtime.ops._server import NatsServer
from plexus.runtime.store._acks import DeferredAcks
from plexus.runtime.store._artifacts import PayloadTooLargeError
from plexus.runtime.store._eventlog import EventLog, LogRecord
from plexus.runtime.store._topology import ensure_topology
from tests.freeze import freeze

SUBJECT = "px.default.evlog.chat.s1"
WAIT = 10.0  # deadline for every await on a live event


def dict_log(js: JetStreamContext, subject: str = SUBJECT, timeout: float = 5.0) -> EventLog[dict[str, Any]]:
    def decode(data: bytes) -> dict[str, Any]:
        value = json.loads(data)
        assert isinstance(value, dict)
        return value

    return EventLog(js, subject, encode=lambda e: json.dumps(e).encode(), decode=decode, timeout=timeout)


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_server.url)
    try:
        await ensure_topology(conn.jetstream())
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def js(nc: NATS) -> JetStreamContext:
    return nc.jetstream()


async def test_empty_log(js: JetStreamContext) -> None:
    log = dict_log(js)
    assert await log.last_seq() == 0
    assert await log.read() == []


async def test_sequential_appends_return_the_new_last_seq(js: JetStreamContext) -> None:
    log = dict_log(js)
    s1 = await log.append([{"n": 1}], 0)
    s2 = await log.append([{"n": 2}], s1)
    s3 = await log.append([{"n": 3}], s2)
    assert 0 < s1 < s2 < s3
    assert await log.last_seq() == s3
    assert [r.entry["n"] for r in await log.read()] == [1, 2, 3]


async def test_a_multi_entry_append_is_one_batch(js: JetStreamContext) -> None:
    log = dict_log(js)
    seq = await log.append([{"n": 1}, {"n": 2}, {"n": 3}], 0)
    records = await log.read()
    assert records == [LogRecord(seq, 0, {"n": 1}), LogRecord(seq, 1, {"n": 2}), LogRecord(seq, 2, {"n": 3})]
    # One JetStream message holds the whole batch: all-or-nothing by construction.
    stored = await js.get_last_msg("PLEXUS_EVENTS", SUBJECT)
    assert json.loads(stored.data or b"") == [{"n": 1}, {"n": 2}, {"n": 3}]


async def test_a_failed_multi_entry_append_writes_nothing(js: JetStreamContext) -> None:
    log = dict_log(js)
    seq = await log.append([{"n": 0}], 0)
    with pytest.raises(ConcurrentAppendError):
        await log.append([{"n": 1}, {"n": 2}], 0)
    assert [r.entry for r in await log.read()] == [{"n": 0}]
    assert await log.last_seq() == seq


async def test_expected_zero_on_a_non_empty_log_fails(js: JetStreamContext) -> None:
    log = dict_log(js)
    seq = await log.append([{"n": 1}], 0)
    with pytest.raises(ConcurrentAppendError) as info:
        await log.append([{"n": 2}], 0)
    assert info.value.expected_seq == 0
    assert info.value.actual_seq == seq
    assert info.value.recoverable is True


async def test_twenty_racing_appenders_one_wins(js: JetStreamContext) -> None:
    log = dict_log(js)
    base = await log.append([{"w": "init"}], 0)

    async def writer(i: int) -> int | ConcurrentAppendError:
        try:
            return await log.append([{"w": i}, {"w": i, "part": 2}], base)
        except ConcurrentAppendError as exc:
            return exc

    results = await asyncio.gather(*(writer(i) for i in range(20)))
    wins = [r for r in results if isinstance(r, int)]
    losses = [r for r in results if isinstance(r, ConcurrentAppendError)]
    assert len(wins) == 1
    assert len(losses) == 19
    assert all(e.expected_seq == base and e.actual_seq == wins[0] for e in losses)
    records = await log.read()
    assert len(records) == 3  # init + the winner's two entries, never a mix of writers
    assert records[1].entry["w"] == records[2].entry["w"]


async def test_logs_of_different_agents_are_independent(js: JetStreamContext) -> None:
    a = dict_log(js, "px.default.evlog.chat.a")
    b = dict_log(js, "px.default.evlog.chat.b")
    sa = await a.append([{"x": "a"}], 0)
    sb = await b.append([{"x": "b"}], 0)  # b is still empty although the stream is not
    assert sb > sa
    await a.append([{"x": "a2"}], sa)
    assert [r.entry["x"] for r in await a.read()] == ["a", "a2"]
    assert [r.entry["x"] for r in await b.read()] == ["b"]


async def test_read_ranges(js: JetStreamContext) -> None:
    log = dict_log(js)
    other = dict_log(js, "px.default.evlog.chat.other")
    seqs = []
    last = 0
    for n in range(6):
        last = await log.append([{"n": n}], last)
        seqs.append(last)
        await other.append([{"noise": n}], await other.last_seq())  # interleave so seqs have gaps
    assert [r.entry["n"] for r in await log.read(seqs[2])] == [2, 3, 4, 5]
    assert [r.entry["n"] for r in await log.read(seqs[2] + 1)] == [3, 4, 5]  # from a gap: the next batch
    assert [r.entry["n"] for r in await log.read(seqs[1], seqs[3])] == [1, 2, 3]
    assert [r.entry["n"] for r in await log.read(0, seqs[0])] == [0]
    assert await log.read(seqs[5] + 1) == []
    assert await log.read(seqs[3], seqs[2]) == []
    assert [r.seq for r in await log.read()] == seqs


async def test_read_stops_at_the_last_seq_known_at_call_time(js: JetStreamContext) -> None:
    log = dict_log(js)
    last = 0
    for n in range(30):
        last = await log.append([{"n": n}], last)

    async def keep_appending() -> None:
        nonlocal last
        for n in range(30, 60):
            last = await log.append([{"n": n}], last)

    writer = asyncio.create_task(keep_appending())
    records = await asyncio.wait_for(log.read(), WAIT)
    await writer
    assert [r.entry["n"] for r in records][:30] == list(range(30))
    assert len(records) >= 30


async def test_read_since_reads_the_batches_stored_from_a_time_on(js: JetStreamContext) -> None:
    log = dict_log(js)
    s1 = await log.append([{"n": 1}], 0)
    first = await js.get_last_msg("PLEXUS_EVENTS", SUBJECT)
    await log.append([{"n": 2}, {"n": 3}], s1)
    second = await js.get_last_msg("PLEXUS_EVENTS", SUBJECT)
    assert first.time is not None
    assert second.time is not None
    assert [r.entry["n"] for r in await log.read_since(first.time)] == [1, 2, 3]
    assert [r.entry["n"] for r in await log.read_since(second.time)] == [2, 3]
    naive = second.time.astimezone(datetime.UTC).replace(tzinfo=None)  # read as UTC, as nats-py does
    assert [r.entry["n"] for r in await log.read_since(naive)] == [2, 3]


async def test_read_since_after_the_last_batch_is_empty_without_waiting(js: JetStreamContext) -> None:
    log = dict_log(js, timeout=30.0)
    assert await log.read_since(datetime.datetime.now(datetime.UTC)) == []
    await log.append([{"n": 1}], 0)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=5)
    # The last batch's time says there is nothing: no consumer waits out its 30 s for a message.
    async with asyncio.timeout(10):
        assert await log.read_since(later) == []


class _PurgesAfterLastRead(JetStreamContext):
    """A JetStream context under which the log's batches vanish right after their last one was read: the
    consumer that read_since starts next stays silent, as one whose server was lost does."""

    async def get_last_msg(self, stream_name: str, subject: str, direct: bool | None = False) -> Any:
        msg = await super().get_last_msg(stream_name, subject, direct=direct)
        await self.purge_stream(stream_name, subject=subject)
        return msg


async def test_read_since_never_takes_a_silent_consumer_for_an_empty_log(nc: NATS) -> None:
    log = dict_log(js=_PurgesAfterLastRead(nc), timeout=1.0)
    before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5)
    await log.append([{"n": 1}], 0)
    # A batch was stored after `before` but none arrives: an outage (a redelivered message would otherwise
    # look uncommitted and run a second time), not "nothing since".
    with pytest.raises(nats.errors.TimeoutError):
        await log.read_since(before)


async def test_tail_yields_stored_then_live_records(js: JetStreamContext) -> None:
    log = dict_log(js)
    s1 = await log.append([{"n": 1}], 0)
    s2 = await log.append([{"n": 2}, {"n": 3}], s1)
    seen: list[LogRecord[dict[str, Any]]] = []
    got_three = asyncio.Event()
    got_five = asyncio.Event()

    async def follow() -> None:
        async with log.tail() as records:
            async for record in records:
                seen.append(record)
                if len(seen) == 3:
                    got_three.set()
                if len(seen) == 5:
                    got_five.set()

    task = asyncio.create_task(follow())
    await asyncio.wait_for(got_three.wait(), WAIT)
    s3 = await log.append([{"n": 4}, {"n": 5}], s2)
    await asyncio.wait_for(got_five.wait(), WAIT)
    assert [(r.seq, r.index, r.entry["n"]) for r in seen] == [
        (s1, 0, 1),
        (s2, 0, 2),
        (s2, 1, 3),
        (s3, 0, 4),
        (s3, 1, 5),
    ]
    assert not task.done()  # a tail never completes on its own
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_tail_from_a_seq_and_cleanup_on_close(nc: NATS, js: JetStreamContext) -> None:
    log = dict_log(js)
    s1 = await log.append([{"n": 1}], 0)
    s2 = await log.append([{"n": 2}], s1)
    tail = log.tail(s2)
    subs_before = len(nc._subs)
    first = await asyncio.wait_for(anext(tail), WAIT)
    assert (first.seq, first.entry) == (s2, {"n": 2})
    assert len(nc._subs) == subs_before + 1
    await tail.aclose()
    assert len(nc._subs) == subs_before
    with pytest.raises(StopAsyncIteration):
        await anext(tail)
    await tail.aclose()  # idempotent


async def test_cancelling_a_waiting_tail_removes_its_subscription(nc: NATS, js: JetStreamContext) -> None:
    log = dict_log(js)
    await log.append([{"n": 1}], 0)
    subs_before = len(nc._subs)
    tail = log.tail()
    await asyncio.wait_for(anext(tail), WAIT)
    waiting = asyncio.create_task(anext(tail))  # nothing more is stored: it waits
    await asyncio.sleep(0)  # let it start waiting; the assertion below does not depend on timing
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(nc._subs) == subs_before


async def test_append_with_retry_rebuilds_against_the_new_seq(js: JetStreamContext) -> None:
    log = dict_log(js)
    rival = dict_log(js)
    seen: list[int] = []
    interfere = True

    def build(last: int) -> list[dict[str, Any]]:
        seen.append(last)
        return [{"after": last}]

    # A rival writes between our last_seq and our append on the first try.
    original_append = log.append

    async def append_with_rival(entries: Any, expected_seq: int, **kw: Any) -> int:
        nonlocal interfere
        if interfere:
            interfere = False
            await rival.append([{"rival": True}], expected_seq)
        return await original_append(entries, expected_seq, **kw)

    log.append = append_with_rival  # type: ignore[method-assign]
    seq = await log.append_with_retry(build, attempts=3)
    records = await log.read()
    assert [r.entry for r in records] == [{"rival": True}, {"after": records[0].seq}]
    assert seen == [0, records[0].seq]
    assert seq == records[1].seq


async def test_append_with_retry_gives_up_after_attempts(js: JetStreamContext) -> None:
    log = dict_log(js)
    rival = dict_log(js)

    def build(last: int) -> list[dict[str, Any]]:
        return [{"after": last}]

    async def always_interfere(entries: Any, expected_seq: int, **kw: Any) -> int:
        await rival.append([{"rival": True}], expected_seq)
        return await EventLog.append(log, entries, expected_seq, **kw)

    log.append = always_interfere  # type: ignore[method-assign]
    with pytest.raises(ConcurrentAppendError):
        await log.append_with_retry(build, attempts=2)
    assert len(await log.read()) == 2  # the two rival writes only


async def test_append_with_retry_tries_a_guessed_seq_first(js: JetStreamContext) -> None:
    """``expected=``: a right guess appends without reading the log; a stale one costs one conflict."""
    log = dict_log(js)
    first = await log.append([{"n": 1}], 0)
    reads = 0
    original_last_seq = log.last_seq

    async def counting_last_seq() -> int:
        nonlocal reads
        reads += 1
        return await original_last_seq()

    log.last_seq = counting_last_seq  # type: ignore[method-assign]
    seen: list[int] = []

    def build(last: int) -> list[dict[str, Any]]:
        seen.append(last)
        return [{"after": last}]

    second = await log.append_with_retry(build, expected=first)
    assert (seen, reads) == ([first], 0)
    third = await log.append_with_retry(build, expected=first)  # stale: the log moved on to `second`
    assert seen == [first, first, second]
    records = await log.read()
    assert [r.entry for r in records] == [{"n": 1}, {"after": first}, {"after": second}]
    assert third == records[-1].seq


async def test_append_with_retry_empty_build_is_a_no_op(js: JetStreamContext) -> None:
    log = dict_log(js)
    s = await log.append([{"n": 1}], 0)
    assert await log.append_with_retry(lambda last: []) == s
    assert await log.last_seq() == s


async def test_retry_with_the_same_msg_id_after_a_landed_append_succeeds(js: JetStreamContext) -> None:
    log = dict_log(js)
    seq = await log.append([{"n": 1}], 0, msg_id="m-1")
    # The caller did not see the ack (e.g. a timeout) and retries with the same expectation and id.
    assert await log.append([{"n": 1}], 0, msg_id="m-1") == seq
    assert len(await log.read()) == 1
    # A different id is a real conflict.
    with pytest.raises(ConcurrentAppendError):
        await log.append([{"n": 1}], 0, msg_id="m-2")


async def test_default_codec_stores_kernel_messages(js: JetStreamContext) -> None:
    log = EventLog(js, SUBJECT)
    entries = [InputMessage(text="hi"), ReplyMessage(text="yo")]
    seq = await log.append(entries, 0)
    records = await log.read()
    assert [r.entry for r in records] == entries
    assert {r.seq for r in records} == {seq}
    # An entry type this process does not know is kept, not dropped.
    raw = b'[{"type":"from_the_future","id":"x","timestamp":1.0,"extra":[1,2]}]'
    await js.publish(SUBJECT, raw)
    future = (await log.read(seq + 1))[0].entry
    assert isinstance(future, UnknownMessage)


async def test_corrupt_batch_is_a_clear_error(js: JetStreamContext) -> None:
    await js.publish(SUBJECT, b"not json")
    with pytest.raises(ValueError, match="not a JSON array"):
        await dict_log(js).read()


async def test_oversized_batch_is_a_typed_error(tmp_path: Any) -> None:
    server = NatsServer(store_dir=tmp_path / "small", max_payload=4096).start()
    try:
        conn = await nats.connect(server.url)
        try:
            js = conn.jetstream()
            await ensure_topology(js)
            log = dict_log(js)
            with pytest.raises(PayloadTooLargeError):
                await log.append([{"blob": "x" * 2000}, {"blob": "y" * 2000}], 0)
            assert await log.append([{"small": True}], 0) > 0  # the connection survived
        finally:
            await conn.close()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("entries", "expected", "match"),
    [([], 0, "at least one"), ([{"n": 1}], -1, "expected_seq")],
)
async def test_bad_append_arguments(
    js: JetStreamContext, entries: list[dict[str, Any]], expected: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await dict_log(js).append(entries, expected)


def test_bad_constructor_arguments() -> None:
    js: Any = object()
    with pytest.raises(ValueError, match="wildcards"):
        EventLog(js, "px.default.evlog.chat.*")
    with pytest.raises(ValueError, match="wildcards"):
        EventLog(js, "")
    with pytest.raises(ValueError, match="both encode and decode"):
        EventLog(js, SUBJECT, encode=lambda e: b"", decode=None)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="timeout"):
        EventLog(js, SUBJECT, timeout=0)


async def test_bad_retry_attempts(js: JetStreamContext) -> None:
    with pytest.raises(ValueError, match="attempts"):
        await dict_log(js).append_with_retry(lambda last: [{"n": 1}], attempts=0)


async def test_missing_stream_is_not_an_empty_log(js: JetStreamContext) -> None:
    log = EventLog(js, "nowhere.x", stream="NO_SUCH_STREAM")
    with pytest.raises(nats.js.errors.NotFoundError):
        await log.last_seq()


def test_concurrent_append_error_round_trips_the_wire() -> None:
    err = ConcurrentAppendError(3, 7)
    assert KernelError.from_wire(err.to_wire()) == err


async def test_an_append_repeated_after_its_first_copy_landed_is_stored_once_and_returns_its_seq(
    js: JetStreamContext,
) -> None:
    """An append is sent again while unanswered (a leader election swallows requests). When the first copy
    landed and only its ack was lost, the repeat fails the fence; the log recognises its own batch as the
    last one (its `Plexus-Append` id) and returns its sequence instead of a conflict. Here the publish sends
    every append twice and answers with the second copy's outcome."""
    log_dict = dict_log(js, "px.default.evlog.rep.a")

    async def twice(
        subject: str,
        data: bytes,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        repeat: bool | None = None,
    ) -> Any:
        assert repeat is True  # a fenced append asks to be repeated
        await js.publish(subject, data, headers=headers)  # landed; its ack "lost"
        return await js.publish(subject, data, headers=headers, timeout=timeout)

    log = EventLog(
        js,
        "px.default.evlog.rep.a",
        encode=lambda e: json.dumps(e).encode(),
        decode=lambda b: json.loads(b),
        publish=twice,
    )
    assert await log.append([{"n": 1}], 0) == 1
    assert await log.append([{"n": 2}], 1) == 2
    assert [r.entry for r in await log_dict.read()] == [{"n": 1}, {"n": 2}]
    # Another writer's batch at the same expected sequence is still a conflict.
    with pytest.raises(ConcurrentAppendError):
        await log.append([{"n": "other"}], 1)


@pytest.mark.parametrize("publisher", ["js.publish", "DeferredAcks"])
async def test_an_unanswered_append_gives_up_after_the_timeout_it_is_given(
    nats_server: NatsServer, nc: NATS, js: JetStreamContext, publisher: str
) -> None:
    """A worker's commit passes what is left of its lease as the append's timeout: an append sent again
    while unanswered must stop by then (a copy landing after the lease passed on could precede the new
    owner's first append). The server is frozen (SIGSTOP), so nothing answers."""
    publish = DeferredAcks(nc).publish_acked if publisher == "DeferredAcks" else None
    log = EventLog(js, "px.default.evlog.frozen.a", timeout=30.0, publish=publish)
    assert await log.append([ReplyMessage(text="before")], 0) == 1
    pid = nats_server.pid
    assert pid is not None
    await freeze(pid)  # stopped for certain: a server still running answered the append in 1 CI run
    try:
        started = time.monotonic()
        with pytest.raises(nats.errors.TimeoutError):
            await log.append([ReplyMessage(text="late")], 1, timeout=0.5)
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert 0.4 < took < 3.0, took  # the log's own 30 s did not apply


async def test_an_append_timeout_is_at_most_the_logs_own_and_positive(js: JetStreamContext) -> None:
    log = dict_log(js, "px.default.evlog.bounds.a", timeout=5.0)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            await log.append([{"n": 1}], 0, timeout=bad)
    assert await log.append([{"n": 1}], 0, timeout=3600.0) == 1  # capped at 5 s, and answered at once
