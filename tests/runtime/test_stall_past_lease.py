"""A worker that stalls past its partition lease (SIGSTOP, a frozen VM) against a real nats-server.

Issue 36, item 5: a worker frozen past its lease resumed and, before its lease renewal told it the partition
was gone, pulled again from the partition's consumer, which the new owner had re-created under the same
name. What it fetched it did not start (its lease was no longer surely its own) and did not ack: the message
waited a whole ``ack_wait`` while the key's next messages were handled by the new owner (per-key FIFO broken).

Here the stall is the old owner's lease lapsing while nothing renews it (what a frozen process sees on
resuming: its clock is past the lease, its renewal has not run yet). Its puller and the messages it fetched
(held: never acked) are real, so is the server's handling of both owners' pull requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.kv import KeyValue

from plexus.runtime.store._consumer_records import ConsumerRecords
from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.wire._subjects import Subjects
from plexus.runtime.worker._partitions import PartitionOwner

STREAM = "STALL_INBOX"
TTL_S = 1.0
#: The new owner's ack_wait: far longer than any wait below, so a message left pending is never redelivered.
ACK_WAIT_S = 60.0
WAIT_S = 10.0


async def _eventually(probe: Callable[[], object], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _waiting_requests(js: JetStreamContext, filter_subject: str) -> int:
    """Pull requests waiting on the partition's consumers (whatever their names)."""
    infos = await js.consumers_info(STREAM)
    return sum(i.num_waiting or 0 for i in infos if i.config.filter_subject == filter_subject)


class _Recorder:
    """One owner's handlers: record (key, n) of each message; ack it (its slot freed) unless holding."""

    def __init__(self, *, hold: bool) -> None:
        self.hold = hold
        self.got: list[tuple[str, int]] = []
        self.slots = asyncio.Semaphore(16)

    async def dispatch(self, partition: int, msg: Msg, done: Callable[[], None]) -> None:
        key = msg.subject.rsplit(".", 1)[1]
        self.got.append((key, int(msg.data)))
        if not self.hold:
            await msg.ack()
            self.slots.release()
            done()


def _owner(
    nc: NATS,
    js: JetStreamContext,
    kv: object,
    records: KeyValue,
    worker: str,
    subjects: Subjects,
    recorder: _Recorder,
) -> PartitionOwner:
    async def live_workers() -> list[str]:
        return [worker]  # each thinks itself alone: the share is the one partition

    return PartitionOwner(
        nc=nc,
        js=js,
        leases=LeaseManager(kv, worker, TTL_S),  # type: ignore[arg-type]
        consumers=ConsumerRecords(records, subjects.namespace),
        subjects=subjects,
        stream=STREAM,
        agent_type="echo",
        partitions=1,
        worker_id=worker,
        live_workers=live_workers,
        dispatch=recorder.dispatch,
        slots=recorder.slots,
        ack_wait_s=ACK_WAIT_S,
        max_ack_pending=64,
        on_lost=lambda p: None,
        max_batch=8,
    )


async def test_a_worker_stalled_past_its_lease_never_takes_the_new_owners_messages(nats_url: str) -> None:
    subjects = Subjects("default")
    nc_a = await nats.connect(nats_url)
    nc_b = await nats.connect(nats_url)
    try:
        js = nc_a.jetstream()
        await js.add_stream(
            js_api.StreamConfig(
                name=STREAM,
                subjects=[f"{subjects.base}.inp.>"],
                retention=js_api.RetentionPolicy.WORK_QUEUE,
            )
        )
        kv = await js.create_key_value(bucket="stall_leases", history=1, ttl=TTL_S)
        records = await js.create_key_value(js_api.KeyValueConfig(bucket="stall_consumers", direct=True))
        old, new = _Recorder(hold=True), _Recorder(hold=False)
        a = _owner(nc_a, js, kv, records, "w-a", subjects, old)
        b = _owner(nc_b, nc_b.jetstream(), kv, records, "w-b", subjects, new)

        async def send(key: str, n: int) -> None:
            await js.publish(subjects.inbox_partitioned("echo", 0, key), str(n).encode())

        # The old owner fetches the first messages of two keys; its handlers hold them (never acked).
        await a.rebalance()
        assert set(a.owned) == {0}
        for n in range(1, 4):
            await send("k11", n)
            await send("k12", n)
        await _eventually(lambda: len(old.got) == 6, "the old owner to fetch the first messages")

        # Its lease lapses unrenewed (the process is frozen); the new owner takes the partition.
        await _eventually(lambda: not a.may_start(0), "the old owner's lease to run out")
        while not set(b.owned):
            await asyncio.sleep(0.1)
            await b.rebalance()

        # The old owner's puller is still running: the process resumed before its renewal. Give it time to
        # pull again (on the old code its request reached the new owner's consumer, under the same name).
        for _ in range(30):
            if await _waiting_requests(js, subjects.inbox_partitioned_filter("echo", 0)) >= 2:
                break
            await asyncio.sleep(0.1)

        # The key's next messages: every one is the new owner's, after the held ones, in order.
        for n in range(4, 21):
            await send("k11", n)
            await send("k12", n)
        expected = {key: list(range(1, 21)) for key in ("k11", "k12")}

        def by_key() -> dict[str, list[int]]:
            out: dict[str, list[int]] = {"k11": [], "k12": []}
            for key, n in new.got:
                out[key].append(n)
            return out

        for _ in range(int(WAIT_S / 0.05)):  # then what arrived is compared (and told)
            if by_key() == expected:
                break
            await asyncio.sleep(0.05)
        assert len(old.got) == 6, f"the stalled worker fetched the new owner's messages: {old.got[6:]}"
        assert by_key() == expected  # redelivered at once (not after ack_wait), each once, per key in order
        await b.release_all()
        await a.release_all()
    finally:
        await nc_a.close()
        await nc_b.close()
