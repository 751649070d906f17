"""A partition's handover against a real nats-server: the lease it releases is the one it holds now."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats
from nats.aio.msg import Msg
from nats.js import api as js_api

from plexus.runtime.store._consumer_records import ConsumerRecords
from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.wire._subjects import Subjects
from plexus.runtime.worker._partitions import PartitionOwner

STREAM = "HANDOVER_INBOX"


async def test_a_handover_racing_a_lease_renewal_still_frees_the_lease(nats_url: str) -> None:
    # The lease renewal runs on its own timer; a rebalance that hands the partition over meanwhile used to
    # release with the revision it held before the renewal: the compare-and-swap failed, and the lease
    # stayed to block the next owner until it expired (a partition with no owner for a whole TTL).
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        subjects = Subjects("default")
        await js.add_stream(
            js_api.StreamConfig(
                name=STREAM,
                subjects=[f"{subjects.base}.inp.>"],
                retention=js_api.RetentionPolicy.WORK_QUEUE,
            )
        )
        kv = await js.create_key_value(bucket="handover_leases", history=1, ttl=30)
        records = await js.create_key_value(js_api.KeyValueConfig(bucket="handover_consumers", direct=True))
        live = ["w-a"]  # alone: its share is the one partition

        async def live_workers() -> list[str]:
            return list(live)

        async def dispatch(partition: int, msg: Msg, done: Callable[[], None]) -> None:
            raise AssertionError("no message is published in this test")

        owner = PartitionOwner(
            nc=nc,
            js=js,
            leases=LeaseManager(kv, "w-a", 30),
            consumers=ConsumerRecords(records, subjects.namespace),
            subjects=subjects,
            stream=STREAM,
            agent_type="echo",
            partitions=1,
            worker_id="w-a",
            live_workers=live_workers,
            dispatch=dispatch,
            slots=asyncio.Semaphore(4),
            ack_wait_s=30,
            max_ack_pending=8,
            on_lost=lambda p: None,
        )
        await owner.rebalance()
        assert set(owner.owned) == {0}
        for _ in range(5):
            renewal = asyncio.create_task(owner.renew_held())
            await asyncio.sleep(0)  # the renewal's request is on the wire, its answer not yet read
            await owner._drop(0, release=True)  # what `rebalance` does when a worker joins
            await renewal
            assert owner.owned == {}
            assert owner.handing_over == {}
            assert await owner.leases.holders() == {}, "the released lease is still held"
            await owner.rebalance()
            assert set(owner.owned) == {0}
        await owner.release_all()
    finally:
        await nc.close()
