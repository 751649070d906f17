"""Kernel messages and run events: JSON round trips, the open type registry, immutability, failures."""

from __future__ import annotations

import base64
import json
import string
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError
from ulid import ULID

from plexus.core._errors import BudgetExhaustedError, KernelError, RemoteKernelError, SpawnDenied
from plexus.core._ids import MessageId, RunId, ToolCallId
from plexus.core._message_codec import (
    EventLogEntry,
    UnknownMessage,
    entry_from_json,
    entry_to_json,
    kernel_message_from_dict,
    register_message_type,
)
from plexus.core._message_values import ErrorInfo, FileAttachment, ToolCall, ToolResult
from plexus.core._messages import (
    InputMessage,
    KernelMessage,
    ReasoningMessage,
    ReplyMessage,
    RunCancelled,
    RunChildCompleted,
    RunChildSpawned,
    RunCompleted,
    RunFailed,
    RunLlmCall,
    RunMessageReceived,
    RunStarted,
    RunSuspended,
    RunTextDelta,
    RunToolCalled,
    RunToolResult,
    SystemMessage,
    ToolCallsMessage,
    ToolResultsMessage,
)
from plexus.core._usage import Cost, FinishReason, Usage

# -- strategies -----------------------------------------------------------------------------------------

_ID_CHARS = string.ascii_letters + string.digits + "_-.:"
ids = st.text(alphabet=_ID_CHARS, min_size=1, max_size=24)
texts = st.text(max_size=40)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
timestamps = st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False)
usages = st.sampled_from(
    [
        Usage(),
        Usage(input_tokens=100, cached_tokens=20, cache_write_tokens=5, output_tokens=40, reasoning_tokens=8),
        Usage(input_tokens=7, output_tokens=3, cost=Cost(amount=0.25, provider_amount="0.25")),
    ]
)
finish_reasons = st.sampled_from(
    [FinishReason.completed(), FinishReason.tool_call("tool_use"), FinishReason.other("weird")]
)
error_infos = st.builds(
    ErrorInfo,
    error_type=st.text(alphabet=string.ascii_letters, min_size=1, max_size=12),
    message=texts,
    fields=st.dictionaries(texts, json_values, max_size=3),
)
common = {"timestamp": timestamps, "id": ids.map(MessageId)}
run_common = {**common, "run_id": ids.map(RunId), "agent_id": ids}

kernel_messages = st.one_of(
    st.builds(
        InputMessage,
        text=texts,
        files=st.lists(
            st.builds(
                FileAttachment,
                data=st.binary(max_size=32),
                filename=st.none() | texts,
                mime_type=st.none() | st.just("image/png"),
            ),
            max_size=2,
        ),
        **common,
    ),
    st.builds(ReplyMessage, text=texts, **common),
    st.builds(ReasoningMessage, title=texts, summary=texts, **common),
    st.builds(
        ToolCallsMessage,
        calls=st.lists(st.builds(ToolCall, id=ids.map(ToolCallId), name=ids, args=json_values), max_size=3),
        **common,
    ),
    st.builds(
        ToolResultsMessage,
        results=st.lists(
            st.builds(
                ToolResult,
                call_id=st.none() | ids.map(ToolCallId),
                name=st.none() | ids,
                output=json_values,
                error=st.none() | error_infos,
            ),
            max_size=3,
        ),
        **common,
    ),
    st.builds(SystemMessage, text=texts, **common),
)

