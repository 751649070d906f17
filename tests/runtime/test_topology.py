"""ensure_topology against a real nats-server: what it creates, idempotence, races, reconciliation."""

from __future__ import annotations

import asyncio
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StreamConfig

from plexus.runtime import App, Runtime, Worker, WorkerConfig
from plexus.runtime.ops._server import NatsServer
from plexus.runtime.store._topology import (
    DLQ_MAX_AGE_S,
    TopologyConflictError,
    TopologyNames,
    ensure_topology,
    inbox_transform,
)
from plexus.runtime.wire._subjects import inbox_partition, unescape_token


def partition_for(key_token: str, partitions: int) -> int:
    """The partition of an already-escaped key token (what the server hashes)."""
    return inbox_partition(unescape_token(key_token), partitions)


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_server.url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def js(nc: NATS) -> JetStreamContext:
    return nc.jetstream()


async def test_creates_the_streams_and_buckets_of_the_architecture(js: JetStreamContext) -> None:
    topo = await ensure_topology(js)
    names = TopologyNames()
    assert topo.prefix == "px"
    assert topo.partitions == 16

    inbox = (await js.stream_info("PLEXUS_INBOX")).config
    assert inbox.subjects == ["px.*.in.*.*"]
    assert inbox.retention == RetentionPolicy.WORK_QUEUE
    assert inbox.duplicate_window == 120
    assert inbox.subject_transform is not None
    assert (
        inbox.subject_transform.dest
        == "px.{{wildcard(1)}}.inp.{{wildcard(2)}}.{{partition(16,3)}}.{{wildcard(3)}}"
    )

    events = (await js.stream_info("PLEXUS_EVENTS")).config
    assert events.subjects == ["px.*.evlog.>"]
    assert events.retention == RetentionPolicy.LIMITS
    assert not events.max_age

    progress = (await js.stream_info("PLEXUS_PROGRESS")).config
    assert progress.subjects == ["px.*.progress.>"]
    assert progress.max_age == 3600

    dlq = (await js.stream_info("PLEXUS_DLQ")).config
    assert dlq.subjects == ["px.*.dlq.>"]
    assert dlq.max_age == DLQ_MAX_AGE_S == 7 * 24 * 3600

    for bucket in (names.checkpoints_bucket, names.registry_bucket, names.subscriptions_bucket):
        status = await (await js.key_value(bucket)).status()
        assert status.history == 1
        assert not status.ttl
    assert (await topo.workers.status()).ttl == 10
    assert (await topo.leases.status()).ttl == 10
    assert (await topo.leases.status()).history == 1

    await topo.artifacts.put("hello", b"world")
    assert (await (await js.object_store("plexus_artifacts")).get("hello")).data == b"world"
    assert set(topo.streams) == {
        "PLEXUS_INBOX",
        "PLEXUS_EVENTS",
        "PLEXUS_PROGRESS",
        "PLEXUS_DLQ",
        "PLEXUS_COUNTERS",
        "PLEXUS_SCHEDULES",
    }
    schedules = (await js.stream_info("PLEXUS_SCHEDULES")).config
    assert schedules.allow_msg_schedules
    assert schedules.max_age == 0  # an age limit would delete pending schedules
    inbox_sources = (await js.stream_info("PLEXUS_INBOX")).config.sources or []
    assert [s.name for s in inbox_sources] == ["PLEXUS_SCHEDULES"]


async def test_the_inbox_transform_adds_the_servers_partition(js: JetStreamContext) -> None:
    await ensure_topology(js)
    ack = await js.publish("px.default.in.echo.abc", b"hi")
    stored = await js.get_msg("PLEXUS_INBOX", ack.seq)
    assert stored.subject == f"px.default.inp.echo.{partition_for('abc', 16)}.abc"
    assert stored.subject == "px.default.inp.echo.11.abc"


async def test_partition_for_matches_the_server_for_many_keys(js: JetStreamContext) -> None:
    await ensure_topology(js, partitions=7)
    keys = [f"k{i}" for i in range(150)] + ["_", "a_2Eb", "-", "Z" * 40]
    acks = await asyncio.gather(*(js.publish(f"px.ns.in.t.{k}", b"") for k in keys))
    for key, ack in zip(keys, acks, strict=True):
        stored = await js.get_msg("PLEXUS_INBOX", ack.seq)
        assert stored.subject == f"px.ns.inp.t.{partition_for(key, 7)}.{key}"
    assert len({partition_for(k, 7) for k in keys}) == 7  # the spread reaches every partition


