"""The worker's upkeep: its timers (heartbeats, lease renewal, rebalancing, passivation, the in-progress
sweeper that keeps fetched messages from being redelivered while this worker lives) and what it does when
a partition is taken or lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from collections.abc import Set as AbstractSet

from plexus.core import AgentId, forget_parsed_ids
from plexus.runtime._agent import AgentType
from plexus.runtime._app import App
from plexus.runtime.ops._denials import raise_on_denial
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._outage import is_unavailable
from plexus.runtime.store._registry import AgentTypeInfo, WorkerInfo
from plexus.runtime.wire._subjects import checkpoint_key, inbox_partition

from ._activation import ActivationTable
from ._config import WorkerConfig
from ._delta import STATE_DELTAS
from ._mailbox import Mailboxes
from ._partitions import PartitionOwner
from .pipeline._run_control import cancel_hard
from .pipeline._work import Work

#: A passivation round that drops at least this many activations rebuilds the table (a dict never shrinks)
#: and empties the caches of per-key values (`_let_go`).
_COMPACT_AFTER = 1_000

__all__ = ["Upkeep"]

log = logging.getLogger("plexus.worker")


class Upkeep:
    """The worker's timers, its registration and what it does when a partition is taken or lost. Held by
    `Worker`, built with what it reads: the partition owners and the unacked work are the worker's (it fills
    them as it starts and as messages come and go); this reads them."""

    def __init__(
        self,
        connection: Connection,
        app: App,
        config: WorkerConfig,
        worker_id: str,
        *,
        started_at: float,
        owners: Mapping[str, PartitionOwner],
        unacked: AbstractSet[Work],
        activations: ActivationTable,
        mailboxes: Mailboxes[AgentId, Work],
        topic_groups: dict[str, str],
    ) -> None:
        self.connection = connection
        self.app = app
        self.config = config
        self.worker_id = worker_id
        self.started_at = started_at
        self._owners = owners
        self._unacked = unacked
        self._activations = activations
        self._mailboxes = mailboxes
        self._topic_groups = topic_groups
        self._stoppers: set[asyncio.Future[None]] = set()  # handlers being stopped after a lost lease
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------------------
    async def register(self) -> None:
        """Register the app's agent types (waiting out the cluster's outages: `_patiently`)."""
        await self._patiently(self._register_types)

    async def start(self) -> None:
        """The first heartbeat and rebalance, then the timers. Leases are renewed from the first one taken:
        a first round that waits for the cluster must not let the partitions it already holds expire."""
        self._tasks.append(asyncio.create_task(self._keep_leases(), name="worker-leases"))
        try:
            await self._patiently(self._first_round)
        except BaseException:
            self._tasks[-1].cancel()
            raise
        self._tasks.append(asyncio.create_task(self._maintain(), name="worker-maintain"))
        self._tasks.append(asyncio.create_task(self._keep_alive(), name="worker-keepalive"))

    async def stop(self) -> None:
        """End the timers (last in a graceful stop: leases stay renewed while in-flight work drains)."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    async def _heartbeat(self) -> None:
        await self.connection.registry.heartbeat(
            WorkerInfo(
                worker_id=self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                started_at=self.started_at,
                heartbeat_at=time.time(),
                types=[f"{t.namespace}/{t.name}" for t in self.app.types.values()],
                concurrency=self.config.concurrency,
                topic_groups=self._topic_groups,
                features=[STATE_DELTAS],
            )
        )

    async def _patiently(self, step: Callable[[], Awaitable[None]]) -> None:
        """A step of `start`, again while the cluster does not answer (an election, a machine too loaded to
        answer in time) as any outage is waited for, up to `unavailable_retry_s`; other errors, and a
        connection closed for good, raise. A worker once died at start when a lease's create timed out,
        leaving its partitions unserved."""
        deadline = time.monotonic() + self.config.unavailable_retry_s
        delay = 0.2
        while True:
            try:
                # A permission the worker's user lacks is no outage either: it fails the start at once.
                return await raise_on_denial(step(), self.connection.nc)
            except Exception as exc:
                # A connection closed for good (a fatal server error) is not an outage to wait out.
                if (
                    not is_unavailable(exc)
                    or self.connection.nc.is_closed
                    or time.monotonic() + delay > deadline
                ):
                    raise
                log.warning(
                    "worker start waits for the cluster (%s): %r", getattr(step, "__name__", step), exc
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _register_types(self) -> None:
        for agent_type in self.app.types.values():
            await self.connection.registry.register_type(
                AgentTypeInfo(
                    namespace=agent_type.namespace,
                    type=agent_type.name,
                    description=agent_type.description,
                    capabilities=list(agent_type.capabilities),
                    durable=agent_type.durable,
                    partitions=self.connection.partitions,
                    metadata=dict(agent_type.metadata),
                )
            )

    async def _first_round(self) -> None:
        """The first heartbeat and rebalance (each idempotent: a retry re-does what is missing)."""
        await self._heartbeat()
        for owner in self._owners.values():
            await owner.rebalance()

    async def _maintain(self) -> None:
        """Heartbeats, rebalancing and passivation, on one timer; leases are renewed on a timer of their own
        (`_keep_leases`): a slow round here (consumer creation in an election) never lets them lapse."""
        # Runs on through a graceful stop (which ends it at the end): see `_keep_leases`.
        # It stops on a flag, not only on cancel: nats-py can swallow a CancelledError inside a publish.
        me = asyncio.current_task()
        while not self._closed and not (me is not None and me.cancelling()):
            await asyncio.sleep(self._period)
            for step in (self._heartbeat, *(o.rebalance for o in self._owners.values()), self.passivate):
                try:
                    await step()
                except Exception:  # one failed step (a NATS timeout) must not skip the others
                    log.exception("worker maintenance step %s failed", getattr(step, "__qualname__", step))

    async def _keep_leases(self) -> None:
        """Renew every held partition lease every period. Runs on through a graceful stop: the leases of
        partitions whose in-flight work is still draining must stay renewed, or another worker would run
        that work again."""
        me = asyncio.current_task()
        while not self._closed and not (me is not None and me.cancelling()):
            await asyncio.sleep(self._period)
            results = await asyncio.gather(
                *(o.renew_held() for o in self._owners.values()), return_exceptions=True
            )
            for result in results:
                if isinstance(result, Exception):
                    log.error("lease renewal failed", exc_info=result)

    @property
    def _period(self) -> float:
        return min(self.config.heartbeat_s, self.config.lease_ttl_s / 3)

    async def _keep_alive(self) -> None:
        """Every ack_wait/3, tell JetStream that every fetched, unacked message (queued in a mailbox or
        running) is still being worked on, so a long handler or a long queue is never redelivered while this
        worker lives. One sweeper for all messages: no task per message on the hot path."""
        interval = max(self.config.ack_wait_s / 3.0, 0.05)
        me = asyncio.current_task()
        # `cancelling()` too: a cancel swallowed inside `in_progress()` (a publish) must still end the loop.
        while not self._closed and not (me is not None and me.cancelling()):
            await asyncio.sleep(interval)
            for work in list(self._unacked):
                # Settled since the round began: skipped. A +WPI after a delayed nak would make JetStream
                # wait a whole ack_wait again (the check and the publish's write run without a pause).
                if work not in self._unacked:
                    continue
                with contextlib.suppress(Exception):  # acked meanwhile, or reconnecting: next round
                    await work.msg.in_progress()

    async def passivate(self) -> None:
        """Drop the activations idle for `idle_passivate_s`, and the oldest beyond `max_activations`."""
        busy = self._mailboxes.busy_keys
        victims = self._activations.idle(self.config.idle_passivate_s, busy)
        excess = len(self._activations) - self.config.max_activations
        if excess > 0:
            victims += self._activations.oldest(excess, busy)
        for activation in victims:
            with contextlib.suppress(Exception):
                await activation.agent.on_passivate()
            self._activations.drop(activation.agent_id)
        if len(victims) >= _COMPACT_AFTER:
            self._let_go()

    def _let_go(self) -> None:
        """After a large round, what the dropped keys left in the worker's per-key caches goes too: the last
        thousands of parsed ids and checkpoint keys were those of the burst that made the activations, and
        each held a few blocks in most of the allocator's arenas, so none could be given back (full keys
        bench, one burst of 300,000: 501 → 374 MB after passivating all, 271 of 586 arenas given back)."""
        self._activations.compact()
        forget_parsed_ids()
        checkpoint_key.cache_clear()

    # -- a partition owner's callbacks -------------------------------------------------------------------
    def live_workers(self, agent_type: AgentType) -> Callable[[], Awaitable[list[str]]]:
        """The ids of the live workers hosting `agent_type` (its owner balances partitions among them)."""
        ns_type = f"{agent_type.namespace}/{agent_type.name}"

        async def live() -> list[str]:
            return [w.worker_id for w in await self.connection.registry.live_workers(ns_type)]

        return live

    def _forget_partition(self, agent_type: str, partition: int) -> None:
        for activation in self._activations.of_type(agent_type):
            if inbox_partition(activation.agent_id.key, self.connection.partitions) == partition:
                self._activations.drop(activation.agent_id)

    def partition_taken(self, agent_type: str) -> Callable[[int], None]:
        return lambda partition: self._forget_partition(agent_type, partition)

    def partition_lost(self, agent_type: str) -> Callable[[int], None]:
        def lost(partition: int) -> None:
            # Another worker owns it now: queued work of it is skipped (not acked; the owner's fresh consumer
            # has it) and cached activations are dropped, so no second activation lives on here.
            log.warning(
                "partition %s/%d lost; dropping its activations and queued work", agent_type, partition
            )
            self._forget_partition(agent_type, partition)
            for work in list(self._unacked):
                if work.agent_type.name == agent_type and work.partition == partition:
                    work.lease_lost = True  # queued: never started; running: stopped, not committed
                    if work.task is not None:
                        stopper = asyncio.ensure_future(cancel_hard(work.task))
                        self._stoppers.add(stopper)
                        stopper.add_done_callback(self._stoppers.discard)

        return lost