run_events = st.one_of(
    st.builds(
        RunStarted,
        parent_run_id=st.none() | ids.map(RunId),
        root_run_id=st.none() | ids.map(RunId),
        depth=st.integers(0, 10),
        **run_common,
    ),
    st.builds(RunMessageReceived, message_id=ids.map(MessageId), sender=st.none() | ids, **run_common),
    st.builds(RunToolCalled, call_id=ids.map(ToolCallId), tool_name=ids, arguments=json_values, **run_common),
    st.builds(
        RunToolResult,
        call_id=ids.map(ToolCallId),
        tool_name=st.none() | ids,
        output=json_values,
        error=st.none() | error_infos,
        **run_common,
    ),
    st.builds(RunChildSpawned, child_run_id=ids.map(RunId), child_agent_id=ids, **run_common),
    st.builds(
        RunChildCompleted,
        child_run_id=ids.map(RunId),
        child_agent_id=ids,
        status=st.sampled_from(["completed", "failed", "cancelled"]),
        output=json_values,
        error=st.none() | error_infos,
        usage=st.none() | usages,
        **run_common,
    ),
    st.builds(RunSuspended, reason=texts, **run_common),
    st.builds(RunCompleted, output=json_values, usage=st.none() | usages, **run_common),
    st.builds(RunFailed, error=error_infos, usage=st.none() | usages, **run_common),
    st.builds(RunCancelled, reason=st.none() | texts, **run_common),
    st.builds(RunTextDelta, text=texts, **run_common),
    st.builds(
        RunLlmCall,
        model=st.none() | ids,
        usage=st.none() | usages,
        finish_reason=st.none() | finish_reasons,
        duration_s=st.none() | st.floats(0, 1e6),
        **run_common,
    ),
)

entries = kernel_messages | run_events

ALL_TYPES: dict[str, type[KernelMessage]] = {
    "input": InputMessage,
    "reply": ReplyMessage,
    "reasoning": ReasoningMessage,
    "tool-calls": ToolCallsMessage,
    "tool-results": ToolResultsMessage,
    "system": SystemMessage,
    "run.started": RunStarted,
    "msg.received": RunMessageReceived,
    "tool.called": RunToolCalled,
    "tool.result": RunToolResult,
    "child.spawned": RunChildSpawned,
    "child.completed": RunChildCompleted,
    "run.suspended": RunSuspended,
    "run.completed": RunCompleted,
    "run.failed": RunFailed,
    "run.cancelled": RunCancelled,
    "text.delta": RunTextDelta,
    "llm.call": RunLlmCall,
}


class Log(BaseModel):
    """A model that stores entries the way an EventLog page would."""

    model_config = ConfigDict(frozen=True)
    entries: list[EventLogEntry]


# -- round trips ----------------------------------------------------------------------------------------


@given(entries)
def test_json_round_trip_keeps_type_and_value(entry: KernelMessage) -> None:
    decoded = entry_from_json(entry_to_json(entry))
    assert type(decoded) is type(entry)
    assert decoded == entry
    assert entry_to_json(decoded) == entry_to_json(entry)


@given(entries)
def test_dict_round_trip_in_python_and_json_modes(entry: KernelMessage) -> None:
    assert kernel_message_from_dict(entry.model_dump()) == entry
    assert kernel_message_from_dict(entry.model_dump(mode="json")) == entry


@given(st.lists(entries, max_size=4))
def test_entries_round_trip_as_a_pydantic_field(items: list[KernelMessage]) -> None:
    log = Log(entries=items)
    again = Log.model_validate_json(log.model_dump_json())
    assert again == log
    assert [type(e) for e in again.entries] == [type(e) for e in items]


def test_every_builtin_type_has_its_wire_tag() -> None:
    for tag, cls in ALL_TYPES.items():
        assert cls.model_fields["type"].default == tag


def test_file_data_is_raw_bytes_in_python_and_base64_in_json() -> None:
    message = InputMessage(
        files=[FileAttachment(data=b"\x00\xffpng", filename="a.png", mime_type="image/png")]
    )
    wire = json.loads(entry_to_json(message))
    assert wire["files"][0]["data"] == base64.b64encode(b"\x00\xffpng").decode()
    assert message.model_dump()["files"][0]["data"] == b"\x00\xffpng"
    decoded = entry_from_json(entry_to_json(message))
    assert isinstance(decoded, InputMessage)
    assert decoded.files[0].data == b"\x00\xffpng"


def test_wire_field_names_are_snake_case() -> None:
    result = ToolResultsMessage(results=[ToolResult(call_id=ToolCallId("c1"), output={"ok": True})])
    wire = json.loads(entry_to_json(result))
    assert wire["type"] == "tool-results"
    assert wire["results"][0] == {"call_id": "c1", "name": None, "output": {"ok": True}, "error": None}