def test_partition_for_rejects_zero_partitions() -> None:
    with pytest.raises(ValueError, match="partition count"):
        partition_for("a", 0)


async def test_the_inbox_drops_duplicates_inside_the_window(js: JetStreamContext) -> None:
    await ensure_topology(js)
    first = await js.publish("px.default.in.echo.a", b"1", headers={"Nats-Msg-Id": "m1"})
    again = await js.publish("px.default.in.echo.a", b"1", headers={"Nats-Msg-Id": "m1"})
    assert again.duplicate is True
    assert again.seq == first.seq


async def test_idempotent_and_concurrent_calls_from_many_connections(nats_server: NatsServer) -> None:
    conns = [await nats.connect(nats_server.url) for _ in range(6)]
    try:
        topos = await asyncio.gather(*(ensure_topology(c.jetstream()) for c in conns))
        again = await ensure_topology(conns[0].jetstream())
        assert all(t.partitions == 16 for t in [*topos, again])
        infos = await conns[0].jetstream().streams_info()
        # Exactly one of each: 6 streams, 9 KV buckets (the gateway's two and the partition consumers'
        # records included), 1 object store.
        assert len(infos) == 16
        # Every handle works on the shared buckets.
        await topos[0].registry.put("echo", b"x")
        assert (await topos[5].registry.get("echo")).value == b"x"
    finally:
        for c in conns:
            await c.close()


async def test_concurrent_calls_with_different_compatible_settings(nats_server: NatsServer) -> None:
    conns = [await nats.connect(nats_server.url) for _ in range(4)]
    try:
        ttls = [5.0, 10.0, 15.0, 20.0]
        topos = await asyncio.gather(
            *(ensure_topology(c.jetstream(), workers_ttl_s=t) for c, t in zip(conns, ttls, strict=True))
        )
        # Last writer wins, but every call succeeded and the bucket has one of the requested TTLs.
        assert (await topos[0].workers.status()).ttl in ttls
    finally:
        for c in conns:
            await c.close()


_CHILD = """
import asyncio, sys, nats
from plexus.runtime.store._topology import ensure_topology

async def main() -> None:
    nc = await nats.connect(sys.argv[1])
    topo = await ensure_topology(nc.jetstream())
    print(topo.partitions)
    await nc.close()

asyncio.run(main())
"""


async def test_concurrent_calls_from_several_processes(nats_server: NatsServer) -> None:
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CHILD, nats_server.url, stdout=PIPE, stderr=PIPE
        )
        for _ in range(3)
    ]
    results = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 60)
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err.decode()
        assert out.strip() == b"16"


async def test_compatible_changes_are_applied_by_the_operator(js: JetStreamContext) -> None:
    """Naming `replicas` is the operator's reconcile (`plexus topology`): it changes an existing topology."""
    await ensure_topology(js)
    topo = await ensure_topology(
        js, progress_max_age_s=7200, workers_ttl_s=5, leases_ttl_s=3, dedupe_window_s=60, replicas=1
    )
    assert (await js.stream_info("PLEXUS_PROGRESS")).config.max_age == 7200
    assert (await js.stream_info("PLEXUS_INBOX")).config.duplicate_window == 60
    assert (await topo.workers.status()).ttl == 5
    assert (await topo.leases.status()).ttl == 3
    assert (topo.workers_ttl_s, topo.leases_ttl_s) == (5, 3)
    # Growing the TTL back past the old duplicate window works too (the window follows the TTL).
    topo = await ensure_topology(js, workers_ttl_s=300, replicas=1)
    assert (await topo.workers.status()).ttl == 300


