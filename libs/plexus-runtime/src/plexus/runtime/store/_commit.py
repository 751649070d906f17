"""The durable commit of one handled message: EventLog entries, then the checkpoint (CAS).

Both writes are fenced: the EventLog append by the activation's last sequence, the checkpoint by its KV
revision, so a zombie worker's commit fails instead of overwriting the owner's (see architecture.md,
*Delivery and single activation*). The ack follows only after both.
"""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Any

from plexus.core import AgentId, ReplyMessage, RunMessageReceived
from plexus.runtime.wire._envelope import Reply
from plexus.runtime.worker._activation import Activation, ActivationTable
from plexus.runtime.worker._work import _reply_text, _Work

if TYPE_CHECKING:
    from plexus.runtime._context import Context
    from plexus.runtime.client._client import Runtime

__all__ = ["Committer"]

log = logging.getLogger("plexus.worker")


class Committer:
    def __init__(self, rt: Runtime, activations: ActivationTable) -> None:
        self.rt = rt
        self.activations = activations

    async def commit(
        self, activation: Activation, work: _Work, ctx: Context, reply: Reply, encoded: bytes | None
    ) -> None:
        """EventLog, then checkpoint (CAS), so the ack that follows only follows durable effects."""
        env = work.env
        run_id = env.run.run_id if env.run else env.id
        entries: list[Any] = [
            RunMessageReceived(
                run_id=run_id, agent_id=str(work.agent_id), message_id=env.id, sender=env.sender
            ),
            *ctx.pending_entries,
        ]
        if reply.ok and reply.payload is not None:
            text = _reply_text(reply)
            if text is not None:
                entries.append(ReplyMessage(text=text))
        if env.id in activation.logged:
            # Logged by a worker that died before its checkpoint: the entries are there already.
            activation.logged.discard(env.id)
        else:
            async with activation.log_lock:
                activation.log_seq = await self.rt.event_log(work.agent_id).append(
                    entries, expected_seq=activation.log_seq
                )
        activation.remember(env.id, encoded, reply_budget=self.rt.nc.max_payload // 4)
        await self.activations.save(activation)

    async def committed(self, agent_id: AgentId, message_id: str, published: datetime.datetime) -> bool:
        """Whether `message_id` (stored in the inbox at `published`) is in `agent_id`'s EventLog, i.e. was
        committed. For redeliveries the checkpoint no longer remembers: a commit whose ack was lost (a
        node died) is redelivered after ack_wait, when newer messages of the key may have pushed its id
        out of `HANDLED_MEMORY`; running it again would apply it twice and out of order."""
        # A second of slack: the inbox and the EventLog may be led by different servers' clocks.
        since = published - datetime.timedelta(seconds=1)
        try:
            records = await self.rt.event_log(agent_id).read_since(since)
        except ValueError as exc:
            log.warning("cannot read the EventLog of %s since %s: %s", agent_id, since, exc)
            return False
        return any(
            isinstance(r.entry, RunMessageReceived) and r.entry.message_id == message_id for r in records
        )

    async def logged_since(self, agent_id: AgentId, seq: int) -> set[str]:
        """Ids of the messages received in `agent_id`'s EventLog after `seq`."""
        try:
            records = await self.rt.event_log(agent_id).read(from_seq=seq + 1)
        except ValueError as exc:
            # An unreadable batch (written by someone else than the worker): best effort, never a wedge.
            log.warning("cannot read the EventLog of %s past seq %d: %s", agent_id, seq, exc)
            return set()
        return {r.entry.message_id for r in records if isinstance(r.entry, RunMessageReceived)}
