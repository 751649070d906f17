"""KernelError tree: each error survives the wire and an ErrorBlock as the same class with the same fields."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexus.core import (
    AgentCrashError,
    AgentNotFoundError,
    BudgetExhaustedError,
    CancellationError,
    ConcurrentAppendError,
    ErrorBlock,
    HandlerError,
    KernelError,
    MiddlewareTermination,
    NormalizeError,
    ProtocolError,
    RemoteKernelError,
    ReplyTimeoutError,
    SpawnBudget,
    SpawnDenied,
    content_block_from_dict,
)

text = st.text(max_size=50)
ints = st.integers(min_value=0, max_value=10**9)

errors = st.one_of(
    st.builds(AgentNotFoundError, st.from_regex(r"\A[a-z]{1,8}/[a-z0-9]{1,8}\Z")),
    st.builds(HandlerError, text, text, st.none() | text),
    st.builds(AgentCrashError, st.none() | text, text),
    st.builds(BudgetExhaustedError, st.sampled_from(["tokens", "cost", "turns"]), ints, ints),
    st.builds(MiddlewareTermination, text),
    st.builds(CancellationError, text),
    st.builds(ConcurrentAppendError, ints, st.none() | ints),
    st.builds(SpawnDenied, text, st.builds(SpawnBudget, max_agents=st.integers(1, 500))),
    st.builds(ProtocolError, text),
    st.builds(NormalizeError, text),
    st.builds(ReplyTimeoutError, text, text, st.floats(0.001, 1000)),
)


@given(errors)
def test_wire_round_trip_keeps_class_and_fields(error: KernelError) -> None:
    wire = json.loads(json.dumps(error.to_wire()))
    again = KernelError.from_wire(wire)
    assert type(again) is type(error)
    assert again.field_values() == error.field_values()
    assert str(again) == str(error)


@given(errors)
def test_error_block_round_trip(error: KernelError) -> None:
    block = error.to_block()
    assert block.error_type == type(error).__name__
    assert block.recoverable == error.recoverable
    decoded = content_block_from_dict(json.loads(block.model_dump_json()))
    assert isinstance(decoded, ErrorBlock)
    assert KernelError.from_block(decoded) == error


def test_budget_message_names_the_dimension() -> None:
    assert str(BudgetExhaustedError("tokens", 4200, 4000)) == "Token budget exceeded: 4200 > 4000"
    assert str(BudgetExhaustedError("cost", 1.5, 1.25)) == "Cost budget exceeded: 1.5 > 1.25"


def test_unknown_remote_type_keeps_name_and_fields() -> None:
    wire = {"v": 1, "error_type": "QuotaError", "message": "over quota", "fields": {"tenant": "acme"}}
    error = KernelError.from_wire(wire)
    assert isinstance(error, RemoteKernelError)
    assert error.error_type == "QuotaError"
    assert error.to_wire() == wire


def test_fields_of_another_version_are_kept_not_crashed() -> None:
    error = KernelError.from_wire({"error_type": "CancellationError", "fields": {"why": "x"}, "message": "m"})
    assert isinstance(error, RemoteKernelError)
    assert error.remote_fields["why"] == "x"


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        ([], "must be an object"),
        ({}, "non-empty string 'error_type'"),
        ({"error_type": "X", "fields": []}, "'fields' of X must be an object"),
    ],
)
def test_malformed_wire_errors_become_a_generic_error_that_keeps_what_came(
    wire: object, problem: str
) -> None:
    """Issue 9 item 5: a wire error that cannot be rebuilt is a typed result, never an exception."""
    error = KernelError.from_wire(wire)
    assert isinstance(error, RemoteKernelError)
    assert problem in error.remote_fields["_decode_error"]
    assert error.error_type == (
        "X" if isinstance(wire, dict) and wire.get("error_type") == "X" else "KernelError"
    )
    # It can travel on: re-encoding and rebuilding it again works.
    assert KernelError.from_wire(error.to_wire()).error_type == error.error_type


@pytest.mark.parametrize(
    "wire",
    [
        {"error_type": ""},  # the issue's cancel notice
        {"error_type": "BudgetExhaustedError", "fields": {"dimension": 5}},  # the issue's finished report
        {"error_type": "BudgetExhaustedError", "fields": {"dimension": "tokens", "used": "x", "limit": None}},
        {"error_type": "CancellationError", "fields": {"reason": {"deep": [1, 2]}}},
        {"error_type": 7, "message": None},
        "a string",
        None,
    ],
)
def test_issue_inputs_that_crashed_decoders_now_rebuild(wire: object) -> None:
    error = KernelError.from_wire(wire)
    assert isinstance(error, KernelError)
    assert isinstance(error.to_wire(), dict)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
        max_leaves=20,
    ),
    st.sampled_from(["", "KernelError", "BudgetExhaustedError", "CancellationError", "SpawnDenied", "Nope"]),
)
def test_from_wire_is_total(fields: object, error_type: str) -> None:
    """Any JSON value, as the whole error or as its fields, rebuilds to a KernelError without raising."""
    for wire in (fields, {"error_type": error_type, "fields": fields, "message": fields}):
        assert isinstance(KernelError.from_wire(wire), KernelError)


def test_duplicate_error_class_name_is_refused() -> None:
    with pytest.raises(TypeError, match="already registered"):
        type("HandlerError", (KernelError,), {})


def test_reply_timeout_is_also_a_builtin_timeout() -> None:
    assert isinstance(ReplyTimeoutError("a/b", "m", 1), TimeoutError)