# -- id and timestamp -----------------------------------------------------------------------------------


def test_new_message_gets_a_ulid_minted_from_its_timestamp() -> None:
    message = ReplyMessage(text="hi")
    assert isinstance(message.id, MessageId)
    assert ULID.from_str(message.id).milliseconds == int(message.timestamp * 1000)


def test_explicit_timestamp_drives_the_minted_id() -> None:
    message = SystemMessage(text="boot", timestamp=1_700_000_000.5)
    assert ULID.from_str(message.id).milliseconds == 1_700_000_000_500


@pytest.mark.parametrize("timestamp", [-1.0, float("inf"), float("nan"), 3e11])
def test_timestamps_outside_the_ulid_range_are_rejected(timestamp: float) -> None:
    with pytest.raises(ValidationError, match="timestamp"):
        ReplyMessage(text="a", timestamp=timestamp)


def test_integer_timestamp_is_seconds() -> None:
    message = ReplyMessage(text="a", timestamp=1_700_000_000)
    assert message.timestamp == 1_700_000_000.0
    assert ULID.from_str(message.id).milliseconds == 1_700_000_000_000


def test_two_messages_get_distinct_ids() -> None:
    assert ReplyMessage(text="a").id != ReplyMessage(text="a").id


def test_foreign_message_ids_are_accepted_but_malformed_ones_are_not() -> None:
    assert ReplyMessage(text="a", id="ext-42").id == "ext-42"
    with pytest.raises(ValidationError, match="whitespace"):
        ReplyMessage(text="a", id="has space")
    with pytest.raises(ValidationError, match="RunId"):
        ReplyMessage(text="a", id=str(RunId.new()))


# -- immutability ---------------------------------------------------------------------------------------


@given(entries)
def test_entries_are_frozen(entry: KernelMessage) -> None:
    with pytest.raises(ValidationError, match="frozen"):
        entry.id = MessageId("other")  # type: ignore[misc]


def test_nested_values_are_frozen() -> None:
    call = ToolCall(id=ToolCallId("c"), name="n")
    with pytest.raises(ValidationError, match="frozen"):
        call.name = "m"  # type: ignore[misc]
    attachment = FileAttachment(data=b"x")
    with pytest.raises(ValidationError, match="frozen"):
        attachment.data = b"y"  # type: ignore[misc]


# -- unknown types --------------------------------------------------------------------------------------


def test_unknown_type_is_kept_byte_for_byte() -> None:
    wire = b'{"z":1,"type":"future.kind","a":[1,2.5,"\xc3\xa9",{"y":null,"b":true}],"timestamp":17}'
    entry = entry_from_json(wire)
    assert isinstance(entry, UnknownMessage)
    assert entry.type == "future.kind"
    assert entry_to_json(entry) == wire
    assert entry.timestamp == 17.0
    assert entry.id is None


@given(
    st.dictionaries(st.text(max_size=6).filter(lambda k: k != "type"), json_values, max_size=5),
    st.integers(0, 5),
)
def test_unknown_type_keeps_every_field_and_their_order(fields: dict[str, Any], position: int) -> None:
    items = list(fields.items())
    items.insert(min(position, len(items)), ("type", "x.not-registered"))
    raw = dict(items)
    entry = kernel_message_from_dict(raw)
    assert isinstance(entry, UnknownMessage)
    assert entry.raw == raw
    dumped = json.loads(entry_to_json(entry))
    assert dumped == raw
    assert list(dumped) == list(raw)
    assert entry.model_dump() == raw
    again = entry_from_json(entry_to_json(entry))
    assert again == entry


def test_unknown_entries_survive_inside_a_model_field() -> None:
    unknown = kernel_message_from_dict({"type": "v2.thing", "payload": [1, 2]})
    log = Log(entries=[ReplyMessage(text="a"), unknown])
    dumped = json.loads(log.model_dump_json())
    assert dumped["entries"][1] == {"type": "v2.thing", "payload": [1, 2]}
    assert Log.model_validate_json(log.model_dump_json()).entries[1] == unknown


