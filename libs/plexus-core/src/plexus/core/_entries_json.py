"""The EventLog entries every durable message commits, written without building their models.

A worker logs `RunMessageReceived` (and `ReplyMessage` when the reply has text) for every durable message it
handles: building the pydantic models, minting their ids through the default factory and serialising them
cost ≈ 10 µs a message on the commit's path. These writers give the models' exact bytes (same fields, same
order, the id minted from the entry's own timestamp as the model's factory does) for the values a worker
passes; anything else goes through the model, which raises the errors it always did.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import msgspec

from ._ids import MessageId, parsed_run_id
from ._messages import _ULID_MAX_SECONDS, ReplyMessage, RunMessageReceived
from ._ulids import mint_ulid

__all__ = ["kernel_entry_json", "received_entry_json", "reply_entry_json"]

_ENCODER = msgspec.json.Encoder()


def _fast_timestamp(timestamp: float | None) -> float | None:
    """The entry's timestamp when the model would accept it and msgspec writes it as pydantic does."""
    ts = time.time() if timestamp is None else timestamp
    return ts if type(ts) is float and 0.0 <= ts <= _ULID_MAX_SECONDS else None


def kernel_entry_json(
    entry_type: str, fields: Mapping[str, str | int | None], *, timestamp: float | None = None
) -> bytes | None:
    """An entry of type `entry_type` with `fields` (already valid, in the model's declaration order, plain
    strings, ints and nulls), stamped and given its id as `KernelMessage` does; None when the timestamp is
    one msgspec would write differently from pydantic (build the model then). For a package's own entry
    types on a hot path; a test compares its bytes with the model's."""
    ts = _fast_timestamp(timestamp)
    return None if ts is None else _written(entry_type, ts, fields)


def received_entry_json(
    *, run_id: str, agent_id: str, message_id: str, sender: str | None, timestamp: float | None = None
) -> bytes:
    """``RunMessageReceived(...)`` serialised as `entry_to_json` would (timestamp: now by default)."""
    ts = _fast_timestamp(timestamp)
    fast = ts is not None and type(agent_id) is str and bool(agent_id)
    fast = fast and (sender is None or type(sender) is str)
    if fast:
        try:
            parsed_run_id(run_id)
            MessageId.parse(message_id)
        except (ValueError, TypeError):
            fast = False
    if not fast or ts is None:
        entry = RunMessageReceived(
            run_id=run_id,
            agent_id=agent_id,
            message_id=message_id,
            sender=sender,
            **({} if timestamp is None else {"timestamp": timestamp}),
        )
        return entry.__pydantic_serializer__.to_json(entry)
    fields = {"run_id": run_id, "agent_id": agent_id, "message_id": message_id, "sender": sender}
    return _written("msg.received", ts, fields)


def reply_entry_json(text: str, *, timestamp: float | None = None) -> bytes:
    """``ReplyMessage(text=text)`` serialised as `entry_to_json` would (timestamp: now by default)."""
    ts = _fast_timestamp(timestamp)
    if ts is None or type(text) is not str:
        entry = ReplyMessage(text=text, **({} if timestamp is None else {"timestamp": timestamp}))
        return entry.__pydantic_serializer__.to_json(entry)
    return _written("reply", ts, {"text": text})


def _written(entry_type: str, ts: float, fields: Mapping[str, str | int | None]) -> bytes:
    """A `KernelMessage`'s JSON: its type, its timestamp, an id minted from that timestamp, its fields."""
    return _ENCODER.encode({"type": entry_type, "timestamp": ts, "id": mint_ulid(ts), **fields})
