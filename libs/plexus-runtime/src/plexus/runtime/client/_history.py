"""What one agent handled, read back from its EventLog and checkpoint: the messages and its state around each.

A fork (`client/_fork.py`) starts from an agent's state as it was at one of its handled messages. The log
holds each committed message as one batch: `RunMessageReceived` first and, when the append alone committed
it, a ``plexus.committed`` marker carrying the state delta (`worker/_commit.py`). A message committed by a
checkpoint instead (an agent's first state change, every 16th message, a large change) logs no delta: its
state after is known only when the current checkpoint was written right after it (its ``log_seq``);
otherwise the states from there on are unknown (None) until that checkpoint.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import msgspec

from plexus.core import AgentId, RunMessageReceived
from plexus.runtime.store._connection import Connection
from plexus.runtime.store._eventlog import LogRecord
from plexus.runtime.wire._statedelta import apply_delta
from plexus.runtime.wire._subjects import checkpoint_key

__all__ = ["HandledMessage", "handled_messages"]

#: The marker's entry type (`worker/_commit.MessageCommitted`, a layer above this one).
_COMMITTED = "plexus.committed"


class _StoredCheckpoint(msgspec.Struct):
    """The fields of a checkpoint document (`worker/_activation.CheckpointDoc`) a reader needs."""

    state: dict[str, Any] = {}
    log_seq: int = 0


@dataclass(frozen=True)
class HandledMessage:
    """One message the agent took off its inbox, in log order. A state is None when it is not recorded."""

    message_id: str
    run_id: str
    seq: int
    #: When its entries were logged: the commit, after the handler returned.
    committed_at: float
    committed: bool
    state_before: dict[str, Any] | None
    state_after: dict[str, Any] | None


async def handled_messages(connection: Connection, agent_id: AgentId) -> list[HandledMessage]:
    """Every message `agent_id` logged, oldest first, with its state before and after (copies)."""
    records = await connection.event_log(agent_id).read()
    if not records:
        return []
    stored = await connection.gets.kv_entry(
        connection.topology.names.checkpoints_bucket,
        checkpoint_key(agent_id.namespace, agent_id.type, agent_id.key),
    )
    checkpoint = None
    if stored is not None and stored.data:
        checkpoint = msgspec.json.decode(stored.data, type=_StoredCheckpoint)
    batches: dict[int, list[LogRecord[Any]]] = {}
    for record in records:
        batches.setdefault(record.seq, []).append(record)
    state: dict[str, Any] | None = {}  # a new agent's state is empty
    out: list[HandledMessage] = []
    for seq, batch in batches.items():
        received = next((r.entry for r in batch if isinstance(r.entry, RunMessageReceived)), None)
        marker = next((r.entry for r in batch if getattr(r.entry, "type", None) == _COMMITTED), None)
        before = copy.deepcopy(state)
        if marker is not None:
            delta = getattr(marker, "state", None)
            if delta is not None and state is not None:
                apply_delta(state, delta)
        elif checkpoint is not None and checkpoint.log_seq == seq:
            state = dict(checkpoint.state)
        elif received is not None:
            state = None  # committed by a checkpoint since replaced (or not committed): unknown from here
        if received is not None:
            out.append(
                HandledMessage(
                    message_id=str(received.message_id),
                    run_id=str(received.run_id),
                    seq=seq,
                    committed_at=received.timestamp,
                    committed=marker is not None or (checkpoint is not None and checkpoint.log_seq >= seq),
                    state_before=before,
                    state_after=copy.deepcopy(state),
                )
            )
    return out
