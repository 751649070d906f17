"""What taking inbox partitions over costs in JetStream API requests, against a real nats-server.

A new owner must delete the earlier consumer of the partition before it creates its own (the stream is a
work queue). It once found them with ``CONSUMER.LIST`` (every consumer's full info, 256 a page) on every
take, then with ``CONSUMER.NAMES`` once per rebalance round; names are now secret (a random nonce, issue 36)
and recorded per partition in a KV bucket (`store._consumer_records`): a take reads its partition's record,
deletes exactly that consumer, records its own and creates it — no listing at all. The requests are
counted by a subscription on ``$JS.API.>``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Callable

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.kv import KeyValue

from plexus.runtime.store._consumer_records import ConsumerRecords, _consumer_filters, delete_unrecorded
from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.wire._subjects import Subjects, consumer_name, lease_key
from plexus.runtime.worker._partitions import PartitionOwner

STREAM = "TAKE_INBOX"
PARTITIONS = 16
#: Other types' partition consumers on the same stream: more than one CONSUMER.LIST page (256).
OTHER_TYPES = 20
TTL_S = 30.0
SUBJECTS = Subjects("default")
RECORDS = "take_consumers"


class _Api:
    """Counts JetStream API requests on `STREAM` and the records bucket by kind (``CONSUMER.DELETE``, …)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    async def on_request(self, msg: Msg) -> None:
        tokens = msg.subject.split(".")
        if tokens[4:5] in ([STREAM], [f"KV_{RECORDS}"]):
            self.counts[".".join(tokens[2:4])] += 1


class _Setup:
    def __init__(
        self, nc: NATS, js: JetStreamContext, kv: KeyValue, records: KeyValue, mon: NATS, api: _Api
    ) -> None:
        self.nc, self.js, self.kv, self.records, self.mon, self.api = nc, js, kv, records, mon, api

    def owner(self, worker: str, agent_type: str = "echo", partitions: int = PARTITIONS) -> PartitionOwner:
        async def live_workers() -> list[str]:
            return [worker]  # alone: its share is every partition

        async def dispatch(p: int, msg: Msg, done: Callable[[], None]) -> None:
            done()

        return PartitionOwner(
            nc=self.nc,
            js=self.js,
            leases=LeaseManager(self.kv, worker, TTL_S),
            consumers=ConsumerRecords(self.records, SUBJECTS.namespace),
            subjects=SUBJECTS,
            stream=STREAM,
            agent_type=agent_type,
            partitions=partitions,
            worker_id=worker,
            live_workers=live_workers,
            dispatch=dispatch,
            slots=asyncio.Semaphore(1024),
            ack_wait_s=TTL_S,
            max_ack_pending=64,
            on_lost=lambda p: None,
            max_batch=4,
        )

    async def consumer(self, name: str, agent_type: str, partition: int) -> None:
        await self.js.add_consumer(
            STREAM,
            js_api.ConsumerConfig(
                name=name,
                durable_name=name,
                filter_subject=SUBJECTS.inbox_partitioned_filter(agent_type, partition),
                ack_policy=js_api.AckPolicy.EXPLICIT,
            ),
        )

    async def names(self) -> set[str]:
        return set(await _consumer_filters(self.nc, STREAM))  # every page (nats-py reads the first)

    async def counted(self) -> collections.Counter[str]:
        await self.mon.flush()  # the server copied each request to us before answering it
        counts = collections.Counter(self.api.counts)
        self.api.counts.clear()
        return counts


@pytest.fixture
async def setup(nats_url: str) -> AsyncIterator[_Setup]:
    nc = await nats.connect(nats_url)
    mon = await nats.connect(nats_url)
    api = _Api()
    try:
        js = nc.jetstream()
        await js.add_stream(
            js_api.StreamConfig(
                name=STREAM,
                subjects=[f"{SUBJECTS.base}.inp.>"],
                retention=js_api.RetentionPolicy.WORK_QUEUE,
            )
        )
        kv = await js.create_key_value(bucket="take_leases", history=1, ttl=TTL_S)
        records = await js.create_key_value(js_api.KeyValueConfig(bucket=RECORDS, history=1, direct=True))
        await mon.subscribe("$JS.API.>", cb=api.on_request)
        await mon.flush()
        yield _Setup(nc, js, kv, records, mon, api)
    finally:
        await nc.close()
        await mon.close()


