"""The durable commit of one handled message: its EventLog append, and the checkpoint (CAS) when needed.

Both writes are fenced: the EventLog append by the activation's last sequence, the checkpoint by its KV
revision, so a zombie worker's commit fails instead of overwriting the owner's (see architecture.md,
*Delivery and single activation*). The ack follows only after the commit.

A message is normally committed by the append alone (one write): its entries end with a `MessageCommitted`
marker carrying the encoded reply and the state delta (`worker/_delta.py`), from which the next activation
rebuilds the agent's state and its handled-message memory (`logged_since`). The checkpoint is written every
`CHECKPOINT_EVERY` messages, for a dead worker's half-commit, and when no brief delta says the change.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, SerializerFunctionWrapHandler, model_serializer

from plexus.core import (
    AgentId,
    KernelMessage,
    RunMessageReceived,
    entry_to_json,
    kernel_entry_json,
    received_entry_json,
    register_message_type,
    reply_entry_json,
)
from plexus.runtime.store._artifacts import PayloadTooLargeError
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._registry import type_ref
from plexus.runtime.store._schedule_store import ScheduleStore
from plexus.runtime.wire._envelope import Reply

from ._activation import (
    NO_IDS,
    REPLY_MAX_BYTES,
    Activation,
    ActivationTable,
    LoggedCommit,
    LoggedSince,
)
from ._delta import STATE_DELTAS
from ._work import _reply_text
from .pipeline._work import Work

if TYPE_CHECKING:
    from plexus.runtime._context import Context

__all__ = ["CheckpointTaken", "Committer", "MessageCommitted", "marker_json"]

#: How far before a message's inbox store time its commit is looked for: the inbox and the EventLog may be
#: led by different servers' clocks.
CLOCK_SLACK = datetime.timedelta(seconds=1)

log = logging.getLogger("plexus.worker")


@register_message_type
class MessageCommitted(KernelMessage):
    """The last entry of a message committed by its EventLog append alone (no checkpoint write): the message
    is handled, and `reply` (its encoded `Reply`, when small enough to keep) answers a redelivery."""

    # Fields a later version adds are ignored, not refused: a log must stay readable across an upgrade.
    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["plexus.committed"] = "plexus.committed"
    message_id: str
    reply: str | None = None
    #: The agent's state change (an encoded delta, `worker/_delta.py`); None: the state did not change.
    state: str | None = None
    #: The agent's progress sequence after the message, when it moved.
    progress_seq: int | None = None

    @model_serializer(mode="wrap")
    def _without_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Absent rather than null: a marker without a state change reads the same as before deltas existed,
        # so workers of the previous version (which refuse unknown fields) still read it.
        data = handler(self)
        for name in ("state", "progress_seq"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


def marker_json(
    message_id: str,
    *,
    reply: str | None,
    state: str | None,
    progress_seq: int | None,
    timestamp: float | None = None,
) -> bytes:
    """``MessageCommitted(...)`` as `entry_to_json` writes it, without building the model (once a message)."""
    fields: dict[str, str | int | None] = {"message_id": message_id, "reply": reply}
    if state is not None:
        fields["state"] = state
    if progress_seq is not None:
        fields["progress_seq"] = progress_seq
    data = kernel_entry_json("plexus.committed", fields, timestamp=timestamp)
    if data is None:  # a clock msgspec would write differently: the model's own bytes
        stamp = {} if timestamp is None else {"timestamp": timestamp}
        marker = MessageCommitted(
            message_id=message_id, reply=reply, state=state, progress_seq=progress_seq, **stamp
        )
        data = entry_to_json(marker)
    return data


@register_message_type
class CheckpointTaken(KernelMessage):
    """Logged (fenced) before a checkpoint the handler asks for (`ctx.checkpoint()`): a zombie — a handler
    that outlived its worker's lease — fails this append instead of replacing, by its checkpoint's CAS, the
    state the owner's logged deltas apply to."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["plexus.checkpoint"] = "plexus.checkpoint"
    message_id: str


#: Right before a commit's writes: None when the message's lease is certainly ours, else what to await
#: first (it raises `LeaseLost` when the lease is gone).
CommitGate = Callable[[Work], Awaitable[None] | None]
#: Seconds the message's lease is still certainly ours (None: no lease, e.g. core NATS work).
LeaseLeft = Callable[[Work], float | None]


def _open(work: Work) -> None:
    return None


