"""State deltas (`worker/_delta.py`): applying the delta from one state to another to the first state gives
the second, whatever changed; a list that only grew logs its new items."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from plexus.runtime.worker._delta import (
    DELTA_MAX_BYTES,
    apply_delta,
    encode_parts,
    join_parts,
    state_delta,
)

json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
states = st.dictionaries(st.text(max_size=6), json_value, max_size=6)


def _parts(state: dict[str, Any]) -> dict[str, bytes]:
    parts = encode_parts(state)
    assert parts is not None
    return parts


@settings(max_examples=300, deadline=None)
@given(old=states, new=states)
def test_a_delta_turns_the_old_state_into_the_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    before, after = _parts(old), _parts(new)
    assert json.loads(join_parts(before)) == old
    delta = state_delta(before, after)
    assert delta is not None
    state = json.loads(join_parts(before))
    apply_delta(state, delta)
    assert state == json.loads(join_parts(after))


@settings(max_examples=200, deadline=None)
@given(base=st.lists(json_value, max_size=5), added=st.lists(json_value, min_size=1, max_size=3))
def test_a_grown_list_logs_only_its_new_items(base: list[Any], added: list[Any]) -> None:
    delta = state_delta(_parts({"items": base}), _parts({"items": [*base, *added]}))
    assert delta is not None
    assert json.loads(delta) == {"ext": {"items": added}}


def test_a_changed_element_is_not_mistaken_for_growth() -> None:
    # "[1" is a prefix of "[12]", and of '["a","b"]' is '["a"' a prefix of '["a\\",…' — none of them grew.
    for old, new in (([1], [12]), (["a"], ['a",x']), ([1, 2], [1, 23, 4]), ([[1]], [[1, 2]])):
        delta = state_delta(_parts({"k": old}), _parts({"k": new}))
        assert delta is not None
        assert json.loads(delta) == {"set": {"k": new}}


def test_large_changes_and_non_string_keys_get_no_delta() -> None:
    assert state_delta({}, _parts({"k": "x" * DELTA_MAX_BYTES})) is None
    assert encode_parts({1: "a"}) is None  # type: ignore[dict-item]
