"""State deltas: a durable commit that changes its agent's state in ONE JetStream write.

An agent's state is a mapping of top-level keys. A commit compares each key's encoded JSON with the state
as of the agent's previous commit and logs only what changed, in the `MessageCommitted` marker that ends
its EventLog append: keys set (their new JSON), keys dropped, and lists that only grew (their new items: a
transcript that gains a turn logs the turn, not the transcript). The checkpoint is written when the delta
would be large, every `CHECKPOINT_EVERY` messages, and in the cases `Activation.plan_commit` lists;
an activation loads the checkpoint and applies the deltas logged after it, in log order (the event
sourcing with snapshots of Akka Persistence or Orleans' journaled grains, bounded to ≤ 15 deltas).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from plexus.runtime.wire._statedelta import apply_delta  # the reading side, shared with clients

__all__ = [
    "DELTA_MAX_BYTES",
    "STATE_DELTAS",
    "StateParts",
    "apply_delta",
    "encode_parts",
    "join_parts",
    "state_delta",
]

#: The worker feature (heartbeat `WorkerInfo.features`) of reading markers with a state delta or a progress
#: sequence: a worker writes them only while every live host of the agent's type can read them, so a
#: rolling upgrade never hands an agent to an older worker that would lose a change.
STATE_DELTAS = "state-delta"

#: A delta larger than this is not logged: the commit writes the checkpoint instead (a delta is stored in
#: the EventLog for good, and one near the size of the state saves nothing).
DELTA_MAX_BYTES = 32 * 1024

#: Each top-level key of a state and its value's encoded JSON, in the state's order.
StateParts = dict[str, bytes]

_encode = msgspec.json.Encoder().encode
_COMMA = ord(",")


class _DeltaOut(msgspec.Struct, omit_defaults=True):
    set: dict[str, msgspec.Raw] = {}
    ext: dict[str, msgspec.Raw] = {}
    drop: list[str] = []


def encode_parts(state: Mapping[str, Any]) -> StateParts | None:
    """The state's parts; None when a key is not a string (such a state is only ever checkpointed whole)."""
    if not all(type(key) is str for key in state):
        return None
    return {key: _encode(value) for key, value in state.items()}


def join_parts(parts: StateParts) -> bytes:
    """The whole state's JSON object, from its parts (what a checkpoint stores)."""
    return b"{" + b",".join(_encode(key) + b":" + value for key, value in parts.items()) + b"}"


def state_delta(old: StateParts, new: StateParts) -> bytes | None:
    """The encoded delta from `old` to `new` (which differ); None when it exceeds `DELTA_MAX_BYTES`."""
    sets: dict[str, msgspec.Raw] = {}
    exts: dict[str, msgspec.Raw] = {}
    size = 0
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        grown = None if before is None else _appended(before, value)
        if grown is not None:
            exts[key] = msgspec.Raw(grown)
            size += len(grown)
        else:
            sets[key] = msgspec.Raw(value)
            size += len(value)
        if size > DELTA_MAX_BYTES:
            return None
    dropped = [key for key in old if key not in new]
    return _encode(_DeltaOut(set=sets, ext=exts, drop=dropped))


def _appended(before: bytes, after: bytes) -> bytes | None:
    """The items added at the end, as a JSON array, when `after` is the list `before` grown; else None.

    Byte-level and sound for compact JSON: every element of `before` is followed in `after` by the same
    delimiter, and a JSON value's text ends unambiguously at its delimiter."""
    if not (before.startswith(b"[") and after.startswith(b"[")) or len(after) <= len(before):
        return None
    if before == b"[]":
        return after
    cut = len(before) - 1  # `before` without its closing bracket is a prefix, followed by a comma
    if after[cut] == _COMMA and after.startswith(before[:cut]):
        return b"[" + after[cut + 1 :]
    return None
