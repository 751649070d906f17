"""`received_entry_json` and `reply_entry_json` against the pydantic models they stand in for."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from plexus.core import (
    MessageId,
    ReplyMessage,
    RunId,
    RunMessageReceived,
    entry_from_json,
    entry_to_json,
    received_entry_json,
    reply_entry_json,
)
from plexus.core._ulids import mint_ulid
from tests.core.strategies import texts

_run_ids = st.sampled_from([str(RunId.new()) for _ in range(3)]) | st.text(max_size=12)
_message_ids = st.sampled_from(
    [str(MessageId.new()) for _ in range(3)] + ["msg_foreign-id.1", "msg_"]
) | st.text(max_size=12)
# Every edge of the fast path: ordinary times, an integral one, zero, and beyond where it writes floats.
_timestamps = st.floats(0, 4e9) | st.sampled_from(
    [0.0, 1.0, 2.8e11, 2.9e11, 5e11, 1e12, 1e15, -1.0, float("inf")]
)


def _outcome(write: Callable[[], bytes]) -> bytes | str:
    try:
        return write()
    except ValidationError as exc:
        return repr(exc.errors(include_url=False, include_context=False))


def _assert_same_but_id(fast: bytes | str, model: bytes | str) -> None:
    """The bytes are the model's; the ids (random) differ only after their timestamp part."""
    if isinstance(fast, str) or isinstance(model, str):
        assert fast == model
        return
    fast_id, model_id = json.loads(fast)["id"], json.loads(model)["id"]
    assert fast_id[:10] == model_id[:10]  # a ULID's first 10 characters are its millisecond time
    assert fast.replace(fast_id.encode(), model_id.encode(), 1) == model


@given(
    run_id=_run_ids,
    agent_id=texts,
    message_id=_message_ids,
    sender=st.none() | texts,
    timestamp=_timestamps,
)
def test_a_received_entry_is_the_models_bytes(
    run_id: str, agent_id: str, message_id: str, sender: str | None, timestamp: float
) -> None:
    fields = {"run_id": run_id, "agent_id": agent_id, "message_id": message_id, "sender": sender}
    fast = _outcome(lambda: received_entry_json(**fields, timestamp=timestamp))  # type: ignore[arg-type]
    model = _outcome(lambda: entry_to_json(RunMessageReceived(**fields, timestamp=timestamp)))
    _assert_same_but_id(fast, model)
    if isinstance(fast, bytes):
        assert isinstance(entry_from_json(fast), RunMessageReceived)


@given(text=texts | st.text(), timestamp=_timestamps)
def test_a_reply_entry_is_the_models_bytes(text: str, timestamp: float) -> None:
    fast = _outcome(lambda: reply_entry_json(text, timestamp=timestamp))
    model = _outcome(lambda: entry_to_json(ReplyMessage(text=text, timestamp=timestamp)))
    _assert_same_but_id(fast, model)


def test_without_a_timestamp_an_entry_is_stamped_now_and_its_id_minted_from_it() -> None:
    run_id, message_id = str(RunId.new()), str(MessageId.new())
    before = time.time()
    for data in (
        received_entry_json(run_id=run_id, agent_id="ns/t/k", message_id=message_id, sender="ns/u/v"),
        reply_entry_json("hello"),
    ):
        entry = entry_from_json(data)
        assert isinstance(entry, RunMessageReceived | ReplyMessage)
        assert before <= entry.timestamp <= time.time()
        assert entry.id[:10] == mint_ulid(entry.timestamp)[:10]


@pytest.mark.parametrize(
    "fields",
    [
        {"run_id": "not a run id"},
        {"agent_id": ""},
        {"message_id": "no prefix"},
        {"sender": 3},
    ],
)
def test_bad_values_raise_the_models_errors(fields: dict[str, object]) -> None:
    good = {
        "run_id": str(RunId.new()),
        "agent_id": "ns/t/k",
        "message_id": str(MessageId.new()),
        "sender": None,
    }
    with pytest.raises(ValidationError) as fast:
        received_entry_json(**{**good, **fields})  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as model:
        RunMessageReceived(**{**good, **fields})
    assert fast.value.errors(include_url=False, include_context=False) == model.value.errors(
        include_url=False, include_context=False
    )
