"""Agent progress events and model stream events."""

from __future__ import annotations

import json
import random
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from plexus.core._content import ImageBlock, TextBlock, ToolUseBlock
from plexus.core._ids import RunId
from plexus.core._progress import (
    AgentProgress,
    AgentStep,
    CompletionEvent,
    ReasoningDelta,
    StreamDone,
    StreamEvent,
    TextDelta,
    stream_event_from_json,
    stream_event_to_json,
)
from plexus.core._usage import FinishReason, Usage

ids = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=16)
run_ids = ids.map(RunId)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
metadatas = st.dictionaries(
    st.text(max_size=6), json_scalars | st.lists(json_scalars, max_size=3), max_size=4
)
contents = st.lists(
    st.sampled_from(
        [
            TextBlock(text="thinking about it"),
            ToolUseBlock(call_id="c1", tool_name="search", arguments={"q": "x"}),
            ImageBlock(url="https://example.com/a.png"),
        ]
    ),
    max_size=3,
)


@st.composite
def progress_events(draw: st.DrawFn) -> AgentProgress:
    run_id = draw(run_ids)
    is_root = draw(st.booleans())
    common: dict[str, Any] = {
        "agent_id": draw(ids),
        "step": draw(st.sampled_from(list(AgentStep))),
        "content": draw(contents),
        "run_id": run_id,
        "seq": draw(st.integers(0, 2**40)),
        "ts": draw(st.floats(0, 4e9)),
        "metadata": draw(metadatas),
    }
    if is_root:
        return AgentProgress(root_id=run_id, **common)
    parent = draw(run_ids.filter(lambda p: p != run_id))
    return AgentProgress(root_id=draw(run_ids), parent_id=parent, depth=draw(st.integers(1, 20)), **common)


stream_events = st.one_of(
    st.builds(TextDelta, text=st.text(max_size=30)),
    st.builds(ReasoningDelta, text=st.text(max_size=30)),
    st.builds(
        CompletionEvent,
        usage=st.sampled_from([Usage(), Usage(input_tokens=12, cached_tokens=4, output_tokens=9)]),
        finish_reason=st.sampled_from(
            [FinishReason.completed("stop"), FinishReason.max_tokens(), FinishReason.other("odd")]
        ),
    ),
    st.just(StreamDone()),
)


# -- AgentStep ------------------------------------------------------------------------------------------


def test_agent_steps_are_the_seed_steps() -> None:
    assert [s.value for s in AgentStep] == [
        "started",
        "thinking",
        "tool_call",
        "tool_result",
        "handoff",
        "paused",
        "done",
        "error",
    ]
    assert AgentStep("tool_call") is AgentStep.TOOL_CALL


# -- AgentProgress --------------------------------------------------------------------------------------


@given(progress_events())
def test_progress_json_round_trip(event: AgentProgress) -> None:
    again = AgentProgress.model_validate_json(event.model_dump_json())
    assert again == event
    assert [type(b) for b in again.content] == [type(b) for b in event.content]
    assert isinstance(again.run_id, RunId)
    assert again.model_dump_json() == event.model_dump_json()


def test_root_progress_defaults_root_id_and_timestamp() -> None:
    run = RunId.new()
    event = AgentProgress(agent_id="react/s1", step=AgentStep.STARTED, run_id=run, seq=0)
    assert event.root_id == run
    assert event.parent_id is None
    assert event.depth == 0
    assert event.ts > 1_600_000_000
    assert event.content == []


def test_child_progress_names_its_tree() -> None:
    root, parent, child = RunId.new(), RunId.new(), RunId.new()
    event = AgentProgress(
        agent_id="coder/k",
        step=AgentStep.TOOL_CALL,
        content=[ToolUseBlock(call_id="c", tool_name="shell")],
        run_id=child,
        root_id=root,
        parent_id=parent,
        depth=2,
        seq=5,
    )
    wire = json.loads(event.model_dump_json())
    assert (wire["root_id"], wire["parent_id"], wire["depth"], wire["step"]) == (root, parent, 2, "tool_call")
    assert wire["content"][0]["type"] == "tool_use"


