"""Topic publications to stateless types: one core message per publication, received once per worker.

A worker subscribes once per namespace to the topic wildcard, in the queue group of its *topic delivery
group* (`topic_group`: the hash of the stateless types it hosts there), so every group receives each
publication once and one worker of the group takes it. The worker then dispatches the message to each type
the publisher listed (``Plexus-To``) that it hosts. When several groups host one type (a mixed deployment,
a rolling upgrade that adds a type), only the group every worker derives from the registry handles that
type's copy (`RegistryCache.topic_owner`); a worker that knows no live host yet handles it itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg

from plexus.core import AgentId
from plexus.runtime._app import App
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._registry import topic_groups
from plexus.runtime.wire._envelope import HDR_TOPIC_TO
from plexus.runtime.wire._subjects import escape_token

from ._intake import Intake
from ._mailbox import Mailboxes
from .pipeline._work import Work

__all__ = ["TopicReceiver"]


class TopicReceiver:
    """Subscribes a worker to its namespaces' topic publications and queues each hosted type's copy."""

    def __init__(
        self, app: App, connection: Connection, intake: Intake, mailboxes: Mailboxes[AgentId, Work]
    ) -> None:
        self._app = app
        self._connection = connection
        self._intake = intake
        self._mailboxes = mailboxes
        #: Namespace → this worker's topic delivery group there (advertised in its heartbeat).
        self.groups = topic_groups((t.namespace, t.name) for t in app.types.values() if not t.durable)

    async def subscribe(self) -> list[Any]:
        subs = []
        for namespace, group in self.groups.items():
            subjects = self._connection.subjects_for(namespace)
            subs.append(
                await self._connection.nc.subscribe(
                    subjects.topic_wildcard(),
                    queue=subjects.topic_queue(group),
                    cb=self._on_topic(namespace, group),
                )
            )
        return subs

    def _on_topic(self, namespace: str, group: str) -> Callable[[Msg], Awaitable[None]]:
        hosted = {
            escape_token(t.name): t.name
            for t in self._app.types.values()
            if not t.durable and t.namespace == namespace
        }
        registry = self._connection.registry_view

        async def on_topic(msg: Msg) -> None:
            listed = (msg.headers or {}).get(HDR_TOPIC_TO, "")
            ours = []
            for token in listed.split(" "):
                agent_type = hosted.get(token)
                if agent_type is None:
                    continue  # a type this worker does not host: not its to read (nor to dead-letter)
                owner = registry.topic_owner(namespace, agent_type)
                if owner is not None and owner != group:
                    continue  # another group's workers handle this type's copy
                ours.append(agent_type)
            if ours:  # decoded and checked once for all of them
                for work in await self._intake.read_publication(msg, ours):
                    self._mailboxes.put(work.agent_id, work)

        return on_topic
