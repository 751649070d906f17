"""`Orchestrator`: one replica of the service — endpoints, budget watcher, index and sweeper on one
connection. Start as many as you like; they share nothing but JetStream."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from plexus.core import PermissionDeniedError
from plexus.runtime.kernel import (
    DenialWatch,
    NatsAuth,
    Registry,
    StreamGets,
    TopologyNames,
    ensure_topology,
    escape_token,
    liveness_options,
    raise_on_denial,
)
from plexus.runtime.orchestration import TERMINAL, RunScheduleBook

from ._budget import BudgetWatcher
from ._engine import Engine, EngineConfig
from ._hosts import HostCheck
from ._schedule_api import ScheduledRunsApi, ScheduleStateStore
from ._schedule_fires import FireConsumer
from ._service import OrchestratorService
from ._store import RunStore
from ._sweeper import RunIndex, Sweeper, SweeperConfig

__all__ = ["Orchestrator", "OrchestratorConfig"]


@dataclass(frozen=True, slots=True)
class OrchestratorConfig:
    """``namespace`` None serves every namespace; ``partitions`` is only used when this replica is the
    first Plexus process on the cluster and has to create the topology."""

    prefix: str = "px"
    namespace: str | None = None
    partitions: int = 16
    names: TopologyNames = field(default_factory=TopologyNames)
    sweeper: SweeperConfig = field(default_factory=SweeperConfig)
    #: How long after a tree's counter moves its budget is compared (the moves meanwhile cost one check).
    budget_check_delay_s: float = 0.1
    #: Scheduled runs per tenant (NATS account: all namespaces of its `PLEXUS_SCHEDULES`).
    max_schedules: int = 100
    #: How often a fire held by ``overlap="buffer_one"`` looks again whether the previous run ended.
    schedule_recheck_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.budget_check_delay_s >= 0:
            raise ValueError(f"budget_check_delay_s must be >= 0, got {self.budget_check_delay_s}")
        if self.max_schedules < 0:
            raise ValueError(f"max_schedules must be >= 0, got {self.max_schedules}")
        if not self.schedule_recheck_s > 0:
            raise ValueError(f"schedule_recheck_s must be > 0, got {self.schedule_recheck_s}")


class Orchestrator:
    """Use ``async with await Orchestrator.connect(url) as orch`` or `start`/`stop` explicitly."""

    def __init__(
        self, nc: NATS, config: OrchestratorConfig | None = None, *, own_connection: bool = False
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.config = config or OrchestratorConfig()
        self._own_connection = own_connection
        self.store: RunStore | None = None
        self.gets: StreamGets | None = None
        self.engine: Engine | None = None
        self.index: RunIndex | None = None
        self.sweeper: Sweeper | None = None
        self.watcher: BudgetWatcher | None = None
        self.service: OrchestratorService | None = None
        self.fires: FireConsumer | None = None
        #: Set when a connection opened by `connect` is closed for good (nats-py gives a connection up after
        #: some server errors even with unlimited reconnects): the process must exit, not linger.
        self.connection_closed = asyncio.Event()

    @classmethod
    async def connect(
        cls, url: str | list[str], config: OrchestratorConfig | None = None, auth: NatsAuth | None = None
    ) -> Orchestrator:
        """Connect to `url`; `auth` defaults to the ``PLEXUS_NATS_*`` environment (`NatsAuth.from_env`)."""
        servers = [url] if isinstance(url, str) else url
        auth = NatsAuth.from_env() if auth is None else auth
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        denials = DenialWatch(auth.user)
        nc = await nats.connect(
            servers=servers,
            name="plexus-orchestrator",
            max_reconnect_attempts=-1,
            closed_cb=on_closed,
            error_cb=denials.on_error,
            **liveness_options(),  # a silent server is left in seconds, not minutes
            **auth.connect_options(),
        )
        denials.source = nc
        orch = cls(nc, config, own_connection=True)
        orch.connection_closed = closed
        return orch

    @property
    def id(self) -> str:
        """The micro-service instance id (as in ``$SRV.PING``)."""
        return self.service.service.id if self.service and self.service.service else ""

    async def _runs_bucket(self) -> KeyValue:
        names = self.config.names
        try:
            kv = await self.js.key_value(names.runs_bucket)
            for stream in (
                names.counters_stream,
                names.events_stream,
                names.progress_stream,
                names.inbox_stream,
            ):
                await self.js.stream_info(stream)
            return kv
        except (BucketNotFoundError, NotFoundError):
            # First Plexus process on this cluster. Only then do we create the topology: reconciling an
            # existing one with our defaults would reset settings the workers chose (TTLs, partitions).
            topology = await ensure_topology(
                self.js, prefix=self.config.prefix, partitions=self.config.partitions, names=names
            )
            return topology.runs

    async def start(self) -> Orchestrator:
        """Start every duty. A permission the connection's user lacks ends the start at once with
        `PermissionDeniedError` naming the subject (a denied request is never answered: it would be waited
        out as an outage), and what had started is stopped."""
        try:
            return await raise_on_denial(self._start(), self.nc)
        except PermissionDeniedError:
            await self.stop()
            raise

    async def _start(self) -> Orchestrator:
        kv = await self._runs_bucket()
        names = self.config.names
        # Reads through the connection's multiplexed inbox (the runs bucket and the budget counters).
        self.gets = StreamGets(self.nc)
        self.store = RunStore(kv, gets=self.gets, bucket=names.runs_bucket)
        self.engine = Engine(
            self.nc,
            self.js,
            self.store,
            EngineConfig(
                prefix=self.config.prefix,
                counters_stream=names.counters_stream,
                events_stream=names.events_stream,
            ),
        )
        self.index = RunIndex(kv, settle_s=self.config.sweeper.settle_s)
        await self.index.start()
        self.watcher = BudgetWatcher(
            self.nc, self.config.prefix, self._budget_moved, self.config.budget_check_delay_s
        )
        await self.watcher.start()
        hosts = await self._host_check()
        self.engine.hosts = hosts
        self.sweeper = Sweeper(self.engine, self.index, self.config.sweeper, hosts)
        self.sweeper.start()
        book = RunScheduleBook(self.js, self.gets, self.config.prefix, names.schedules_stream)
        states = ScheduleStateStore(kv)
        ns_token = "*" if self.config.namespace is None else escape_token(self.config.namespace)
        self.fires = FireConsumer(
            self.js, self.engine, book, states, ns_token, self.config.schedule_recheck_s
        )
        await self.fires.start()
        schedules = ScheduledRunsApi(self.engine, book, states, self.config.max_schedules)
        self.service = OrchestratorService(
            self.nc, self.engine, self.config.prefix, self.config.namespace, schedules
        )
        await self.service.start()
        await self.nc.flush()
        return self

    async def _host_check(self) -> HostCheck:
        names = self.config.names
        workers = await self.js.key_value(names.workers_bucket)
        # The workers bucket's TTL is the cluster's heartbeat TTL (see docs/architecture.md).
        ttl = (await workers.status()).ttl or 10.0
        registry = Registry(await self.js.key_value(names.registry_bucket), workers, ttl_s=ttl)
        return HostCheck(registry, self.config.sweeper.no_host_grace_s)

    async def _budget_moved(self, root_id: str) -> None:
        assert self.engine is not None
        assert self.index is not None
        known = self.index.runs.get(root_id)
        if known is not None:
            if known.parent_id is None and known.budget:  # a live tree without one has nothing to compare
                await self.engine.check_budget(root_id, known)
            return
        # Not live as far as the index knows: an ended tree whose agents reported after its end (its records
        # catch up: see _settle.py), or one too new to be indexed yet.
        root = await self.engine.settle_usage(root_id, ended=self.index.ended.get(root_id))
        if root is not None and root.status not in TERMINAL and root.budget:
            await self.engine.check_budget(root_id, root)

    async def stop(self) -> None:
        """Stop taking requests, then stop the background duties; other replicas carry on."""
        for part in (self.service, self.fires, self.watcher, self.sweeper, self.index, self.gets):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        if self._own_connection:
            with contextlib.suppress(Exception):
                await self.nc.drain()

    async def __aenter__(self) -> Orchestrator:
        if self.service is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def serve_forever(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()
