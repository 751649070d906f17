"""`Connection`: the cluster handles a component needs, as one value instead of the whole `Runtime`.

Interceptors receive it in `Interceptor.start`, and the worker's parts (intake, commit, context backend,
topics, upkeep, dead-lettering) are built on it; it names what they may use (the NATS connection, JetStream,
the topology's streams and buckets, subjects, EventLogs, the registry and its in-memory view, the artifact
store, the orchestrator client) without reaching into the client object that also runs RPCs, subscriptions
and reply routing. It lives in `store/` (its fields are the store's handles), below the interceptors, the
client and the worker that take it; the orchestrator client (`client/_cluster.py`, above) is attached by the
`Runtime` after both exist and typed here by the `OrchestratorCalls` protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from plexus.core import AgentId
from plexus.runtime.store._acks import DeferredAcks
from plexus.runtime.store._artifacts import ArtifactStore
from plexus.runtime.store._eventlog import EventLog
from plexus.runtime.store._gets import StreamGets
from plexus.runtime.store._registry import Registry, RegistryCache
from plexus.runtime.store._topology import Topology
from plexus.runtime.wire._subjects import Subjects

__all__ = ["Connection", "OrchestratorCalls"]

log = logging.getLogger("plexus.client")

R = TypeVar("R")


class OrchestratorCalls(Protocol):
    """Requests to the orchestrator service (`OrchestratorClient` in `client/_cluster.py`)."""

    async def call(self, verb: str, body: Any, reply_type: type[R], namespace: str | None = None) -> R: ...


@dataclass(frozen=True, slots=True)
class Connection:
    """One process's connection to a Plexus cluster (shared, never closed through this value)."""

    nc: NATS
    js: JetStreamContext
    topology: Topology
    prefix: str
    namespace: str
    partitions: int
    registry: Registry
    artifacts: ArtifactStore
    #: The registry followed in memory (started with the runtime): hot-path lookups without a round trip.
    registry_view: RegistryCache
    #: JetStream publishes over one ack subscription (`js.publish` without a request per message).
    acks: DeferredAcks
    #: Last-message reads of a stream subject (`js.get_last_msg` without a request per read).
    gets: StreamGets
    #: Called when the NATS connection drops and each time it is re-established (from nats-py's reconnect
    #: task; keep them short): core messages to or from this process around the drop, replies say, may be
    #: lost.
    on_disconnect: list[Callable[[], None]] = field(default_factory=list)
    on_reconnect: list[Callable[[], None]] = field(default_factory=list)
    #: The subject builders of `namespace` (`subjects_for` hands them out for it, built once).
    subjects: Subjects = field(init=False, repr=False)
    _orchestrator: OrchestratorCalls | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "subjects", Subjects(prefix=self.prefix, namespace=self.namespace))

    @property
    def orchestrator(self) -> OrchestratorCalls:
        """The orchestrator client of this connection (the `Runtime`'s, attached when it is made)."""
        if self._orchestrator is None:
            raise RuntimeError("no orchestrator client is attached to this connection")
        return self._orchestrator

    def attach_orchestrator(self, client: OrchestratorCalls) -> None:
        """Set `orchestrator` (once: by the `Runtime` that made this connection, its client built on it)."""
        if self._orchestrator is not None:
            raise RuntimeError("an orchestrator client is already attached to this connection")
        object.__setattr__(self, "_orchestrator", client)

    def notify(self, listeners: list[Callable[[], None]]) -> None:
        """Call `listeners` (`on_disconnect` or `on_reconnect`)."""
        for listener in list(listeners):
            try:
                listener()
            except Exception:  # one listener's bug must not stop the others (nor nats-py's reconnect)
                log.exception("connection listener %r failed", listener)

    def subjects_for(self, namespace: str | None = None) -> Subjects:
        """The subject builders of `namespace` (default: this connection's namespace)."""
        if not namespace or namespace == self.namespace:
            return self.subjects
        return Subjects(prefix=self.prefix, namespace=namespace)

    def event_log(self, agent_id: AgentId) -> EventLog[Any]:
        """The EventLog of `agent_id` (a handle: nothing is read or written until it is used)."""
        return EventLog(
            self.js,
            stream=self.topology.names.events_stream,
            subject=self.subjects_for(agent_id.namespace).evlog(agent_id.type, agent_id.key),
            publish=self.acks.publish_acked,
            get_last_msg=self.gets.get_last_msg,
            get_next_msg=self.gets.get_next_msg,
            get_first_since=self.gets.get_first_since,
        )