class Committer:
    def __init__(
        self,
        connection: Connection,
        activations: ActivationTable,
        gate: CommitGate = _open,
        lease_left: LeaseLeft = _open,
        *,
        schedules: ScheduleStore | None = None,
    ) -> None:
        self.connection = connection
        self.activations = activations
        #: Expected-sequence appends fence a zombie only once the new owner has written the key: a handler
        #: that returns as its process resumes from a stall past the lease would otherwise commit (and
        #: answer) ahead of the owner's first append. The gate asks for the lease first.
        self._gate = gate
        #: An append unanswered is sent again until its timeout: a copy must not land after the lease may
        #: have passed to another worker (ahead of the new owner's first append, which is what fences it).
        #: So the commit's appends wait no longer than the lease is certainly ours.
        self._lease_left = lease_left
        self._schedules = schedules or ScheduleStore(connection)

    async def commit(
        self, activation: Activation, work: Work, ctx: Context, reply: Reply, reply_bytes: bytes | None
    ) -> None:
        """The EventLog append (and the checkpoint's CAS after it when needed): the ack that follows only
        follows durable effects."""
        env = work.env
        run_id = env.run.run_id if env.run else env.id
        # The entries as the log stores them, written without building their models (values intake checked).
        encoded = [
            received_entry_json(
                run_id=run_id, agent_id=str(work.agent_id), message_id=env.id, sender=env.sender
            ),
            *(entry_to_json(entry) for entry in ctx.pending_entries),
        ]
        if reply.ok and reply.payload is not None:
            text = _reply_text(reply)
            if text is not None:
                encoded.append(reply_entry_json(text))
        state = activation.encoded_state()
        # Deltas and progress sequences in markers only while every live host of the type reads them.
        deltas = self.connection.registry_view.supported_by_all(
            type_ref(work.agent_id.namespace, work.agent_id.type), STATE_DELTAS
        )
        checkpoint, delta = activation.plan_commit(state, env.id, self.connection.nc.max_payload, deltas)
        if not checkpoint:
            kept = reply_bytes if reply_bytes is not None and len(reply_bytes) <= REPLY_MAX_BYTES else None
            moved = activation.progress_seq != activation.saved_progress_seq
            encoded.append(
                marker_json(
                    env.id,
                    reply=None if kept is None else kept.decode(),
                    state=None if delta is None else delta.decode(),
                    progress_seq=activation.progress_seq if moved else None,
                )
            )
        if (wait := self._gate(work)) is not None:
            await wait
        timeout = self._lease_left(work)
        if reply.ok and ctx.pending_schedules:
            # Before the append: a crash between the two runs the handler again, which writes the same
            # schedules again (same subjects and ids: de-duplicated), never none (docs/schedules.md).
            await self._schedules.write(ctx.pending_schedules, timeout)
        if env.id in activation.logged:
            # Logged by a worker that died before its checkpoint: the entries are there already.
            activation.logged = activation.logged - {env.id}
        else:
            log = self.connection.event_log(work.agent_id)
            async with activation.log_turn():
                try:
                    activation.log_seq = await log.append_encoded(
                        encoded, expected_seq=activation.log_seq, timeout=timeout
                    )
                except PayloadTooLargeError:
                    if checkpoint:
                        raise
                    # The marker's delta and reply made the batch too big (nothing was sent): two writes.
                    encoded.pop()
                    checkpoint = True
                    activation.log_seq = await log.append_encoded(
                        encoded, expected_seq=activation.log_seq, timeout=timeout
                    )
        activation.remember(env.id, reply_bytes, reply_budget=self.connection.nc.max_payload // 4)
        if checkpoint:
            await self.activations.save(activation, state=state)
        else:
            activation.committed(state)

    async def committed(self, agent_id: AgentId, message_id: str, published: datetime.datetime) -> bool:
        """Whether `message_id` (stored in the inbox at `published`) is in `agent_id`'s EventLog, i.e. was
        committed. For redeliveries the checkpoint no longer remembers: a commit whose ack was lost (a
        node died) is redelivered after ack_wait, when newer messages of the key may have pushed its id
        out of `HANDLED_MEMORY`; running it again would apply it twice and out of order."""
        since = published - CLOCK_SLACK
        try:
            records = await self.connection.event_log(agent_id).read_since(since)
        except ValueError as exc:
            log.warning("cannot read the EventLog of %s since %s: %s", agent_id, since, exc)
            return False
        return any(
            isinstance(r.entry, RunMessageReceived) and r.entry.message_id == message_id for r in records
        )

    async def logged_since(self, agent_id: AgentId, seq: int) -> LoggedSince:
        """What `agent_id`'s EventLog holds after `seq`: messages committed by their append alone, and
        messages only logged (their worker died before the checkpoint)."""
        # An unreadable batch raises (ValueError): the state is rebuilt from these entries, and guessing
        # without them would silently lose committed changes. The activation fails; the message is retried.
        records = await self.connection.event_log(agent_id).read(from_seq=seq + 1)
        received = {str(r.entry.message_id) for r in records if isinstance(r.entry, RunMessageReceived)}
        committed = [
            LoggedCommit(
                message_id=r.entry.message_id,
                reply=None if r.entry.reply is None else r.entry.reply.encode(),
                delta=r.entry.state,
                progress_seq=r.entry.progress_seq,
            )
            for r in records
            if isinstance(r.entry, MessageCommitted)
        ]
        done = {c.message_id for c in committed}
        unfinished = received - done
        return LoggedSince(
            frozenset(unfinished) if unfinished else NO_IDS,
            committed,
            max((r.seq for r in records), default=0),
        )
