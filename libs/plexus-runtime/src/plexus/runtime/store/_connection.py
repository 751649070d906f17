"""`Connection`: the cluster handles a component needs, as one value instead of the whole `Runtime`.

Interceptors receive it in `Interceptor.start`; it names what they may use (the NATS connection, JetStream,
the topology's streams and buckets, subjects, the registry and its in-memory view, the artifact store)
without reaching into the client object that also runs RPCs, subscriptions and reply routing. It lives in
`store/` (its fields are the store's handles), below the interceptors, the client and the worker that take it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from plexus.runtime.store._acks import DeferredAcks
from plexus.runtime.store._artifacts import ArtifactStore
from plexus.runtime.store._gets import StreamGets
from plexus.runtime.store._registry import Registry, RegistryCache
from plexus.runtime.store._topology import Topology
from plexus.runtime.wire._subjects import Subjects

__all__ = ["Connection"]

log = logging.getLogger("plexus.client")


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

    def notify(self, listeners: list[Callable[[], None]]) -> None:
        """Call `listeners` (`on_disconnect` or `on_reconnect`)."""
        for listener in list(listeners):
            try:
                listener()
            except Exception:  # one listener's bug must not stop the others (nor nats-py's reconnect)
                log.exception("connection listener %r failed", listener)

    def subjects_for(self, namespace: str | None = None) -> Subjects:
        """The subject builders of `namespace` (default: this connection's namespace)."""
        return Subjects(prefix=self.prefix, namespace=namespace or self.namespace)