async def test_other_processes_adopt_the_existing_topology(js: JetStreamContext) -> None:
    """A worker or client asking for other TTLs neither changes them (it may not have the rights, and two
    processes would flip them under each other's leases) nor times its leases by its own wish."""
    await ensure_topology(js, workers_ttl_s=5, leases_ttl_s=3)
    topo = await ensure_topology(js, workers_ttl_s=20, leases_ttl_s=30, progress_max_age_s=60)
    assert (await topo.leases.status()).ttl == 3
    assert (await js.stream_info("PLEXUS_PROGRESS")).config.max_age == 3600
    assert (topo.workers_ttl_s, topo.leases_ttl_s) == (5, 3)


async def test_a_worker_times_its_leases_by_the_buckets_ttl(nats_server: NatsServer) -> None:
    creator = await Runtime.connect(nats_server.url, lease_ttl_s=4)
    late = await Runtime.connect(nats_server.url, lease_ttl_s=30)
    try:
        worker = Worker(App(), late, WorkerConfig(lease_ttl_s=30))
        assert worker.config.lease_ttl_s == 4
    finally:
        await late.close()
        await creator.close()


async def test_changing_the_partition_count_needs_consent(js: JetStreamContext) -> None:
    await ensure_topology(js, partitions=16)
    with pytest.raises(TopologyConflictError) as info:
        await ensure_topology(js, partitions=8)
    err = info.value
    assert err.name == "PLEXUS_INBOX"
    assert err.setting == "subject_transform"
    assert "partition(16,3)" in err.current
    assert "partition(8,3)" in err.desired
    # Nothing changed.
    ack = await js.publish("px.default.in.echo.abc", b"")
    assert (await js.get_msg("PLEXUS_INBOX", ack.seq)).subject == "px.default.inp.echo.11.abc"

    await ensure_topology(js, partitions=8, allow_repartition=True)
    ack = await js.publish("px.default.in.echo.abc", b"")
    assert (await js.get_msg("PLEXUS_INBOX", ack.seq)).subject == f"px.default.inp.echo.{11 % 8}.abc"


async def test_another_prefix_cannot_take_over_the_streams(js: JetStreamContext) -> None:
    await ensure_topology(js, prefix="px")
    with pytest.raises(TopologyConflictError) as info:
        await ensure_topology(js, prefix="acme")
    assert info.value.setting == "subjects"
    assert info.value.name == "PLEXUS_SCHEDULES"  # the first stream made (the inbox sources it)
    # With their own names, two prefixes coexist on one server.
    names = TopologyNames(
        inbox_stream="ACME_INBOX",
        events_stream="ACME_EVENTS",
        progress_stream="ACME_PROGRESS",
        dlq_stream="ACME_DLQ",
        counters_stream="ACME_COUNTERS",
        schedules_stream="ACME_SCHEDULES",
        checkpoints_bucket="acme_checkpoints",
    )
    topo = await ensure_topology(js, prefix="acme", names=names)
    assert topo.names.inbox_stream == "ACME_INBOX"
    ack = await js.publish("acme.default.in.echo.abc", b"")
    assert ack.stream == "ACME_INBOX"


