"""`progress_event_json` and `delta_event_json` against the pydantic models they stand in for."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from plexus.core import (
    AgentProgress,
    AgentStep,
    BaseBlock,
    ReasoningDelta,
    RunId,
    TextBlock,
    TextDelta,
    delta_event_json,
    progress_event_json,
)
from tests.core.strategies import content_blocks, metadata_maps, texts

_RUN, _ROOT, _PARENT = (str(RunId.new()) for _ in range(3))


def _model(**fields: Any) -> bytes | str:
    try:
        return AgentProgress(**fields).model_dump_json().encode()
    except ValidationError as exc:
        return repr(exc.errors(include_url=False, include_context=False))


def _fast(**fields: Any) -> bytes | str:
    try:
        return progress_event_json(**fields)
    except ValidationError as exc:
        return repr(exc.errors(include_url=False, include_context=False))


@given(
    step=st.sampled_from(list(AgentStep)),
    content=st.lists(content_blocks(max_leaves=3), max_size=3),
    metadata=metadata_maps,
    tree=st.sampled_from([(_RUN, _RUN, None, 0), (_RUN, _ROOT, _PARENT, 2)]),
    seq=st.integers(0, 2**40),
    ts=st.floats(0, 4e9),
)
def test_a_progress_event_is_the_models_bytes(
    step: AgentStep,
    content: list[BaseBlock],
    metadata: dict[str, Any],
    tree: tuple[str, str, str | None, int],
    seq: int,
    ts: float,
) -> None:
    run_id, root_id, parent_id, depth = tree
    fields = {
        "agent_id": "ns/t/k", "step": step, "content": content, "run_id": run_id, "root_id": root_id,
        "parent_id": parent_id, "depth": depth, "seq": seq, "ts": ts, "metadata": metadata,
    }  # fmt: skip
    assert progress_event_json(**fields) == _model(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "not a run id"},
        {"root_id": "run_x"},
        {"parent_id": _RUN},  # its own parent
        {"depth": 1},  # a root at depth 1
        {"parent_id": _PARENT, "depth": 0},  # a child at depth 0
        {"root_id": _ROOT},  # a root that names another root
        {"seq": -1},
        {"agent_id": ""},
        {"ts": 1e300},  # written by the model (msgspec and pydantic format the exponent differently)
        {"ts": float("inf")},
        {"metadata": {"x": float("nan")}},
        {"metadata": {1: "non-str key"}},
        # Values the quick metadata path leaves to the model: big ints, tuples, exponent floats, deep bags.
        {"metadata": {"big": 2**70, "neg": -(2**64)}},
        {"metadata": {"pair": (1, 2)}},
        {"metadata": {"small": 1e-7, "large": 1e17, "zero": -0.0}},
        {"metadata": {"deep": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}}},
        {"metadata": {"z": {"b": 1, "a": [{"d": 2, "c": None}]}, "a": True}},  # sorted at every depth
        {"content": [{"type": "text", "text": "a dict, not a block"}]},
        {"content": [{"type": "image"}]},
        {"content": ["not a block"]},
        {"step": "thinking"},  # a str, not the enum: the model coerces it
    ],
)
def test_odd_or_bad_progress_input_gets_the_models_answer(change: dict[str, Any]) -> None:
    fields: dict[str, Any] = {
        "agent_id": "ns/t/k", "step": AgentStep.DONE, "content": [TextBlock(text="x")], "run_id": _RUN,
        "root_id": _RUN, "parent_id": None, "depth": 0, "seq": 1, "ts": 1.5e9, "metadata": {"a": 1},
    }  # fmt: skip
    fields.update(change)
    assert _fast(**fields) == _model(**fields)


@given(texts, st.booleans())
def test_a_delta_event_is_the_models_bytes(text: str, reasoning: bool) -> None:
    model = ReasoningDelta(text=text) if reasoning else TextDelta(text=text)
    assert delta_event_json(text, reasoning=reasoning) == model.model_dump_json().encode()


def test_a_delta_that_is_not_text_is_refused_as_before() -> None:
    with pytest.raises(ValidationError):
        delta_event_json(5)  # type: ignore[arg-type]
