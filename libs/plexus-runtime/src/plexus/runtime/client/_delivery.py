"""How one encoded envelope reaches an agent's inbox and how its reply comes back to the sender.

A stateless type's message is a core request (`Delivery.request`), a durable type's a JetStream publish into
its inbox stream that rides out leader elections (`Delivery.send_durable`); both wait on the `Runtime`'s reply
inbox (`_replies.py`) until the caller's deadline. A reply is a core message: one published while this
connection was down is lost, so after a reconnect every durable send still waiting asks for its reply again
(`Delivery.reconnected`), instead of waiting for its deadline.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from nats.js import api as js_api

from plexus.core import AgentId, AgentNotFoundError, ReplyTimeoutError
from plexus.runtime.store._artifacts import check_payload_size, headers_size
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._outage import is_unavailable
from plexus.runtime.wire._envelope import (
    HDR_MSG_ID,
    RESEND,
    RESEND_DUPLICATE,
    RESEND_ID_SEP,
    RESEND_PROBE,
    Envelope,
    Reply,
    encode_envelope,
)

from ._replies import NoRespondersError, ReplyInbox

__all__ = ["Delivery"]

log = logging.getLogger("plexus.client")

#: A core send that meets "no responders" while its type has a live host is sent again after 50, 100 and
#: 200 ms: a new worker's subscription may not have reached every server of a cluster yet.
_NO_RESPONDERS_ATTEMPTS = 4
_NO_RESPONDERS_RETRY_S = 0.05


class Delivery:
    """Sends encoded envelopes for one `Runtime` and waits for their replies."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.replies = ReplyInbox(connection.nc)
        #: Durable sends stored in their inbox stream and awaiting a reply: message id -> what a probe needs.
        self._awaited: dict[str, tuple[str, Envelope, dict[str, str], float]] = {}
        self._probes: set[asyncio.Task[None]] = set()

    async def request(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str],
        message_id: str,
        recipient: AgentId,
        timeout_s: float,
        deadline: float,
    ) -> Reply:
        """A stateless type's message as a core request, multiplexed on the reply inbox.

        "No responders" while the registry still lists a live host is asked again a few times: in a cluster,
        a worker's subscription reaches the other servers a moment after its heartbeat may. Only then, or
        when the host is gone, is it `AgentNotFoundError`. (Nobody received the message: no double run.)
        """
        nc, registry = self._connection.nc, self._connection.registry_view
        delay = _NO_RESPONDERS_RETRY_S
        for attempt in range(_NO_RESPONDERS_ATTEMPTS):
            reply_to, future = self.replies.expect_reply(message_id)
            try:
                await nc.publish(subject, data, reply=reply_to, headers=headers)
                return await self.replies.answer(
                    future, max(deadline - time.monotonic(), 0.001), TimeoutError
                )
            except NoRespondersError:
                if (
                    attempt == _NO_RESPONDERS_ATTEMPTS - 1
                    or time.monotonic() + delay >= deadline
                    or not registry.has_live_host(recipient.namespace, recipient.type)
                ):
                    raise AgentNotFoundError(recipient, registered=True) from None
            except TimeoutError:
                raise ReplyTimeoutError(str(recipient), message_id, timeout_s) from None
            finally:
                future.cancel()  # no-op once answered; else the reply is no longer awaited
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def send_durable(
        self,
        subject: str,
        env: Envelope,
        headers: dict[str, str],
        recipient: AgentId,
        timeout_s: float,
        deadline: float,
    ) -> Reply:
        """Publish `env` into its inbox stream with the reply inbox as ``reply_to``; its reply."""
        reply_to, future = self.replies.expect_reply(env.id)
        env = msgspec.structs.replace(env, reply_to=reply_to)
        data = encode_envelope(env)
        try:
            check_payload_size(len(data) + headers_size(headers), self._connection.nc.max_payload)
            ack = await self._publish_durable(subject, data, headers, deadline, recipient, env.id, timeout_s)
            if ack.duplicate:
                # The same message id inside the dedupe window: the server dropped this copy, so nobody would
                # answer it. Ask the agent for the stored reply instead (the handler never runs twice).
                await self._resend(subject, env, headers, max(deadline - time.monotonic(), 0.001))
            self._awaited[env.id] = (subject, env, headers, deadline)
            try:
                return await self.replies.answer(
                    future, max(deadline - time.monotonic(), 0.001), TimeoutError
                )
            except TimeoutError:
                raise ReplyTimeoutError(str(recipient), env.id, timeout_s) from None
        finally:
            self._awaited.pop(env.id, None)
            future.cancel()  # no-op once answered

    def reconnected(self) -> None:
        """The connection is back: a reply published while it was down is lost, so every durable send still
        waiting sends a probe (a resend the agent answers from its checkpoint once the message is handled,
        and drops while it is not: then the message's own handling answers)."""
        for subject, env, headers, deadline in list(self._awaited.values()):
            task = asyncio.ensure_future(self._probe(subject, env, headers, deadline))
            self._probes.add(task)
            task.add_done_callback(self._probes.discard)

    def cancel_probes(self) -> None:
        for task in list(self._probes):
            task.cancel()

    async def _probe(self, subject: str, env: Envelope, headers: dict[str, str], deadline: float) -> None:
        delay = 0.1
        while env.id in self._awaited and (remaining := deadline - time.monotonic()) > 0:
            try:
                await self._resend(subject, env, headers, min(remaining, 5.0), RESEND_PROBE)
                return
            except Exception as exc:  # the cluster may still be electing leaders: again, until the deadline
                log.debug("reply probe for %s not stored yet: %r", env.id, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _publish_durable(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str],
        deadline: float,
        recipient: AgentId,
        msg_id: str,
        timeout_s: float,
    ) -> js_api.PubAck:
        """Publish into the inbox stream, riding out a leader election until `deadline`: a retry carries the
        same `Nats-Msg-Id`, so the stream keeps one copy even if an unanswered attempt was stored."""
        delay = 0.1
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                # Bounded per attempt: with no stream leader a publish is simply never answered.
                return await self._connection.acks.publish_acked(
                    subject, data, headers=headers, timeout=min(remaining, 5.0)
                )
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                if deadline - time.monotonic() <= delay:
                    raise ReplyTimeoutError(str(recipient), msg_id, timeout_s) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _resend(
        self,
        subject: str,
        env: Envelope,
        headers: dict[str, str],
        timeout: float,
        kind: str = RESEND_DUPLICATE,
    ) -> None:
        """Publish a copy of `env` marked as a resend under a fresh `Nats-Msg-Id`: it queues behind the
        original in the agent's FIFO and is answered from the checkpoint, never handled a second time."""
        resend = msgspec.structs.replace(env, metadata={**env.metadata, RESEND: kind})
        fresh = {**headers, HDR_MSG_ID: f"{env.id}{RESEND_ID_SEP}{time.time_ns()}"}
        await self._connection.acks.publish_acked(
            subject, encode_envelope(resend), headers=fresh, timeout=timeout
        )