def test_unknown_message_type_must_match_raw() -> None:
    with pytest.raises(ValidationError, match="must equal raw"):
        UnknownMessage(type="a", raw={"type": "b"})


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        (b"[1, 2]", "must be an object"),
        (b'"reply"', "must be an object"),
        (b'{"text": "no type"}', "needs a string 'type'"),
        (b'{"type": 3}', "needs a string 'type'"),
        (b'{"type": ["reply"]}', "needs a string 'type'"),
        (b"{not json", "Invalid JSON"),
    ],
)
def test_malformed_entries_are_rejected(wire: bytes, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        entry_from_json(wire)


def test_kernel_message_from_dict_rejects_non_mappings() -> None:
    with pytest.raises(ValidationError, match="must be an object"):
        kernel_message_from_dict([("type", "reply")])  # type: ignore[arg-type]


# -- registry -------------------------------------------------------------------------------------------


class Heartbeat(KernelMessage):
    type: Literal["test.heartbeat"] = "test.heartbeat"
    beat: int


def test_registration_makes_a_type_decodable_everywhere() -> None:
    wire = b'{"type":"test.heartbeat","beat":3}'
    log_wire = b'{"entries":[' + wire + b"]}"
    before = entry_from_json(wire)
    assert isinstance(before, UnknownMessage)  # not registered yet: preserved, not rejected
    assert register_message_type(Heartbeat) is Heartbeat
    assert register_message_type(Heartbeat) is Heartbeat  # idempotent
    after = entry_from_json(wire)
    assert isinstance(after, Heartbeat)
    assert after.beat == 3
    assert isinstance(kernel_message_from_dict({"type": "test.heartbeat", "beat": 4}), Heartbeat)
    # The Log model was built before registration and still dispatches through the registry.
    log = Log.model_validate_json(log_wire)
    assert isinstance(log.entries[0], Heartbeat)
    again = Log.model_validate_json(log.model_dump_json())
    assert again == log
    assert json.loads(log.model_dump_json())["entries"][0]["beat"] == 3
    with pytest.raises(ValidationError, match="beat"):
        entry_from_json(b'{"type":"test.heartbeat","beat":"many"}')


def test_registration_rejects_a_taken_type() -> None:
    class OtherReply(KernelMessage):
        type: Literal["reply"] = "reply"
        text: str

    with pytest.raises(ValueError, match="already registered to ReplyMessage"):
        register_message_type(OtherReply)


def test_registration_rejects_non_messages_and_bad_declarations() -> None:
    class NotAMessage(BaseModel):
        type: Literal["test.x"] = "test.x"

    class NoLiteral(KernelMessage):
        type: str = "test.y"

    class NoDefault(KernelMessage):
        type: Literal["test.z"]

    class Mutable(KernelMessage):
        model_config = ConfigDict(frozen=False)
        type: Literal["test.m"] = "test.m"

    class Reserved(KernelMessage):
        type: Literal["<unknown>"] = "<unknown>"

    with pytest.raises(TypeError, match="KernelMessage subclass"):
        register_message_type(NotAMessage)  # type: ignore[type-var]
    with pytest.raises(TypeError, match="Literal"):
        register_message_type(NoLiteral)
    with pytest.raises(TypeError, match="Literal"):
        register_message_type(NoDefault)
    with pytest.raises(TypeError, match="frozen"):
        register_message_type(Mutable)
    with pytest.raises(TypeError, match="invalid type tag"):
        register_message_type(Reserved)


def test_an_unregistered_subclass_instance_is_refused_as_an_entry() -> None:
    class Stray(KernelMessage):
        type: Literal["test.stray"] = "test.stray"

    with pytest.raises(ValidationError, match="not registered"):
        Log(entries=[Stray()])


# -- failures of the built-in types ---------------------------------------------------------------------


def test_input_needs_text_or_files() -> None:
    with pytest.raises(ValidationError, match="needs text, files, or both"):
        InputMessage()
    assert InputMessage(text="").text == ""
    assert InputMessage(files=[FileAttachment(data=b"")]).text is None


def test_file_data_string_must_be_base64() -> None:
    with pytest.raises(ValidationError, match="must be base64"):
        FileAttachment(data="not base64!")
    assert FileAttachment(data="aGk=").data == b"hi"


@pytest.mark.parametrize(
    ("wire", "location"),
    [
        ({"type": "reply"}, "reply.text"),
        ({"type": "reasoning", "title": "t"}, "reasoning.summary"),
        ({"type": "tool-calls", "calls": [{"id": "", "name": "x"}]}, "tool-calls.calls.0.id"),
        ({"type": "tool-calls", "calls": [{"id": "c", "name": ""}]}, "tool-calls.calls.0.name"),
        ({"type": "tool-results", "results": [{"call_id": "c"}]}, "tool-results.results.0.output"),
        ({"type": "system", "text": "x", "colour": "red"}, "system.colour"),
        ({"type": "reply", "text": "x", "timestamp": "soon"}, "reply.timestamp"),
        ({"type": "run.started", "run_id": "r", "agent_id": ""}, "run.started.agent_id"),
        ({"type": "run.started", "run_id": "r", "agent_id": "a/b", "depth": -1}, "run.started.depth"),
        ({"type": "run.failed", "run_id": "r", "agent_id": "a/b"}, "run.failed.error"),
        (
            {"type": "run.failed", "run_id": "r", "agent_id": "a/b", "error": {"error_type": ""}},
            "run.failed.error.error_type",
        ),
        (
            {
                "type": "child.completed",
                "run_id": "r",
                "agent_id": "a",
                "child_run_id": "c",
                "child_agent_id": "b",
                "status": "exploded",
            },
            "child.completed.status",
        ),
        ({"type": "llm.call", "run_id": "r", "agent_id": "a", "duration_s": -1}, "llm.call.duration_s"),
        ({"type": "tool.called", "run_id": "r", "agent_id": "a", "call_id": "c"}, "tool.called.tool_name"),
    ],
)
def test_invalid_known_entries_name_the_field(wire: dict[str, Any], location: str) -> None:
    with pytest.raises(ValidationError) as info:
        kernel_message_from_dict(wire)
    locations = {".".join(map(str, err["loc"])) for err in info.value.errors()}
    assert location in locations


def test_arguments_must_be_json() -> None:
    with pytest.raises(ValidationError):
        ToolCall(id=ToolCallId("c"), name="n", args={"x": object()})


# -- ErrorInfo ------------------------------------------------------------------------------------------


def test_error_info_round_trips_a_kernel_error() -> None:
    error = BudgetExhaustedError("tokens", 4200, 4000)
    info = ErrorInfo.from_exception(error)
    assert info.error_type == "BudgetExhaustedError"
    assert info.message == "Token budget exceeded: 4200 > 4000"
    rebuilt = info.to_exception()
    assert isinstance(rebuilt, BudgetExhaustedError)
    assert rebuilt == error


def test_error_info_of_a_plain_exception_becomes_a_remote_error() -> None:
    info = ErrorInfo.from_exception(ValueError("bad thing"))
    assert (info.error_type, info.message, info.fields) == ("ValueError", "bad thing", {})
    rebuilt = info.to_exception()
    assert isinstance(rebuilt, RemoteKernelError)
    assert rebuilt.error_type == "ValueError"
    assert str(rebuilt) == "bad thing"


class MessagesTestOddError(KernelError):
    """An error whose fields are not JSON values."""

    fields = ("pair", "thing")

    def __init__(self, pair: tuple[int, int], thing: object) -> None:
        self.pair = pair
        self.thing = thing
        super().__init__("odd")


def test_error_info_keeps_odd_fields_as_json() -> None:
    info = ErrorInfo.from_exception(MessagesTestOddError((1, 2), object()))
    assert info.fields["pair"] == [1, 2]
    assert isinstance(info.fields["thing"], str)
    assert info.fields["thing"].startswith("<object")


def test_error_info_wire_shape_matches_kernel_error_to_wire() -> None:
    error = SpawnDenied("run_x", {"max_agents": 5})
    assert ErrorInfo.from_exception(error).model_dump(mode="json") == error.to_wire()
