"""`Runtime.post_message`: a message stored in a durable agent's inbox, with no reply awaited.

What a caller uses when the message's effect must be durable now and its outcome may come later (or never
to this process): a decision for an agent that awaits approval, say. The inbox stream has the message once
the call returns; the agent handles it once, in its key's order, on whichever worker owns it then, also one
that starts later. Nobody waits for the reply (the envelope has no ``reply_to``): a handler that fails is
logged by its worker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from plexus.core import AgentId, AgentNotFoundError, BaseBlock, MessageId
from plexus.runtime.store._artifacts import check_payload_size, headers_size
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._registry import Registry, RegistryCache
from plexus.runtime.wire._envelope import Envelope, RunInfo, encode_envelope, make_headers
from plexus.runtime.wire._subjects import Subjects

from ._supervisor import new_root_run

__all__ = ["PostClient"]


class PostClient:
    """Mixed into `Runtime`, which provides the connection and the helpers declared here."""

    _connection: Connection
    _registry_cache: RegistryCache
    registry: Registry

    def subjects_for(self, namespace: str) -> Subjects:
        raise NotImplementedError

    async def _payload(self, blocks: Sequence[BaseBlock]) -> msgspec.Raw:
        raise NotImplementedError

    def _envelope(
        self,
        payload: msgspec.Raw,
        target: AgentId,
        kind: str,
        sender: AgentId | None,
        run: RunInfo,
        message_id: str,
        timeout_s: float | None,
    ) -> Envelope:
        raise NotImplementedError

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
        handler. No live host is needed: the type must be registered and durable (a stateless type has no
        inbox to keep it: ValueError; an unknown one: AgentNotFoundError). The same `message_id` again,
        within the stream's duplicate window, is stored once."""
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        ns, name = agent_id.namespace, agent_id.type
        info = self._registry_cache.get_type(ns, name) or await self.registry.get_type(ns, name)
        if info is None:
            known = [t.type for t in self._registry_cache.list_types(ns)]
            raise AgentNotFoundError.unregistered(agent_id, name, known)
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
        check_payload_size(len(data) + headers_size(headers), self._connection.nc.max_payload)
        subject = self.subjects_for(ns).inbox(name, agent_id.key)
        await self._connection.acks.publish_acked(
            subject, data, headers=headers, timeout=max(deadline - time.monotonic(), 0.001)
        )
        return msg_id
