"""Partition ownership and pulling for durable agent types.

A worker owns partitions of each durable agent type through KV leases (`_leases.py`). For each owned
partition it deletes the previous consumer of the partition (the one its record in ``plexus_consumers``
names: `store._consumer_records`) and creates a fresh durable pull consumer, named for this ownership with
a random nonce nobody else can guess: the inbox stream is a work queue, so a fresh consumer starts at the
oldest unacknowledged message — in-flight work of a dead or displaced owner is redelivered at once and in
order. A displaced owner that has not noticed yet (it stalled
past its lease) still pulls and acks under its own consumer's name, which is gone: it can never fetch a
message from its successor's consumer (which, not started there, waited ``ack_wait`` while the key's next
messages went ahead) nor ack one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, KeyWrongLastSequenceError, NotFoundError

from plexus.runtime.ops._telemetry import INSTRUMENTS
from plexus.runtime.store._consumer_records import ConsumerRecords
from plexus.runtime.store._leases import Lease, LeaseManager, plan_partitions
from plexus.runtime.wire._subjects import Subjects, consumer_name, lease_key

__all__ = ["PartitionOwner"]

log = logging.getLogger("plexus.worker")

#: JetStream's "filtered consumer not unique on workqueue stream": a consumer of the partition still exists.
_NOT_UNIQUE = 10100

#: ``dispatch(partition, msg, done)``: the worker calls ``done()`` once the message is acked or dropped.
Dispatch = Callable[[int, Msg, Callable[[], None]], Awaitable[None]]


class _Puller:
    """Pulls one partition's consumer and hands messages to `dispatch` while slots are free.

    Pull requests are made here rather than through nats-py's `fetch`, which takes any message carrying a
    ``Status`` header for a server status line: a client could make its message invisible (never handled,
    never acked, redelivered forever) by adding ``Status: 404``. Here a JetStream delivery is recognised by
    its ``$JS.ACK.`` reply subject, which a real status message never has.
    """

    #: How long the server keeps one pull request open (it answers 408 when it expires unfilled).
    EXPIRES_S = 1.0

    def __init__(
        self,
        nc: NATS,
        stream: str,
        durable: str,
        partition: int,
        dispatch: Callable[[int, Msg], Awaitable[None]],
        slots: asyncio.Semaphore,
        max_batch: int = 64,
    ) -> None:
        self.nc = nc
        self.max_batch = max_batch
        self.stream = stream
        self.durable = durable
        self.partition = partition
        self.dispatch = dispatch
        self.slots = slots
        self.task: asyncio.Task[None] | None = None
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._stopped = False
        self._got = 0  # deliveries received for the pull request in flight

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"pull:{self.durable}")

    async def stop(self) -> None:
        self._stopped = True
        task, self.task = self.task, None
        # Cancel until it ends: nats-py swallows a CancelledError that lands inside a publish (a dispatch
        # dead-lettering or answering), so one cancel may not stop the loop; the flag ends it then.
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()

    async def _run(self) -> None:
        inbox = self.nc.new_inbox()
        # Deliveries wait in a queue of our own: nats-py's `next_msg` wraps every wait in a task (and draws a
        # uuid4 for it), a tenth of a busy worker's pull path; most deliveries are there already.
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def deliver(msg: Msg) -> None:
            queue.put_nowait(msg)

        sub = await self.nc.subscribe(inbox, cb=deliver)
        request = json.dumps({"batch": 0, "expires": int(self.EXPIRES_S * 1e9)})
        me = asyncio.current_task()
        try:
            # `cancelling()` as well as the flag: nats-py can swallow a CancelledError inside a publish, and a
            # loop that ignores it would keep an event loop from ever closing.
            while not self._stopped and not (me is not None and me.cancelling()):
                # Never ask for more than we have free handler slots for: memory stays bounded and unfetched
                # messages stay in the stream where another owner could take them.
                await self.slots.acquire()
                free = 1
                while free < self.max_batch and not self.slots.locked():
                    await self.slots.acquire()
                    free += 1
                self._got = 0
                failed = False
                try:
                    body = request.replace('"batch": 0', f'"batch": {free}', 1).encode()
                    await self.nc.publish(self._next_subject, body, reply=inbox)
                    failed = await self._receive(queue, free)
                except asyncio.CancelledError:
                    # Stopped mid-pull (partition released or lost): hand back the slots no delivery took,
                    # or the worker would keep fewer slots after every rebalance and finally stop pulling.
                    for _ in range(free - self._got):
                        self.slots.release()
                    raise
                except Exception as exc:  # a reconnect: the request is lost, ask again
                    log.debug("pull on %s failed: %s", self.durable, exc)
                    failed = True
                for _ in range(free - self._got):  # before the pause, which a stop() may cancel
                    self.slots.release()
                if failed:
                    await asyncio.sleep(0.2)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _receive(self, queue: asyncio.Queue[Msg], wanted: int) -> bool:
        """Dispatch the deliveries answering one pull request (counted in `_got`, each holding one of the
        slots taken for the request); True when the request failed."""
        deadline = asyncio.get_running_loop().time() + self.EXPIRES_S + 1.0
        while self._got < wanted and not self._stopped:
            if queue.empty():
                # Not `except QueueEmpty: await ...`: an idle puller would hold the exception, its traceback
                # and frame for as long as it waits (16 pullers, each pinning its blocks in some arena).
                try:
                    async with asyncio.timeout_at(deadline):
                        msg = await queue.get()
                except TimeoutError:
                    return False  # the 408 was lost (e.g. a reconnect): ask again
            else:
                msg = queue.get_nowait()
            if msg.reply and msg.reply.startswith("$JS.ACK."):
                self._got += 1
                try:
                    await self.dispatch(self.partition, msg)
                except Exception:  # never let the puller die silently
                    log.exception("dispatch on %s failed; the message will be redelivered", self.durable)
                continue
            status = (msg.headers or {}).get("Status", "")
            if status == "100":  # idle heartbeat / flow control
                continue
            if status in ("404", "408"):  # no messages now / the request expired
                return False
            # 409 (consumer deleted: the partition was lost, leadership change), 503 (no responders), …
            log.debug("pull on %s ended with status %r", self.durable, status)
            return True
        return False


class PartitionOwner:
    """Keeps this worker's fair share of one durable agent type's partitions and pulls them."""

    def __init__(
        self,
        *,
        nc: NATS,
        js: JetStreamContext,
        leases: LeaseManager,
        consumers: ConsumerRecords,
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
        max_batch: int = 64,
    ) -> None:
        self.nc = nc
        #: Slots one pull request may reserve. Idle partitions hold theirs until the request expires, so
        #: the worker caps this to leave every puller an open request (else a partition could wait for
        #: another's request to expire, ~1 s, before its first message is even fetched).
        self.max_batch = max_batch
        self.js = js
        self.leases = leases
        self.consumers = consumers
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
        #: Monotonic time until which each held lease is certainly ours: the start of its last successful
        #: acquire/renew request plus the TTL. A worker that stalled (SIGSTOP, GC, frozen VM) past it may
        #: have lost the partition without knowing yet, so it must not start that partition's work.
        self.fresh_until: dict[int, float] = {}
        #: The inbox stream's last sequence when each partition was taken (its previous consumer deleted):
        #: a message stored up to there may have been handled, committed and left unacked by the previous
        #: owner, yet this worker's fresh consumer delivers it as a first delivery.
        self.taken_at_seq: dict[int, int] = {}
        #: Partitions whose last renewal got no answer (it may have been applied): see `_renew`.
        self._unsure: set[int] = set()
        #: Serialises the lease writes of `renew_held` (its own timer) and of handovers (`rebalance`): a
        #: handover releasing with the revision it held while a renewal of that lease was in flight failed
        #: the compare-and-swap and left the lease to block the next owner until it expired.
        self._lease_writes = asyncio.Lock()
        #: Partitions whose take found a consumer no record names (reported once, see `_take`).
        self._blocked: set[int] = set()
        #: The renewal round `confirm` started, shared by the handlers that asked meanwhile.
        self._confirming: asyncio.Future[None] | None = None
        self.draining = False

    def _lease_key(self, p: int) -> str:
        return lease_key(self.subjects.namespace, self.agent_type, p)

    def _durable(self, p: int) -> str:
        # Named for this ownership with 128 random bits: a name is all it takes to pull, ack or delete.
        return consumer_name(
            self.subjects.namespace, self.agent_type, p, self.subjects.prefix, nonce=secrets.token_hex(16)
        )

    async def _on_message(self, p: int, msg: Msg) -> None:
        self.inflight[p] = self.inflight.get(p, 0) + 1
        await self.dispatch(p, msg, lambda: self._done(p))

    def serves(self, p: int) -> bool:
        """Whether work fetched from partition `p` may still run here (owned, or being handed over)."""
        return p in self.owned or p in self.handing_over

    def stored_before_taken(self, p: int, stream_seq: int) -> bool:
        """Whether the message at `stream_seq` of partition `p` was stored before this worker took `p`."""
        return stream_seq <= self.taken_at_seq.get(p, 0)

    def may_start(self, p: int) -> bool:
        """Whether a message of partition `p` may start now: served here and the lease surely still ours."""
        return self.serves(p) and time.monotonic() < self.fresh_until.get(p, 0.0)

    async def confirm(self, p: int) -> bool:
        """Whether partition `p`'s lease is ours, asking the store when it is not certainly fresh.

        A handler's effects (progress, sends, spawns, …) call this when `may_start` says no: the process may
        have stalled past its lease (SIGSTOP, a frozen VM) with its handler in the middle of its work. A
        renewal settles it: renewed, the handler goes on; gone (or no answer), it must stop. Callers at the
        same time share one renewal round."""
        if self.may_start(p):
            return True
        if not self.serves(p):
            return False
        if self._confirming is None or self._confirming.done():
            self._confirming = asyncio.ensure_future(self.renew_held())
        with contextlib.suppress(Exception):
            await asyncio.shield(self._confirming)
        if not self.may_start(p) and p in self.handing_over:
            # A handed-over lease is renewed by `_finish_handovers` (one by one: only when one is asked for).
            with contextlib.suppress(Exception):
                await self._finish_handovers()
        return self.may_start(p)

    async def _renew(self, p: int, lease: Lease) -> Lease | None:
        started = time.monotonic()
        try:
            renewed = await self.leases.renew(lease)
        except Exception:
            # No answer (a leader election, a reconnect): the renewal may still have been applied, which
            # makes the revision we hold stale. The next round checks before calling the lease lost.
            self._unsure.add(p)
            raise
        if renewed is None and p in self._unsure:
            renewed = await self.leases.recover(lease)
        self._unsure.discard(p)
        if renewed is not None:
            self.fresh_until[p] = started + self.leases.ttl_s
        return renewed

    async def renew_held(self) -> None:
        """Renew every held lease at once, on a timer of its own (not in `rebalance`, whose acquisitions
        and consumer creations can take longer than a TTL while the cluster elects leaders).

        A renewal that gets no answer keeps its partition for now: `may_start` stops new work once the
        lease may have run out, and the next call asks again. Only a lease the store says is gone is
        dropped. (Renewed one by one inside the rebalance round, every lease ran out together after a
        node loss.)"""
        async with self._lease_writes:
            await self._renew_held()

    async def _renew_held(self) -> None:
        held = list(self.owned.items())
        results = await asyncio.gather(
            *(self._renew(p, lease) for p, (lease, _) in held), return_exceptions=True
        )
        unanswered = 0
        for (p, (lease, puller)), result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                unanswered += 1
            elif self.owned.get(p, (None, None))[1] is not puller:
                # Dropped or re-taken meanwhile by `rebalance`; a handover keeps the renewed revision.
                if result is not None and self.handing_over.get(p) is lease:
                    self.handing_over[p] = result
                continue
            elif result is None:
                log.warning("lost lease on %s partition %d", self.agent_type, p)
                await self._drop(p, release=False)
                self.on_lost(p)
            else:
                self.owned[p] = (result, puller)
        if unanswered:
            log.warning(
                "%d %s lease renewals got no answer; asking again next round", unanswered, self.agent_type
            )

    def _done(self, p: int) -> None:
        self.inflight[p] -= 1

    async def _finish_handovers(self) -> None:
        async with self._lease_writes:
            await self._finish_handovers_locked()

    async def _finish_handovers_locked(self) -> None:
        for p, lease in list(self.handing_over.items()):
            if self.inflight.get(p, 0) > 0:
                renewed = await self._renew(p, lease)
                if renewed is not None:
                    self.handing_over[p] = renewed
                    continue
            del self.handing_over[p]
            with contextlib.suppress(Exception):
                await self.leases.release(lease)

    async def rebalance(self) -> None:
        """One round: release surplus, acquire free partitions up to our share (`renew_held` renews)."""
        await self._finish_handovers()
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
            started = time.monotonic()
            acquired = await self.leases.try_acquire(self._lease_key(p))
            if acquired is not None:
                self.fresh_until[p] = started + self.leases.ttl_s
                await self._take(p, acquired)

    async def _take(self, p: int, lease: Lease) -> None:
        durable = self._durable(p)
        filter_subject = self.subjects.inbox_partitioned_filter(self.agent_type, p)
        try:
            await self._replace_consumer(p, durable, filter_subject)
        except KeyWrongLastSequenceError:
            # Another take recorded its consumer since we read the record: it is the newer owner.
            log.warning("%s partition %d was taken meanwhile; giving it up", self.agent_type, p)
            await self._give_up(p, lease)
            return
        except APIError as exc:
            if exc.err_code != _NOT_UNIQUE:
                raise
            # A consumer of the partition that no record names: made before records existed (an upgrade),
            # or by an owner that stalled past its lease. Only the operator may list the inbox's consumers.
            report = log.error if p not in self._blocked else log.debug
            self._blocked.add(p)
            report(
                "cannot take %s partition %d: an inbox consumer no record names reads it; run `plexus "
                "topology` as the operator to delete it",
                self.agent_type,
                p,
            )
            await self._give_up(p, lease)
            return
        self._blocked.discard(p)
        if self.on_taken is not None:
            # Whatever this worker cached for the partition's agents may be older than what another owner
            # committed meanwhile: forget it, so activations reload from the newest checkpoint.
            self.on_taken(p)
        puller = _Puller(self.nc, self.stream, durable, p, self._on_message, self.slots, self.max_batch)
        puller.start()
        self.owned[p] = (lease, puller)
        INSTRUMENTS.partitions_owned.add(1, {"agent_type": self.agent_type, "worker": self.worker_id})
        log.debug("%s took %s partition %d", self.worker_id, self.agent_type, p)

    async def _give_up(self, p: int, lease: Lease) -> None:
        self.fresh_until.pop(p, None)
        async with self._lease_writes:
            with contextlib.suppress(Exception):
                await self.leases.release(lease)

    async def _replace_consumer(self, p: int, durable: str, filter_subject: str) -> None:
        """Delete the recorded consumer of partition `p` (a work queue stream allows one per filter anyway:
        what its owner fetched and did not ack becomes deliverable again, first, to the consumer made here),
        record `durable` (compare-and-swap on the revision read), then create it. Recorded before it exists,
        so a consumer a worker made is always named by the record or already deleted."""
        earlier, revision = await self.consumers.read(self.agent_type, p)
        if earlier is not None:
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(self.stream, earlier)
        await self.consumers.record(self.agent_type, p, durable, revision)
        # Read after the deletion: whatever the previous consumer delivered is stored at or before this.
        self.taken_at_seq[p] = (await self.js.stream_info(self.stream)).state.last_seq
        await self.js.add_consumer(
            self.stream,
            js_api.ConsumerConfig(
                # `name` too: nats-py then creates through CONSUMER.CREATE.<stream>.<name>.<filter>, the
                # subject by which a worker group's permissions confine it to its own types' partitions.
                name=durable,
                durable_name=durable,
                filter_subject=filter_subject,
                ack_policy=js_api.AckPolicy.EXPLICIT,
                deliver_policy=js_api.DeliverPolicy.ALL,
                ack_wait=self.ack_wait_s,
                max_ack_pending=self.max_ack_pending,
                max_deliver=-1,
            ),
        )

    async def _drop(self, p: int, *, release: bool) -> None:
        entry = self.owned.pop(p, None)
        if entry is None:
            return
        INSTRUMENTS.partitions_owned.add(-1, {"agent_type": self.agent_type, "worker": self.worker_id})
        lease, puller = entry
        if release:
            # Keep the lease until the work already fetched from this partition is acked. Handed over from
            # this instant, so a renewal in flight (`renew_held`) updates this entry's revision.
            self.handing_over[p] = lease
        await puller.stop()
        if release:
            await self._finish_handovers()

    async def release_all(self) -> None:
        """Release every lease (after a graceful stop has finished or abandoned the in-flight work)."""
        self.draining = True
        for p in list(self.owned):
            await self._drop(p, release=True)
        async with self._lease_writes:
            for p, lease in list(self.handing_over.items()):
                del self.handing_over[p]
                with contextlib.suppress(Exception):
                    await self.leases.release(lease)

    async def stop_pulling(self) -> None:
        """Stop fetching new work but keep the leases (graceful shutdown finishes in-flight work first)."""
        self.draining = True
        for _, puller in list(self.owned.values()):
            await puller.stop()
