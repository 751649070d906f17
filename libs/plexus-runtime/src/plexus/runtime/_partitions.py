"""Partition ownership and pulling for durable agent types.

A worker owns partitions of each durable agent type through KV leases (`_leases.py`). For each owned
partition it deletes any previous consumer and creates a fresh durable pull consumer: the inbox stream is a
work queue, so a fresh consumer starts at the oldest unacknowledged message — in-flight work of a dead or
displaced owner is redelivered at once and in order, and a zombie's late acks hit a consumer that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from ._leases import Lease, LeaseManager, plan_partitions
from ._subjects import Subjects, consumer_name, lease_key

__all__ = ["PartitionOwner"]

log = logging.getLogger("plexus.worker")

#: ``dispatch(partition, msg, done)``: the worker calls ``done()`` once the message is acked or dropped.
Dispatch = Callable[[int, Msg, Callable[[], None]], Awaitable[None]]


class _Puller:
    """Pulls one partition's consumer and hands messages to `dispatch` while slots are free."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        durable: str,
        partition: int,
        dispatch: Callable[[int, Msg], Awaitable[None]],
        slots: asyncio.Semaphore,
    ) -> None:
        self.js = js
        self.stream = stream
        self.durable = durable
        self.partition = partition
        self.dispatch = dispatch
        self.slots = slots
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"pull:{self.durable}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
            self.task = None

    async def _run(self) -> None:
        sub = await self.js.pull_subscribe_bind(self.durable, stream=self.stream)
        try:
            while True:
                # Never fetch more than we have free handler slots for: memory stays bounded and unfetched
                # messages stay in the stream where another owner could take them.
                await self.slots.acquire()
                free = 1
                while free < 64 and not self.slots.locked():
                    await self.slots.acquire()
                    free += 1
                try:
                    msgs = await sub.fetch(free, timeout=1.0)
                except TimeoutError:
                    msgs = []
                except asyncio.CancelledError:
                    # Stopped mid-fetch (partition released or lost): hand the slots back, or the worker
                    # would keep fewer handler slots after every rebalance and finally stop pulling at all.
                    for _ in range(free):
                        self.slots.release()
                    raise
                except Exception as exc:  # a deleted consumer (partition lost) or a reconnect
                    log.debug("fetch on %s failed: %s", self.durable, exc)
                    msgs = []
                    for _ in range(free):  # before the pause, which a stop() may cancel
                        self.slots.release()
                    free = 0
                    await asyncio.sleep(0.2)
                for _ in range(free - len(msgs)):
                    self.slots.release()
                for msg in msgs:
                    try:
                        await self.dispatch(self.partition, msg)
                    except Exception:  # e.g. an ack during a reconnect: never let the puller die silently
                        log.exception("dispatch on %s failed; the message will be redelivered", self.durable)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