async def test_changing_retention_is_refused(js: JetStreamContext) -> None:
    await js.add_stream(name="PLEXUS_INBOX", subjects=["px.*.in.*.*"])  # limits retention
    with pytest.raises(TopologyConflictError) as info:
        await ensure_topology(js)
    assert info.value.setting == "retention"
    assert info.value.desired == "workqueue"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prefix": "px.x"}, "prefix"),
        ({"prefix": ""}, "prefix"),
        ({"partitions": 0}, "partitions"),
        ({"replicas": 0}, "replicas"),
        ({"workers_ttl_s": 0}, "workers_ttl_s"),
        ({"leases_ttl_s": -1}, "leases_ttl_s"),
        ({"progress_max_age_s": 0}, "progress_max_age_s"),
        ({"dedupe_window_s": 0}, "dedupe_window_s"),
    ],
)
async def test_bad_arguments_are_value_errors(
    js: JetStreamContext, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await ensure_topology(js, **kwargs)  # type: ignore[arg-type]


def test_inbox_transform_shape() -> None:
    t = inbox_transform("q", 4)
    assert t.src == "q.*.in.*.*"
    assert t.dest == "q.{{wildcard(1)}}.inp.{{wildcard(2)}}.{{partition(4,3)}}.{{wildcard(3)}}"


def test_conflict_error_round_trips_the_wire() -> None:
    from plexus.core._errors import KernelError

    err = TopologyConflictError("S", "subjects", "['a']", "['b']")
    assert KernelError.from_wire(err.to_wire()) == err


async def test_an_inbox_made_before_schedules_gains_their_source_from_the_operator_only(
    js: JetStreamContext,
) -> None:
    # PLEXUS_INBOX as an earlier version created it: no source of fired timers and reminders.
    await js.add_stream(
        StreamConfig(
            name="PLEXUS_INBOX",
            subjects=["px.*.in.*.*"],
            retention=RetentionPolicy.WORK_QUEUE,
            duplicate_window=120.0,
            subject_transform=inbox_transform("px", 16),
        )
    )
    await ensure_topology(js)  # a worker or client: it does not change streams
    assert not (await js.stream_info("PLEXUS_INBOX")).config.sources
    await ensure_topology(js, replicas=1)  # the operator (`plexus topology`) reconciles
    sources = (await js.stream_info("PLEXUS_INBOX")).config.sources or []
    assert [s.name for s in sources] == ["PLEXUS_SCHEDULES"]
    # And then it is stable: a later operator run finds nothing to change.
    await ensure_topology(js, replicas=1)


async def _stream_advisories(nc: NATS, step: Callable[[], Awaitable[object]], *last: str) -> list[str]:
    """``<CREATED|UPDATED>.<stream>`` of the stream advisories the server publishes while `step` runs, in
    order, once those named by `last` have come (the server publishes them after its answer)."""
    seen: list[str] = []
    all_came = asyncio.Event()

    async def record(msg: Msg) -> None:
        seen.append(".".join(msg.subject.split(".")[-2:]))
        if set(last) <= set(seen):
            all_came.set()

    sub = await nc.subscribe("$JS.EVENT.ADVISORY.STREAM.*.*", cb=record)
    try:
        await nc.flush()
        await step()
        await asyncio.wait_for(all_came.wait(), 10.0)
    finally:
        await sub.unsubscribe()
    return seen


async def test_the_schedules_stream_exists_before_the_inbox_sources_it(
    nc: NATS, js: JetStreamContext
) -> None:
    # The server asks the source stream's leader for the inbox's sourcing consumer: a stream that does not
    # exist yet leaves it unanswered, and the inbox only asks again 30 s + 10 s later (more on each miss),
    # while fired timers wait in PLEXUS_SCHEDULES. So the topology creates PLEXUS_SCHEDULES first.
    seen = await _stream_advisories(
        nc, lambda: ensure_topology(js), "CREATED.PLEXUS_INBOX", "CREATED.PLEXUS_SCHEDULES"
    )
    assert seen.index("CREATED.PLEXUS_SCHEDULES") < seen.index("CREATED.PLEXUS_INBOX"), seen


async def test_the_operator_adds_the_source_to_an_old_inbox_after_the_schedules_stream_exists(
    nc: NATS, js: JetStreamContext
) -> None:
    await js.add_stream(
        StreamConfig(
            name="PLEXUS_INBOX",
            subjects=["px.*.in.*.*"],
            retention=RetentionPolicy.WORK_QUEUE,
            duplicate_window=120.0,
            subject_transform=inbox_transform("px", 16),
        )
    )
    seen = await _stream_advisories(
        nc,
        lambda: ensure_topology(js, replicas=1),
        "UPDATED.PLEXUS_INBOX",
        "CREATED.PLEXUS_SCHEDULES",
    )
    assert seen.index("CREATED.PLEXUS_SCHEDULES") < seen.index("UPDATED.PLEXUS_INBOX"), seen


async def test_a_second_operator_run_changes_no_stream(nc: NATS, js: JetStreamContext) -> None:
    # PLEXUS_SCHEDULES once left its duplicate window to nats-py's 0 (the server stores 120 s): every
    # operator run updated it and every other connection warned that it differs.
    await ensure_topology(js, replicas=1)

    async def again() -> None:
        await ensure_topology(js, replicas=1)
        await js.add_stream(name="MARKER", subjects=["marker"])  # its advisory comes after any of the run's

    seen = await _stream_advisories(nc, again, "CREATED.MARKER")
    assert seen == ["CREATED.MARKER"], seen