def test_progress_metadata_is_deterministic() -> None:
    items = [("b", 1), ("a", {"y": 2, "x": 1}), ("c", None)]
    shuffled = items[:]
    random.Random(3).shuffle(shuffled)
    run = RunId.new()
    first = AgentProgress(agent_id="a", step="done", run_id=run, seq=1, ts=1.0, metadata=dict(items))
    second = AgentProgress(agent_id="a", step="done", run_id=run, seq=1, ts=1.0, metadata=dict(shuffled))
    assert first.model_dump_json() == second.model_dump_json()
    assert '"metadata":{"a":{"x":1,"y":2},"b":1,"c":null}' in first.model_dump_json()


def test_progress_is_frozen() -> None:
    event = AgentProgress(agent_id="a", step=AgentStep.DONE, run_id=RunId.new(), seq=0)
    with pytest.raises(ValidationError, match="frozen"):
        event.seq = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"depth": 2}, "a run without parent_id is a root and has depth 0"),
        ({"root_id": "run-other"}, "a root run is its own root"),
        ({"parent_id": "run-p", "depth": 0}, "a run with a parent_id is a child and has depth >= 1"),
        ({"parent_id": "run-1", "depth": 1, "root_id": "run-r"}, "a run cannot be its own parent"),
        ({"seq": -1}, "seq"),
        ({"depth": -1, "parent_id": "run-p"}, "depth"),
        ({"step": "sleeping"}, "step"),
        ({"agent_id": ""}, "agent_id"),
        ({"run_id": "has space"}, "whitespace"),
        ({"metadata": {"x": b"bytes"}}, "metadata"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_invalid_progress_is_rejected(fields: dict[str, Any], problem: str) -> None:
    base: dict[str, Any] = {"agent_id": "a/b", "step": "started", "run_id": "run-1", "seq": 0}
    with pytest.raises(ValidationError, match=problem):
        AgentProgress.model_validate({**base, **fields})


def test_progress_requires_seq() -> None:
    with pytest.raises(ValidationError, match="seq"):
        AgentProgress.model_validate({"agent_id": "a", "step": "started", "run_id": "run-1"})


# -- stream events --------------------------------------------------------------------------------------


@given(stream_events)
def test_stream_event_json_round_trip(
    event: TextDelta | ReasoningDelta | CompletionEvent | StreamDone,
) -> None:
    wire = stream_event_to_json(event)
    again = stream_event_from_json(wire)
    assert type(again) is type(event)
    assert again == event
    assert stream_event_to_json(again) == wire


def test_stream_event_wire_tags() -> None:
    assert json.loads(stream_event_to_json(TextDelta(text="hi"))) == {"type": "text_delta", "text": "hi"}
    assert json.loads(stream_event_to_json(ReasoningDelta(text="hm"))) == {
        "type": "reasoning_delta",
        "text": "hm",
    }
    assert json.loads(stream_event_to_json(StreamDone())) == {"type": "done"}
    completion = json.loads(
        stream_event_to_json(CompletionEvent(usage=Usage(), finish_reason=FinishReason.completed()))
    )
    assert completion["type"] == "completion"
    assert completion["finish_reason"] == {"kind": "completed", "raw": None}


class Frame(BaseModel):
    event: StreamEvent


@given(stream_events)
def test_stream_event_works_as_a_field(
    event: TextDelta | ReasoningDelta | CompletionEvent | StreamDone,
) -> None:
    frame = Frame(event=event)
    assert Frame.model_validate_json(frame.model_dump_json()) == frame


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        (b'{"type":"token","text":"x"}', "does not match any of the expected tags"),
        (b'{"text":"x"}', "Unable to extract tag using discriminator"),
        (b'{"type":"text_delta"}', "text_delta.text"),
        (b'{"type":"completion","usage":{}}', "completion.finish_reason"),
        (b'{"type":"done","extra":1}', "done.extra"),
        (b"not json", "Invalid JSON"),
    ],
)
def test_invalid_stream_events_are_rejected(wire: bytes, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        stream_event_from_json(wire)


def test_stream_events_are_frozen() -> None:
    delta = TextDelta(text="a")
    with pytest.raises(ValidationError, match="frozen"):
        delta.text = "b"  # type: ignore[misc]
