"""`Runtime`: the client side of Plexus — connect, send, publish, subscribe, watch progress and streams.

Every wait has a deadline: a send to a type no live worker hosts fails with `AgentNotFoundError` by the
deadline; a reply that does not come in time fails with `ReplyTimeoutError`. Remote failures are re-raised
as the same `KernelError` class with the same fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, overload

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pydantic import BaseModel

from plexus.core import (
    DEFAULT_NAMESPACE,
    AgentId,
    BaseBlock,
    MessageId,
    PermissionDeniedError,
    TopicId,
)
from plexus.runtime.interceptors._interceptors import (
    Interceptor,
    PublishInput,
    SendInput,
    TracingInterceptor,
    chain,
)
from plexus.runtime.ops._auth import NatsAuth
from plexus.runtime.ops._denials import DenialWatch, raise_on_denial
from plexus.runtime.ops._first_connect import CLIENT_CONNECT_WAIT_S, connect_nats
from plexus.runtime.ops._liveness import PING_INTERVAL_S, liveness_options
from plexus.runtime.ops._server import NatsServer
from plexus.runtime.store._acks import DeferredAcks
from plexus.runtime.store._artifacts import ArtifactStore
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._eventlog import EventLog
from plexus.runtime.store._gets import StreamGets
from plexus.runtime.store._registry import AgentTypeInfo, Registry, RegistryCache, WorkerInfo
from plexus.runtime.store._subscriptions import Subscription, SubscriptionTable
from plexus.runtime.store._topology import Topology, ensure_topology
from plexus.runtime.wire._envelope import RunInfo
from plexus.runtime.wire._subjects import Subjects

from ._calls import ClientCalls
from ._client_runs import RunsClient
from ._client_schedules import SchedulesClient
from ._cluster import OrchestratorClient
from ._delivery import Delivery
from ._forward import forward
from ._outgoing import Outgoing
from ._resolve import TypeResolver
from ._typed import typed_reply

__all__ = ["Runtime"]


_T = TypeVar("_T", bound=BaseModel)


class Runtime:
    """A connection to a Plexus cluster. Use `await Runtime.connect(url)` or `await Runtime.embedded()`.

    Its runs and schedules calls are those of the `RunsClient` and `SchedulesClient` it holds."""

    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        *,
        prefix: str = "px",
        namespace: str = DEFAULT_NAMESPACE,
        partitions: int = 16,
        heartbeat_ttl_s: float = 10.0,
        interceptors: Sequence[Interceptor] = (),
        identity: str | None = None,
        connection_closed: asyncio.Event | None = None,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.topology = topology
        self.prefix = prefix
        self.namespace = namespace
        self.partitions = partitions
        self.subjects = Subjects(prefix=prefix, namespace=namespace)
        self.registry = Registry(topology.registry, topology.workers, ttl_s=heartbeat_ttl_s)
        self._registry_cache = RegistryCache(self.registry)
        self.subscriptions = SubscriptionTable(topology.subscriptions)
        self.artifacts = ArtifactStore(topology.artifacts)
        self._server: NatsServer | None = None
        # Set when the NATS connection is closed for good (by `close()` or by nats-py after a fatal
        # protocol error). A worker or service that finds it set must exit, never linger unregistered.
        self.connection_closed = connection_closed or asyncio.Event()
        self._connection = Connection(
            nc=nc,
            js=self.js,
            topology=topology,
            prefix=prefix,
            namespace=namespace,
            partitions=partitions,
            registry=self.registry,
            artifacts=self.artifacts,
            registry_view=self._registry_cache,
            acks=DeferredAcks(nc),
            gets=StreamGets(nc),
        )
        self._delivery = Delivery(self._connection)
        self._connection.on_reconnect.append(self._delivery.reconnected)
        self.orchestrator = OrchestratorClient(self._connection)
        self._connection.attach_orchestrator(self.orchestrator)
        self._runs = RunsClient(self._connection, self.connection_closed, identity)
        self._schedules = SchedulesClient(self._connection)
        self._resolver = TypeResolver(self.registry, self._registry_cache)
        self._outgoing = Outgoing(
            self._connection, self._delivery, self._resolver, self.subscriptions, self.subjects_for
        )
        icpt = [TracingInterceptor(), *interceptors]
        self._send_chain = chain(icpt, "send", self._outgoing.send)
        self._publish_chain = chain(icpt, "publish", self._outgoing.publish)

    @property
    def identity(self) -> str | None:
        """Who this connection acts as (its NATS user), kept with its approval decisions; None: unknown."""
        return self._runs.identity

    @property
    def connection(self) -> Connection:
        """The cluster handles of this runtime as one value (what interceptors and components receive)."""
        return self._connection

    def worker_calls(self) -> ClientCalls:
        """Internal, for the `Worker` serving on this runtime: the client behaviour its parts use."""
        return ClientCalls(self._send_chain, self._publish_chain, self._resolver.host_for)

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        prefix: str = "px",
        namespace: str = DEFAULT_NAMESPACE,
        partitions: int = 16,
        heartbeat_ttl_s: float = 10.0,
        lease_ttl_s: float = 10.0,
        progress_max_age_s: float = 3600.0,
        interceptors: Sequence[Interceptor] = (),
        name: str | None = None,
        replicas: int | None = None,
        auth: NatsAuth | None = None,
        ping_interval_s: float = PING_INTERVAL_S,
        connect_wait_s: float | None = CLIENT_CONNECT_WAIT_S,
    ) -> Runtime:
        """Connect to `url` (one URL or a cluster's seed list) and create or reconcile the topology.

        `auth` (default: the ``PLEXUS_NATS_*`` environment, `NatsAuth.from_env`) carries credentials, TLS
        and this identity's inbox prefix; nothing set is the open development mode. A server that stops
        answering pings sent every `ping_interval_s` (its host died or dropped off the network: no TCP reset,
        only silence) is left for another of `url` after 2-3 intervals (`ops/_liveness.py`). No server
        accepting a first connection within `connect_wait_s` is `NatsUnreachableError`; None waits for one as
        long as it takes (a service started before its server); once connected, reconnects never give up."""
        liveness = liveness_options(ping_interval_s)
        servers = [url] if isinstance(url, str) else list(url)
        auth = NatsAuth.from_env() if auth is None else auth
        closed = asyncio.Event()
        rt: Runtime | None = None

        async def on_closed() -> None:
            closed.set()

        async def on_disconnected() -> None:
            if rt is not None:
                rt.connection.notify(rt.connection.on_disconnect)

        async def on_reconnected() -> None:
            if rt is not None:
                rt.connection.notify(rt.connection.on_reconnect)

        # nats-py closes a connection for good on some protocol errors (e.g. "maximum control line
        # exceeded") even with unlimited reconnects: long-lived processes watch `connection_closed`.
        denials = DenialWatch(auth.user)
        nc = await connect_nats(
            servers,
            connect_wait_s,
            name=name or "plexus",
            max_reconnect_attempts=-1,
            **liveness,
            closed_cb=on_closed,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
            error_cb=denials.on_error,
            **auth.connect_options(),
        )
        denials.source = nc
        # A request to a subject this user may not use is never answered: fail at once, not at a timeout.
        try:
            topology = await raise_on_denial(
                ensure_topology(
                    nc.jetstream(),
                    prefix=prefix,
                    partitions=partitions,
                    progress_max_age_s=progress_max_age_s,
                    workers_ttl_s=heartbeat_ttl_s,
                    leases_ttl_s=lease_ttl_s,
                    replicas=replicas,
                ),
                nc,
            )
        except PermissionDeniedError:
            await nc.close()
            raise
        rt = cls(
            nc,
            topology,
            prefix=prefix,
            namespace=namespace,
            partitions=partitions,
            # The bucket's TTL, which is what a registration really lives (the operator's, if it differs).
            heartbeat_ttl_s=topology.workers_ttl_s,
            interceptors=interceptors,
            identity=auth.user or _url_user(servers),
            connection_closed=closed,
        )
        await raise_on_denial(rt._start(), nc)
        return rt

    @classmethod
    async def embedded(cls, **kwargs: Any) -> Runtime:
        """Start a private nats-server (stopped by `close()`) and connect to it."""
        server = NatsServer()
        await asyncio.to_thread(server.start)
        try:
            rt = await cls.connect(server.url, **kwargs)
        except BaseException:
            server.cleanup()
            raise
        rt._server = server
        return rt

    async def _start(self) -> None:
        await self._delivery.replies.start()
        await self._registry_cache.start()
        await self.subscriptions.start()

    async def close(self) -> None:
        self._delivery.replies.cancel_all()
        self._delivery.cancel_probes()
        self._connection.gets.cancel_all()
        with contextlib.suppress(Exception):
            await self.subscriptions.stop()
        with contextlib.suppress(Exception):
            await self._registry_cache.stop()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        if self._server is not None:
            await asyncio.to_thread(self._server.cleanup)

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def subjects_for(self, namespace: str) -> Subjects:
        if namespace == self.namespace:
            return self.subjects
        return Subjects(prefix=self.prefix, namespace=namespace)

    # -- discovery (no instantiation) -------------------------------------------------------------------
    async def agent_types(self, namespace: str | None = None) -> list[AgentTypeInfo]:
        return await self.registry.list_types(namespace)

    async def capabilities(self, agent_type: str, namespace: str | None = None) -> list[str]:
        return await self.registry.capabilities(namespace or self.namespace, agent_type)

    async def workers(self, agent_type: str | None = None, namespace: str | None = None) -> list[WorkerInfo]:
        ns_type = f"{namespace or self.namespace}/{agent_type}" if agent_type else None
        return await self.registry.live_workers(ns_type)

    async def get(
        self, agent_type: str, key: str = "default", *, lazy: bool = True, timeout: float = 5.0
    ) -> AgentId:
        """The AgentId of `agent_type/key`. Nothing is instantiated (activation happens on first message).

        With ``lazy=False`` the type must have a live host within `timeout`, else AgentNotFoundError; a type
        not registered yet is waited for too (this is how a caller waits for a worker that is starting).
        """
        agent_id = AgentId(agent_type, key, self.namespace)
        if not lazy:
            await self._resolver.host_for(agent_id, time.monotonic() + timeout, wait_for_unknown=True)
        return agent_id

    # -- send / publish -------------------------------------------------------------------------------
    @overload
    async def send_message(
        self,
        blocks: Sequence[BaseBlock],
        agent_id: AgentId,
        *,
        timeout: float = ...,
        sender: AgentId | None = ...,
        run: RunInfo | None = ...,
        message_id: str | None = ...,
        kind: Literal["send", "spawn"] = ...,
        output_type: None = None,
    ) -> list[BaseBlock]: ...

    @overload
    async def send_message(
        self,
        blocks: Sequence[BaseBlock],
        agent_id: AgentId,
        *,
        timeout: float = ...,
        sender: AgentId | None = ...,
        run: RunInfo | None = ...,
        message_id: str | None = ...,
        kind: Literal["send", "spawn"] = ...,
        output_type: type[_T],
    ) -> _T: ...

    async def send_message(
        self,
        blocks: Sequence[BaseBlock],
        agent_id: AgentId,
        *,
        timeout: float = 30.0,
        sender: AgentId | None = None,
        run: RunInfo | None = None,
        message_id: str | None = None,
        kind: Literal["send", "spawn"] = "send",
        output_type: type[_T] | None = None,
    ) -> list[BaseBlock] | _T:
        """RPC: deliver `blocks` to `agent_id` and return its reply, or raise its typed error.

        A handler that ended waiting for decisions (`Context.await_approval`) has no reply yet: that is
        `ApprovalRequired` (with the ids), raised once its state is committed.
        ``kind="spawn"`` marks the message as the entry of a child run (used by `Context.spawn`).
        ``output_type``: a pydantic model the reply's DataBlock is validated into and returned as
        (`ReplyValidationError` when it carries none, or one that does not validate).
        """
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        inp = SendInput(
            blocks=list(blocks),
            recipient=agent_id,
            sender=sender,
            message_id=message_id or str(MessageId.new()),
            timeout_s=timeout,
            headers={},
            run=run,
            kind=kind,
        )
        result: list[BaseBlock] = await self._send_chain(inp)
        return result if output_type is None else typed_reply(result, output_type)

    async def publish_message(
        self,
        blocks: Sequence[BaseBlock],
        topic_id: TopicId,
        *,
        sender: AgentId | None = None,
        run: RunInfo | None = None,
        message_id: str | None = None,
    ) -> int:
        """Deliver to every agent subscribed to `topic_id` (not the sender); returns the recipient count."""
        inp = PublishInput(
            blocks=list(blocks),
            topic=topic_id,
            sender=sender,
            message_id=message_id or str(MessageId.new()),
            headers={},
            run=run,
        )
        await self._publish_chain(inp)
        return len(self.subscriptions.recipients(topic_id, sender))

    async def post_message(
        self,
        blocks: Sequence[BaseBlock],
        agent_id: AgentId,
        *,
        sender: AgentId | None = None,
        message_id: str | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Store `blocks` in `agent_id`'s inbox stream and return the message id, without waiting for the
        handler (`_outgoing.py`). No live host is needed: the type must be registered and durable (a
        stateless type has no inbox to keep it: ValueError; an unknown one: AgentNotFoundError). The same
        `message_id` again, within the stream's duplicate window, is stored once."""
        return await self._outgoing.post(
            blocks, agent_id, sender=sender, message_id=message_id, timeout=timeout
        )

    async def add_subscription(self, subscription: Subscription) -> str:
        return await self.subscriptions.add(subscription)

    async def remove_subscription(self, subscription_id: str) -> None:
        await self.subscriptions.remove(subscription_id)

    def event_log(self, agent_id: AgentId) -> EventLog[Any]:
        return self._connection.event_log(agent_id)

    # -- runs: observation, orchestrated runs, export and fork (`_client_runs.py`) ------------------------
    progress = forward("_runs", RunsClient.progress)
    stream = forward("_runs", RunsClient.stream)
    start_run = forward("_runs", RunsClient.start_run)
    get_run = forward("_runs", RunsClient.get_run)
    wait_run = forward("_runs", RunsClient.wait_run)
    approve = forward("_runs", RunsClient.approve)
    deny = forward("_runs", RunsClient.deny)
    cancel_run = forward("_runs", RunsClient.cancel_run)
    export_run = forward("_runs", RunsClient.export_run)
    fork_run = forward("_runs", RunsClient.fork_run)

    @overload
    async def run_result(
        self, run_id: str, *, timeout: float = ..., output_type: None = None
    ) -> list[BaseBlock]: ...

    @overload
    async def run_result(self, run_id: str, *, timeout: float = ..., output_type: type[_T]) -> _T: ...

    async def run_result(
        self, run_id: str, *, timeout: float = 60.0, output_type: type[_T] | None = None
    ) -> list[BaseBlock] | _T:
        """`RunsClient.run_result` (written out: a forward would lose its overloads)."""
        return await self._runs.run_result(run_id, timeout=timeout, output_type=output_type)

    # -- scheduled runs (`_client_schedules.py`) ----------------------------------------------------------
    schedule_run = forward("_schedules", SchedulesClient.schedule_run)
    get_schedule = forward("_schedules", SchedulesClient.get_schedule)
    list_schedules = forward("_schedules", SchedulesClient.list_schedules)
    pause_schedule = forward("_schedules", SchedulesClient.pause_schedule)
    resume_schedule = forward("_schedules", SchedulesClient.resume_schedule)
    trigger_schedule = forward("_schedules", SchedulesClient.trigger_schedule)
    delete_schedule = forward("_schedules", SchedulesClient.delete_schedule)


def _url_user(servers: Sequence[str]) -> str | None:
    """The NATS user named in a server URL (``nats://user:pass@host``), if any."""
    for server in servers:
        user = urllib.parse.urlsplit(server).username
        if user:
            return urllib.parse.unquote(user)
    return None