def _nonce(i: int) -> str:
    return f"{i:032x}"


async def test_a_takeover_deletes_exactly_the_recorded_consumers_without_listing(setup: _Setup) -> None:
    others = {
        consumer_name("default", f"other{t}", p, nonce=_nonce(t))
        for t in range(OTHER_TYPES)
        for p in range(PARTITIONS)
    }
    for name in others:
        _, _, agent_type, p, _ = name.split("__")
        await setup.consumer(name, agent_type, int(p))
    first = setup.owner("w-a")
    await first.rebalance()
    assert set(first.owned) == set(range(PARTITIONS))
    await first.release_all()  # a restart: the leases are free, the consumers stay
    earlier = await setup.names() - others
    assert len(earlier) == PARTITIONS
    await setup.counted()

    second = setup.owner("w-b")
    await second.rebalance()
    assert set(second.owned) == set(range(PARTITIONS))
    counts = await setup.counted()
    assert counts["CONSUMER.LIST"] == 0, counts
    assert counts["CONSUMER.NAMES"] == 0, counts  # names are read from the records, one direct get each
    assert counts["DIRECT.GET"] == PARTITIONS, counts
    assert counts["CONSUMER.DELETE"] == PARTITIONS, counts  # exactly the earlier owner's, by name
    assert counts["CONSUMER.CREATE"] == PARTITIONS, counts
    assert counts["CONSUMER.INFO"] == 0, counts
    now = await setup.names()
    assert now & earlier == set()
    assert others <= now  # no other type's consumer touched
    mine = {puller.durable for _, puller in second.owned.values()}
    assert now - others == mine
    await second.release_all()


async def test_an_unrecorded_consumer_blocks_its_partition_until_the_operator_deletes_it(
    setup: _Setup, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = consumer_name("default", "echo", 0)  # from before records (here: `px__default__echo__0`)
    await setup.consumer(legacy, "echo", 0)
    owner = setup.owner("w-b", partitions=1)
    with caplog.at_level(logging.ERROR, "plexus.worker"):
        await owner.rebalance()
        await owner.rebalance()
    assert owner.owned == {}
    reports = [r.getMessage() for r in caplog.records if r.name == "plexus.worker"]
    assert len(reports) == 1, reports  # one clear line, not one per round
    assert "run `plexus topology` as the operator" in reports[0]
    assert lease_key("default", "echo", 0) not in await owner.leases.holders()  # the lease was given up

    assert await delete_unrecorded(setup.nc, setup.js, setup.records, STREAM, SUBJECTS.prefix) == [legacy]
    await owner.rebalance()
    assert set(owner.owned) == {0}
    assert await setup.names() == {owner.owned[0][1].durable}
    # The recorded consumer is kept by the operator's sweep.
    assert await delete_unrecorded(setup.nc, setup.js, setup.records, STREAM, SUBJECTS.prefix) == []
    await owner.release_all()


async def test_shortened_names_are_recorded_and_deleted_exactly(setup: _Setup) -> None:
    # Names over 255 characters end in a hash: these types' names share their first 188 characters.
    long_type, neighbour = "t" * 250, "t" * 250 + "x"
    neighbours = {consumer_name("default", neighbour, p, nonce=_nonce(7)) for p in range(2)}
    for p in range(2):
        await setup.consumer(consumer_name("default", neighbour, p, nonce=_nonce(7)), neighbour, p)
    first = setup.owner("w-a", long_type, partitions=2)
    await first.rebalance()
    await first.release_all()
    before = await setup.names()
    assert len(before) == 4
    assert all(len(name) == 255 for name in before)

    second = setup.owner("w-b", long_type, partitions=2)
    await second.rebalance()
    assert set(second.owned) == {0, 1}
    mine = {puller.durable for _, puller in second.owned.values()}
    assert await setup.names() == mine | neighbours
    await second.release_all()