class PartitionOwner:
    """Keeps this worker's fair share of one durable agent type's partitions and pulls them."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        leases: LeaseManager,
        subjects: Subjects,
        stream: str,
        agent_type: str,
        partitions: int,
        worker_id: str,
        live_workers: Callable[[], Awaitable[list[str]]],
        dispatch: Dispatch,
        slots: asyncio.Semaphore,
        ack_wait_s: float,
        max_ack_pending: int,
        on_lost: Callable[[int], None],
        on_taken: Callable[[int], None] | None = None,
    ) -> None:
        self.js = js
        self.leases = leases
        self.subjects = subjects
        self.stream = stream
        self.agent_type = agent_type
        self.partitions = partitions
        self.worker_id = worker_id
        self.live_workers = live_workers
        self.dispatch = dispatch
        self.slots = slots
        self.ack_wait_s = ack_wait_s
        self.max_ack_pending = max_ack_pending
        self.on_lost = on_lost
        self.on_taken = on_taken
        self.owned: dict[int, tuple[Lease, _Puller]] = {}
        #: Partitions given up in a rebalance whose fetched work is still running: the lease is kept (and
        #: renewed) until that work is acked, so the next owner never runs it a second time concurrently.
        self.handing_over: dict[int, Lease] = {}
        self.inflight: dict[int, int] = {}
        self.draining = False

    def _lease_key(self, p: int) -> str:
        return lease_key(self.subjects.namespace, self.agent_type, p)

    def _durable(self, p: int) -> str:
        return consumer_name(self.subjects.namespace, self.agent_type, p)

    async def _on_message(self, p: int, msg: Msg) -> None:
        self.inflight[p] = self.inflight.get(p, 0) + 1
        await self.dispatch(p, msg, lambda: self._done(p))

    def serves(self, p: int) -> bool:
        """Whether work fetched from partition `p` may still run here (owned, or being handed over)."""
        return p in self.owned or p in self.handing_over

    def _done(self, p: int) -> None:
        self.inflight[p] -= 1

    async def _finish_handovers(self) -> None:
        for p, lease in list(self.handing_over.items()):
            if self.inflight.get(p, 0) > 0:
                renewed = await self.leases.renew(lease)
                if renewed is not None:
                    self.handing_over[p] = renewed
                    continue
            del self.handing_over[p]
            with contextlib.suppress(Exception):
                await self.leases.release(lease)

    async def rebalance(self) -> None:
        """One round: renew what we hold, release surplus, acquire free partitions up to our share."""
        await self._finish_handovers()
        for p, (lease, puller) in list(self.owned.items()):
            renewed = await self.leases.renew(lease)
            if renewed is None:
                log.warning("lost lease on %s partition %d", self.agent_type, p)
                await self._drop(p, release=False)
                self.on_lost(p)
            else:
                self.owned[p] = (renewed, puller)
        if self.draining:
            return
        workers = await self.live_workers()
        if self.worker_id not in workers:
            workers = [*workers, self.worker_id]
        holders = await self.leases.holders()
        held_by_others: dict[int, str] = {}
        for p in range(self.partitions):
            holder = holders.get(self._lease_key(p))
            if p in self.handing_over:
                held_by_others[p] = f"{self.worker_id} (handing over)"
            elif p not in self.owned and holder is not None and holder != self.worker_id:
                held_by_others[p] = holder
        to_acquire, to_release = plan_partitions(
            self.partitions, self.worker_id, workers, set(self.owned), held_by_others
        )
        for p in to_release:
            await self._drop(p, release=True)
        for p in to_acquire:
            acquired = await self.leases.try_acquire(self._lease_key(p))
            if acquired is not None:
                await self._take(p, acquired)

    async def _take(self, p: int, lease: Lease) -> None:
        durable = self._durable(p)
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(self.stream, durable)
        await self.js.add_consumer(
            self.stream,
            js_api.ConsumerConfig(
                durable_name=durable,
                filter_subject=self.subjects.inbox_partitioned_filter(self.agent_type, p),
                ack_policy=js_api.AckPolicy.EXPLICIT,
                deliver_policy=js_api.DeliverPolicy.ALL,
                ack_wait=self.ack_wait_s,
                max_ack_pending=self.max_ack_pending,
                max_deliver=-1,
            ),
        )
        if self.on_taken is not None:
            # Whatever this worker cached for the partition's agents may be older than what another owner
            # committed meanwhile: forget it, so activations reload from the newest checkpoint.
            self.on_taken(p)
        puller = _Puller(self.js, self.stream, durable, p, self._on_message, self.slots)
        puller.start()
        self.owned[p] = (lease, puller)
        log.info("%s took %s partition %d", self.worker_id, self.agent_type, p)

    async def _drop(self, p: int, *, release: bool) -> None:
        entry = self.owned.pop(p, None)
        if entry is None:
            return
        lease, puller = entry
        await puller.stop()
        if release:
            # Keep the lease until the work already fetched from this partition is acked.
            self.handing_over[p] = lease
            await self._finish_handovers()

    async def release_all(self) -> None:
        """Release every lease (after a graceful stop has finished or abandoned the in-flight work)."""
        self.draining = True
        for p in list(self.owned):
            await self._drop(p, release=True)
        for p, lease in list(self.handing_over.items()):
            del self.handing_over[p]
            with contextlib.suppress(Exception):
                await self.leases.release(lease)

    async def stop_pulling(self) -> None:
        """Stop fetching new work but keep the leases (graceful shutdown finishes in-flight work first)."""
        self.draining = True
        for _, puller in list(self.owned.values()):
            await puller.stop()
