"""The handled-message memory of an activation: `remember`'s quick path decides as the full scan does."""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from plexus.runtime.worker._activation import (
    HANDLED_MEMORY,
    REPLY_MAX_BYTES,
    REPLY_MEMORY,
    Activation,
    _with_recent_replies,
)
from tests.runtime.apps_misc import idle_activation


def _reference(
    handled: OrderedDict[str, bytes | None], message_id: str, reply: bytes | None, budget: int
) -> None:
    """The rule as first written: a scan of the newest REPLY_MEMORY + 1 entries on every call."""
    handled[message_id] = reply if reply is None or len(reply) <= REPLY_MAX_BYTES else None
    handled.move_to_end(message_id)
    while len(handled) > HANDLED_MEMORY:
        handled.popitem(last=False)
    size = 0
    for position, (mid, stored) in enumerate(list(islice(reversed(handled.items()), REPLY_MEMORY + 1))):
        if stored is None:
            continue
        if position < REPLY_MEMORY and size + len(stored) <= budget:
            size += len(stored)
        else:
            handled[mid] = None


def _activation(handled: OrderedDict[str, bytes | None]) -> Activation:
    return idle_activation(handled)


_replies = st.none() | st.sampled_from([0, 10, 700, REPLY_MAX_BYTES, REPLY_MAX_BYTES + 1]).map(
    lambda n: b"r" * n
)
_calls = st.lists(
    st.tuples(
        # A small pool of ids: some are remembered again (a re-run), most are new.
        st.integers(0, 9).map(lambda i: f"old{i}") | st.uuids().map(str),
        _replies,
        st.sampled_from([REPLY_MEMORY * REPLY_MAX_BYTES, 262_144, 5_000, 1_000]),
    ),
    max_size=120,
)
_loaded = st.lists(st.tuples(st.uuids().map(str), _replies), max_size=70)


@settings(max_examples=200)
@given(loaded=_loaded, calls=_calls)
def test_remember_keeps_what_the_full_scan_keeps(
    loaded: list[tuple[str, bytes | None]], calls: list[tuple[str, bytes | None, int]]
) -> None:
    activation = _activation(_with_recent_replies(loaded))  # as an activation loads its checkpoint
    expected = _with_recent_replies(loaded)
    for message_id, reply, budget in calls:
        activation.remember(message_id, reply, reply_budget=budget)
        _reference(expected, message_id, reply, budget)
        assert list(activation.handled.items()) == list(expected.items())
