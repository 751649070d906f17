"""`marker_json` (a message's commit marker, written without its model) against `MessageCommitted`."""

from __future__ import annotations

import json
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from plexus.core import MessageId, entry_from_json, entry_to_json
from plexus.runtime.worker._commit import MessageCommitted, marker_json
from tests.core.strategies import texts


def _outcome(write: Callable[[], bytes]) -> bytes | str:
    try:
        return write()
    except ValidationError as exc:
        return repr(exc.errors(include_url=False, include_context=False))


@given(
    message_id=st.sampled_from([str(MessageId.new()), "msg_foreign"]) | texts,
    reply=st.none() | texts,
    state=st.none() | texts,
    progress_seq=st.none() | st.integers(0, 2**53),
    timestamp=st.floats(0, 4e9) | st.sampled_from([0.0, 2.8e11, 5e11, 1e12, 1e15]),
)
def test_a_marker_is_the_models_bytes(
    message_id: str, reply: str | None, state: str | None, progress_seq: int | None, timestamp: float
) -> None:
    fields = {"message_id": message_id, "reply": reply, "state": state, "progress_seq": progress_seq}
    fast = _outcome(lambda: marker_json(**fields, timestamp=timestamp))  # type: ignore[arg-type]
    model = _outcome(lambda: entry_to_json(MessageCommitted(**fields, timestamp=timestamp)))
    if isinstance(fast, str) or isinstance(model, str):  # a time no ULID holds: the model's error, both
        assert fast == model
        return
    fast_id, model_id = json.loads(fast)["id"], json.loads(model)["id"]
    assert fast_id[:10] == model_id[:10]  # the same millisecond time; the rest is random
    assert fast.replace(fast_id.encode(), model_id.encode(), 1) == model
    assert entry_from_json(fast) == entry_from_json(model).model_copy(update={"id": fast_id})
