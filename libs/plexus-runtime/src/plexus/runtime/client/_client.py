"""`Runtime`: the client side of Plexus — connect, send, publish, subscribe, watch progress and streams.

Every wait has a deadline: a send to a type no live worker hosts fails with `AgentNotFoundError` by the
deadline; a reply that does not come in time fails with `ReplyTimeoutError`. Remote failures are re-raised
as the same `KernelError` class with the same fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, overload

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from pydantic import BaseModel

from plexus.core import (
    DEFAULT_NAMESPACE,
    AgentId,
    AgentNotFoundError,
    BaseBlock,
    ExecutionBudget,
    KernelError,
    MessageId,
    PermissionDeniedError,
    RetryPolicy,
    RunId,
    SpawnBudget,
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
from plexus.runtime.ops._liveness import PING_INTERVAL_S, liveness_options
from plexus.runtime.ops._server import NatsServer
from plexus.runtime.store._acks import DeferredAcks
from plexus.runtime.store._artifacts import ArtifactStore, check_payload_size, headers_size
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._eventlog import EventLog
from plexus.runtime.store._gets import StreamGets
from plexus.runtime.store._registry import AgentTypeInfo, Registry, RegistryCache, WorkerInfo
from plexus.runtime.store._subscriptions import Subscription, SubscriptionTable
from plexus.runtime.store._topology import Topology, ensure_topology
from plexus.runtime.wire._envelope import (
    HDR_MSG_ID,
    HDR_TOPIC_TO,
    Envelope,
    Reply,
    RunInfo,
    blocks_from_payload,
    encode_envelope,
    make_headers,
    payload_from_blocks,
    topic_copy_id,
)
from plexus.runtime.wire._orchestration import ApprovalRequired
from plexus.runtime.wire._subjects import Subjects, checkpoint_key, escape_token

from ._calls import ClientCalls
from ._client_runs import RunsClient
from ._client_schedules import SchedulesClient
from ._cluster import OrchestratorClient
from ._delivery import Delivery
from ._fork import ForkEdit, ForkPoint, fork_run
from ._post import PostClient
from ._supervisor import new_root_run
from ._typed import typed_reply

__all__ = ["Runtime"]


_T = TypeVar("_T", bound=BaseModel)


class Runtime(RunsClient, SchedulesClient, PostClient):
    """A connection to a Plexus cluster. Use `await Runtime.connect(url)` or `await Runtime.embedded()`."""

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
        self._routes: dict[tuple[str, str, str, bool], str] = {}
        self._server: NatsServer | None = None
        # Set when the NATS connection is closed for good (by `close()` or by nats-py after a fatal
        # protocol error). A worker or service that finds it set must exit, never linger unregistered.
        self.connection_closed = asyncio.Event()
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
        icpt = [TracingInterceptor(), *interceptors]
        self._send_chain = chain(icpt, "send", self._send_terminal)
        self._publish_chain = chain(icpt, "publish", self._publish_terminal)

    @property
    def connection(self) -> Connection:
        """The cluster handles of this runtime as one value (what interceptors and components receive)."""
        return self._connection

    def worker_calls(self) -> ClientCalls:
        """Internal, for the `Worker` serving on this runtime: the client behaviour its parts use."""
        return ClientCalls(self._send_chain, self._publish_chain, self._host_for)

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
    ) -> Runtime:
        """Connect to `url` (one URL or a cluster's seed list) and create or reconcile the topology.

        `auth` (default: the ``PLEXUS_NATS_*`` environment, `NatsAuth.from_env`) carries credentials, TLS
        and this identity's inbox prefix; nothing set is the open development mode. A server that stops
        answering pings sent every `ping_interval_s` (its host died or dropped off the network: no TCP reset,
        only silence) is left for another of `url` after 2-3 intervals (`ops/_liveness.py`)."""
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
        nc = await nats.connect(
            servers=servers,
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
        )
        rt.connection_closed = closed
        rt.identity = auth.user or _url_user(servers)
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
            await self._host_for(agent_id, time.monotonic() + timeout, wait_for_unknown=True)
        return agent_id

    async def _host_for(
        self, agent_id: AgentId, deadline: float, *, wait_for_unknown: bool = False
    ) -> AgentTypeInfo:
        info = self._registry_cache.get_type(agent_id.namespace, agent_id.type)
        if info is not None and self._registry_cache.has_live_host(agent_id.namespace, agent_id.type):
            return info
        if info is None and not wait_for_unknown:
            await self._require_known(agent_id)
        # Wait on the shared, watch-fed cache: a private watch per waiting send made one consumer per call,
        # and under a burst of sends during an outage ran the stream out of consumers.
        remaining = max(deadline - time.monotonic() - _DIRECT_CHECK_S, 0.0)
        if await self._registry_cache.wait_for_host(agent_id.namespace, agent_id.type, remaining):
            info = self._registry_cache.get_type(agent_id.namespace, agent_id.type)
            if info is not None:
                return info
        # Last, ask the bucket itself: the cache may lag behind a watch that is being re-established.
        with contextlib.suppress(KernelError, TimeoutError, NatsTimeoutError):
            ref = f"{agent_id.namespace}/{agent_id.type}"
            if await self.registry.live_workers(ref):
                found = await self.registry.get_type(agent_id.namespace, agent_id.type)
                if found is not None:
                    return found
        if self._registry_cache.get_type(agent_id.namespace, agent_id.type) is None:
            known = [t.type for t in self._registry_cache.list_types(agent_id.namespace)]
            raise AgentNotFoundError.unregistered(agent_id, agent_id.type, known)
        raise AgentNotFoundError(agent_id, registered=True)

    async def _require_known(self, agent_id: AgentId) -> None:
        """AgentNotFoundError at once when the registry has never seen `agent_id`'s type (not registered,
        hosted by no live worker): no grace period helps a misspelt name. The cache missed it, so the
        buckets are read once more first (a worker may have registered it a moment ago, before the watch
        delivered it); a read that fails leaves the send its grace period."""
        ns, name = agent_id.namespace, agent_id.type
        if self._registry_cache.live_workers(f"{ns}/{name}"):
            return
        try:
            if await self.registry.get_type(ns, name) is not None or await self.registry.live_workers(
                f"{ns}/{name}"
            ):
                return
        except Exception:  # an outage, say: not proof that the type is unknown
            return
        known = [t.type for t in self._registry_cache.list_types(ns)]
        raise AgentNotFoundError.unregistered(agent_id, name, known)

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

    async def _send_terminal(self, inp: SendInput) -> list[BaseBlock]:
        deadline = time.monotonic() + inp.timeout_s
        info = await self._host_for(inp.recipient, deadline)
        # Built before the envelope, whose offloading writes artifacts: a SubjectTooLongError (an odd key)
        # must leave nothing behind.
        subject = self._inbox_of(inp.recipient, info.durable)
        env = self._envelope(
            await self._payload(inp.blocks),
            inp.recipient,
            inp.kind,
            inp.sender,
            inp.run or _root_run(inp.message_id),
            inp.message_id,
            inp.timeout_s,
        )
        headers = make_headers(env, inp.headers)
        if info.durable:
            reply = await self._delivery.send_durable(
                subject, env, headers, inp.recipient, inp.timeout_s, deadline
            )
        else:
            data = encode_envelope(env)
            # Headers count too: a message over max_payload makes the server close the connection.
            check_payload_size(len(data) + headers_size(headers), self.nc.max_payload)
            reply = await self._delivery.request(
                subject, data, headers, env.id, inp.recipient, inp.timeout_s, deadline
            )
        if reply.ok and reply.awaiting and inp.kind == "send":
            # The handler committed a suspension, not an answer: a typed outcome, never mistaken for one.
            raise ApprovalRequired.of_reply(str(inp.recipient), reply.awaiting, self._unwrap(reply))
        return self._unwrap(reply)

    def _inbox_of(self, recipient: AgentId, durable: bool) -> str:
        """The subject a message to `recipient` goes to (remembered: most sends go to known agents)."""
        route = (recipient.namespace, recipient.type, recipient.key, durable)
        subject = self._routes.get(route)
        if subject is None:
            subjects = self.subjects_for(recipient.namespace)
            subject = (
                subjects.inbox(recipient.type, recipient.key)
                if durable
                else subjects.ephemeral(recipient.type, recipient.key)
            )
            # The worker keeps the agent's checkpoint under a KV key that may be longer than the subject.
            checkpoint_key(recipient.namespace, recipient.type, recipient.key)
            if len(self._routes) >= _ROUTES_KEPT:
                self._routes.clear()
            self._routes[route] = subject
        return subject

    def _unwrap(self, reply: Reply) -> list[BaseBlock]:
        if not reply.ok:
            raise KernelError.from_wire(
                reply.error or {"error_type": "KernelError", "message": "no error detail"}
            )
        return blocks_from_payload(reply.payload) if reply.payload is not None else []

    async def _payload(self, blocks: Sequence[BaseBlock]) -> msgspec.Raw:
        """The envelope payload of `blocks`: large blocks offloaded to the artifact store, then encoded."""
        return payload_from_blocks(await self.artifacts.offload(list(blocks)))

    def _envelope(
        self,
        payload: msgspec.Raw,
        target: AgentId,
        kind: str,
        sender: AgentId | None,
        run: RunInfo,
        message_id: str,
        timeout_s: float | None,
        topic: TopicId | None = None,
    ) -> Envelope:
        now = time.time()
        return Envelope(
            id=message_id,
            kind=kind,  # type: ignore[arg-type]
            target=str(target),
            sender=str(sender) if sender else None,
            topic=str(topic) if topic else None,
            reply_to=None,
            payload=payload,
            run=run,
            sent_at=now,
            deadline=now + timeout_s if timeout_s is not None else None,
        )

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

    async def _publish_terminal(self, inp: PublishInput) -> None:
        recipients = self.subscriptions.recipients(inp.topic, inp.sender)
        if not recipients:
            return
        # One publication: its payload is offloaded and encoded once, and it starts one run, not one each.
        payload = await self._payload(inp.blocks)
        run = inp.run or _root_run(inp.message_id)
        stateless: list[str] = []
        for recipient in recipients:
            info = self._registry_cache.get_type(recipient.namespace, recipient.type)
            if info is not None and not info.durable:
                stateless.append(recipient.type)
                continue
            # A durable recipient keeps its own inbox message (its key's order, its fencing, at-least-once).
            # Per-recipient ids keep de-duplication per inbox while staying stable across publisher retries.
            message_id = topic_copy_id(inp.message_id, recipient.type)
            env = self._envelope(payload, recipient, "publish", inp.sender, run, message_id, None, inp.topic)
            data = encode_envelope(env)
            headers = make_headers(env, inp.headers)
            check_payload_size(len(data) + headers_size(headers), self.nc.max_payload)
            subjects = self.subjects_for(recipient.namespace)
            await self._connection.acks.publish_acked(
                subjects.inbox(recipient.type, recipient.key), data, headers=headers
            )
        if stateless:
            # Every stateless recipient shares ONE core message on the topic subject: one worker of each topic
            # delivery group takes it and runs each listed type it handles (see worker/_topics.py).
            first = recipients[0]
            env = self._envelope(payload, first, "publish", inp.sender, run, inp.message_id, None, inp.topic)
            data = encode_envelope(env)
            headers = make_headers(env, inp.headers)
            headers[HDR_TOPIC_TO] = " ".join(escape_token(t) for t in stateless)
            check_payload_size(len(data) + headers_size(headers), self.nc.max_payload)
            subjects = self.subjects_for(inp.topic.namespace)
            await self.nc.publish(subjects.topic(inp.topic.type, inp.topic.source), data, headers=headers)

    async def add_subscription(self, subscription: Subscription) -> str:
        return await self.subscriptions.add(subscription)

    async def remove_subscription(self, subscription_id: str) -> None:
        await self.subscriptions.remove(subscription_id)

    def event_log(self, agent_id: AgentId) -> EventLog[Any]:
        return self._connection.event_log(agent_id)

    async def fork_run(
        self,
        run_id: str,
        at: ForkPoint | int | None = None,
        edit: ForkEdit | str | None = None,
        *,
        budget: ExecutionBudget | None = None,
        spawn_budget: SpawnBudget | None = None,
        retry: RetryPolicy | None = None,
        priority: int | None = None,
    ) -> str:
        """Start a new run tree at a point of one agent's history in `run_id` (``at``: a `ForkPoint`, or a
        turn of the run's own agent), optionally edited (``edit``: a `ForkEdit`, or the new user message);
        returns the new root's run id. Its budgets are its own (the source root's limits unless given);
        the source is only read (docs/timetravel.md, "Fork")."""
        return await fork_run(
            self, run_id, at, edit, budget=budget, spawn_budget=spawn_budget, retry=retry, priority=priority
        )


#: Time kept at the end of a host lookup for one direct read of the registry.
_DIRECT_CHECK_S = 1.0

#: Recipients whose inbox subject `Runtime._inbox_of` remembers (cleared when full).
_ROUTES_KEPT = 4096

#: A message id as `MessageId.new` mints it (the ULID alphabet of python-ulid's output).
_MINTED_MESSAGE_ID = re.compile(r"msg_([0-7][0-9A-HJKMNP-TV-Z]{25})\Z")


def _root_run(message_id: str) -> RunInfo:
    """The run started by a message sent outside any run.

    Minting a ULID is the costliest step of a send, so a minted message id lends its ULID to the run it starts
    (``msg_<ULID>`` starts ``run_<ULID>``: unique, and the same run when the message is retried with its id).
    Any other message id gets a freshly minted `RunId`.
    """
    minted = _MINTED_MESSAGE_ID.match(message_id)
    return new_root_run(run_id=None if minted is None else f"{RunId.prefix}_{minted.group(1)}")


_ = HDR_MSG_ID


def _url_user(servers: Sequence[str]) -> str | None:
    """The NATS user named in a server URL (``nats://user:pass@host``), if any."""
    for server in servers:
        user = urllib.parse.urlsplit(server).username
        if user:
            return urllib.parse.unquote(user)
    return None
