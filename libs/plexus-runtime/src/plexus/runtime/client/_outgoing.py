"""`Outgoing`: the messages a `Runtime` sends — a send's delivery and reply, a publication, a post.

The end of the client's interceptor chains (``send``, ``publish``) and `Runtime.post_message`: each addresses
its recipients (registry lookups through `TypeResolver`), builds the envelope (large blocks offloaded to the
artifact store) and hands it to NATS or JetStream.

A post stores a message in a durable agent's inbox with no reply awaited: what a caller uses when the
message's effect must be durable now and its outcome may come later (or never to this process), a decision
for an agent that awaits approval, say. The inbox stream has the message once the call returns; the agent
handles it once, in its key's order, on whichever worker owns it then, also one that starts later. Nobody
waits for the reply (the envelope has no ``reply_to``): a handler that fails is logged by its worker.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

import msgspec

from plexus.core import AgentId, BaseBlock, KernelError, MessageId, RunId, TopicId
from plexus.runtime.interceptors._interceptors import PublishInput, SendInput
from plexus.runtime.store._artifacts import check_payload_size, headers_size
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._subscriptions import SubscriptionTable
from plexus.runtime.wire._envelope import (
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

from ._delivery import Delivery
from ._resolve import TypeResolver
from ._supervisor import new_root_run

__all__ = ["Outgoing"]

#: Recipients whose inbox subject `Outgoing._inbox_of` remembers, and recipient lists whose header
#: `Outgoing._topic_to` does (each cleared when full).
_ROUTES_KEPT = 4096

#: A message id as `MessageId.new` mints it (the ULID alphabet of python-ulid's output).
_MINTED_MESSAGE_ID = re.compile(r"msg_([0-7][0-9A-HJKMNP-TV-Z]{25})\Z")


class Outgoing:
    """Sends, publications and posts of one `Runtime` (see the module's docstring)."""

    def __init__(
        self,
        connection: Connection,
        delivery: Delivery,
        resolver: TypeResolver,
        subscriptions: SubscriptionTable,
        subjects_for: Callable[[str], Subjects],
    ) -> None:
        self._connection = connection
        self._nc = connection.nc
        self._artifacts = connection.artifacts
        self._registry_cache = connection.registry_view
        self._delivery = delivery
        self._resolver = resolver
        self._subscriptions = subscriptions
        self._subjects_for = subjects_for
        self._routes: dict[tuple[str, str, str, bool], str] = {}
        self._topic_tos: dict[tuple[str, ...], str] = {}

    async def send(self, inp: SendInput) -> list[BaseBlock]:
        """The send chain's end: deliver to a live host of the recipient and return its reply."""
        deadline = time.monotonic() + inp.timeout_s
        info = await self._resolver.host_for(inp.recipient, deadline)
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
            check_payload_size(len(data) + headers_size(headers), self._nc.max_payload)
            reply = await self._delivery.request(
                subject, data, headers, env.id, inp.recipient, inp.timeout_s, deadline
            )
        if reply.ok and reply.awaiting and inp.kind == "send":
            # The handler committed a suspension, not an answer: a typed outcome, never mistaken for one.
            raise ApprovalRequired.of_reply(str(inp.recipient), reply.awaiting, _unwrap(reply))
        return _unwrap(reply)

    async def publish(self, inp: PublishInput) -> None:
        """The publish chain's end: deliver to every subscriber of the topic but the sender."""
        recipients = self._subscriptions.recipients(inp.topic, inp.sender)
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
            check_payload_size(len(data) + headers_size(headers), self._nc.max_payload)
            subjects = self._subjects_for(recipient.namespace)
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
            headers[HDR_TOPIC_TO] = self._topic_to(stateless)
            check_payload_size(len(data) + headers_size(headers), self._nc.max_payload)
            subjects = self._subjects_for(inp.topic.namespace)
            await self._nc.publish(subjects.topic(inp.topic.type, inp.topic.source), data, headers=headers)

    async def post(
        self,
        blocks: Sequence[BaseBlock],
        agent_id: AgentId,
        *,
        sender: AgentId | None,
        message_id: str | None,
        timeout: float,
    ) -> str:
        """`Runtime.post_message`: store `blocks` in a durable agent's inbox, return the message id."""
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        ns, name = agent_id.namespace, agent_id.type
        info = await self._resolver.registered(agent_id)
        if not info.durable:
            raise ValueError(
                f"{ns}/{name} is stateless: nothing keeps a posted message for it (use send_message)"
            )
        msg_id = message_id or str(MessageId.new())
        deadline = time.monotonic() + timeout
        payload = await self._payload(blocks)
        env = self._envelope(payload, agent_id, "send", sender, new_root_run(), msg_id, None)
        data = encode_envelope(env)
        headers = make_headers(env, {})
        check_payload_size(len(data) + headers_size(headers), self._nc.max_payload)
        subject = self._subjects_for(ns).inbox(name, agent_id.key)
        await self._connection.acks.publish_acked(
            subject, data, headers=headers, timeout=max(deadline - time.monotonic(), 0.001)
        )
        return msg_id

    def _topic_to(self, types: list[str]) -> str:
        """The ``Plexus-To`` header naming `types` (remembered: a topic's subscribers rarely change)."""
        key = tuple(types)
        listed = self._topic_tos.get(key)
        if listed is None:
            if len(self._topic_tos) >= _ROUTES_KEPT:
                self._topic_tos.clear()
            listed = self._topic_tos[key] = " ".join(escape_token(t) for t in types)
        return listed

    def _inbox_of(self, recipient: AgentId, durable: bool) -> str:
        """The subject a message to `recipient` goes to (remembered: most sends go to known agents)."""
        route = (recipient.namespace, recipient.type, recipient.key, durable)
        subject = self._routes.get(route)
        if subject is None:
            subjects = self._subjects_for(recipient.namespace)
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

    async def _payload(self, blocks: Sequence[BaseBlock]) -> msgspec.Raw:
        """The envelope payload of `blocks`: large blocks offloaded to the artifact store, then encoded."""
        return payload_from_blocks(await self._artifacts.offload(list(blocks)))

    @staticmethod
    def _envelope(
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


def _unwrap(reply: Reply) -> list[BaseBlock]:
    if not reply.ok:
        raise KernelError.from_wire(
            reply.error or {"error_type": "KernelError", "message": "no error detail"}
        )
    return blocks_from_payload(reply.payload) if reply.payload is not None else []


def _root_run(message_id: str) -> RunInfo:
    """The run started by a message sent outside any run.

    Minting a ULID is the costliest step of a send, so a minted message id lends its ULID to the run it starts
    (``msg_<ULID>`` starts ``run_<ULID>``: unique, and the same run when the message is retried with its id).
    Any other message id gets a freshly minted `RunId`.
    """
    minted = _MINTED_MESSAGE_ID.match(message_id)
    return new_root_run(run_id=None if minted is None else f"{RunId.prefix}_{minted.group(1)}")
