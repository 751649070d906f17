"""Reading a logged state delta: the ``state`` of a `MessageCommitted` marker (written by `worker/_delta.py`).

A delta is part of the EventLog's format, so it is read here, below both the worker (which rebuilds an
activation's state from its checkpoint and the deltas after it) and the client (which rebuilds the state an
agent had at each handled message, for `Runtime.fork_run`).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["apply_delta"]


class _DeltaIn(msgspec.Struct):
    set: dict[str, Any] = {}
    ext: dict[str, list[Any]] = {}
    drop: list[str] = []


_decode_delta = msgspec.json.Decoder(_DeltaIn).decode


def apply_delta(state: dict[str, Any], delta: bytes | str) -> None:
    """Apply one logged delta to a decoded state, in place."""
    change = _decode_delta(delta)
    for key in change.drop:
        state.pop(key, None)
    state.update(change.set)
    for key, items in change.ext.items():
        base = state.get(key)
        if not isinstance(base, list):
            # The log and the checkpoint disagree: never guess an agent's state.
            raise ValueError(f"state delta extends {key!r}, which is not a list in the state it applies to")
        state[key] = [*base, *items]
