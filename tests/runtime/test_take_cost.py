"""What taking inbox partitions over costs in JetStream API requests, against a real nats-server.

A new owner must delete every earlier consumer of the partition before it creates its own (the stream is a
work queue). It used to find them with ``CONSUMER.LIST`` (every consumer's full info, 256 a page) on every
take: with 20 types x 16 partitions, a restart's 320 takes made 640 LIST requests answered with ~60 MB, and
in a cluster a partial list (a slow consumer leader left out) made the take fail. It now lists consumer
names (``CONSUMER.NAMES``, answered by the meta leader, never partial) once per rebalance round and deletes
the partition's earlier consumers by name. The requests are counted by a subscription on ``$JS.API.>``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.kv import KeyValue

from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.wire._subjects import Subjects, consumer_name, lease_key
from plexus.runtime.worker._earlier_consumers import consumer_names
from plexus.runtime.worker._partitions import PartitionOwner

STREAM = "TAKE_INBOX"
PARTITIONS = 16
#: Other types' partition consumers on the same stream: more than one CONSUMER.LIST page (256).
OTHER_TYPES = 20
TTL_S = 30.0
SUBJECTS = Subjects("default")


class _Api:
    """Counts JetStream API requests on `STREAM` by kind (``CONSUMER.NAMES``, ``STREAM.INFO``, …)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    async def on_request(self, msg: Msg) -> None:
        tokens = msg.subject.split(".")
        if tokens[4:5] == [STREAM]:
            self.counts[".".join(tokens[2:4])] += 1


class _Setup:
    def __init__(self, nc: NATS, js: JetStreamContext, kv: KeyValue, mon: NATS, api: _Api) -> None:
        self.nc, self.js, self.kv, self.mon, self.api = nc, js, kv, mon, api

    def owner(self, worker: str, agent_type: str = "echo", partitions: int = PARTITIONS) -> PartitionOwner:
        async def live_workers() -> list[str]:
            return [worker]  # alone: its share is every partition

        async def dispatch(p: int, msg: Msg, done: Callable[[], None]) -> None:
            done()

        return PartitionOwner(
            nc=self.nc,
            js=self.js,
            leases=LeaseManager(self.kv, worker, TTL_S),
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
        return set(await consumer_names(self.nc, STREAM))

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
        await mon.subscribe("$JS.API.>", cb=api.on_request)
        await mon.flush()
        yield _Setup(nc, js, kv, mon, api)
    finally:
        await nc.close()
        await mon.close()


async def test_a_takeover_round_lists_names_once_and_deletes_only_the_earlier_consumers(
    setup: _Setup,
) -> None:
    others = {
        consumer_name("default", f"other{t}", p, epoch=1)
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
    assert counts["CONSUMER.NAMES"] == 1, counts  # one page: 336 names (1024 a page)
    assert counts["CONSUMER.DELETE"] == PARTITIONS, counts  # exactly the earlier owner's, by name
    assert counts["CONSUMER.CREATE"] == PARTITIONS, counts
    assert counts["CONSUMER.INFO"] == 0, counts
    now = await setup.names()
    assert now & earlier == set()
    assert others <= now  # no other type's consumer touched
    await second.release_all()


async def test_a_consumer_made_since_the_rounds_listing_is_found_by_listing_again(setup: _Setup) -> None:
    first = setup.owner("w-a", partitions=1)
    await first.rebalance()
    (earlier,) = await setup.names()
    await first.release_all()

    second = setup.owner("w-b", partitions=1)
    second._names = []  # listed before the earlier owner made its consumer
    lease = await second.leases.try_acquire(lease_key("default", "echo", 0))
    assert lease is not None
    await setup.counted()
    await second._take(0, lease)  # the work queue refuses the overlapping consumer: list again
    assert (await setup.counted())["CONSUMER.NAMES"] == 1
    assert await setup.names() == {second.owned[0][1].durable}
    assert earlier != second.owned[0][1].durable
    await second.release_all()


async def test_a_consumer_named_before_epochs_is_deleted(setup: _Setup) -> None:
    legacy = consumer_name("default", "echo", 0)  # `px__default__echo__0`, one name for every owner
    await setup.consumer(legacy, "echo", 0)
    owner = setup.owner("w-b", partitions=1)
    await owner.rebalance()
    assert await setup.names() == {owner.owned[0][1].durable}
    await owner.release_all()


async def test_shortened_names_are_told_apart_by_their_filter(setup: _Setup) -> None:
    # Names over 255 characters end in a hash: these types' names share their first 188 characters, and
    # every partition's name as well. The owner reads such consumers' filters before deleting any.
    long_type, neighbour = "t" * 250, "t" * 250 + "x"
    for p in range(2):
        await setup.consumer(consumer_name("default", neighbour, p, epoch=7), neighbour, p)
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
    neighbours = {consumer_name("default", neighbour, p, epoch=7) for p in range(2)}
    assert await setup.names() == mine | neighbours
    await second.release_all()
