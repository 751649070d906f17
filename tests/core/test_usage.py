"""Usage / Cost arithmetic and validation, and FinishReason normalisation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from plexus.core._usage import (
    _PROVIDER_TABLES,
    Cost,
    CostBreakdown,
    FinishReason,
    FinishReasonKind,
    Usage,
)
from tests.core.strategies import metadata_maps

_money = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
_counts = st.integers(min_value=0, max_value=10**9)
breakdowns = st.builds(CostBreakdown, input=_money, output=_money, cache_read=_money, cache_write=_money)
provider_amounts = st.none() | st.decimals(min_value=0, max_value=10**6, places=6).map(str)


def costs(currency: str = "USD") -> st.SearchStrategy[Cost]:
    return st.builds(
        Cost,
        amount=_money,
        currency=st.just(currency),
        provider_amount=provider_amounts,
        breakdown=st.none() | breakdowns,
    )


@st.composite
def usages(draw: st.DrawFn, cost: st.SearchStrategy[Cost | None] | None = None) -> Usage:
    input_tokens = draw(_counts)
    cached = draw(st.integers(0, input_tokens))
    cache_write = draw(st.integers(0, input_tokens - cached))
    output = draw(_counts)
    return Usage(
        input_tokens=input_tokens,
        cached_tokens=cached,
        cache_write_tokens=cache_write,
        output_tokens=output,
        reasoning_tokens=draw(st.integers(0, output)),
        cost=draw(cost if cost is not None else st.none() | costs()),
        metadata=draw(metadata_maps),
    )


def _tokens(u: Usage) -> tuple[int, ...]:
    return (u.input_tokens, u.cached_tokens, u.cache_write_tokens, u.output_tokens, u.reasoning_tokens)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _same_cost(a: Cost | None, b: Cost | None) -> bool:
    """Equality up to float rounding (float addition is not exactly associative)."""
    if a is None or b is None:
        return a is b
    if (a.currency, a.provider_amount) != (b.currency, b.provider_amount):
        return False
    if not _close(a.amount, b.amount):
        return False
    if a.breakdown is None or b.breakdown is None:
        return a.breakdown is b.breakdown
    pairs = zip(a.breakdown.model_dump().values(), b.breakdown.model_dump().values(), strict=True)
    return all(_close(x, y) for x, y in pairs)


# --- Usage -------------------------------------------------------------------------------------------


def test_defaults_are_zero_and_total_is_input_plus_output() -> None:
    u = Usage()
    assert _tokens(u) == (0, 0, 0, 0, 0)
    assert u.cost is None
    assert u.metadata == {}
    assert (
        Usage(input_tokens=120, cached_tokens=100, output_tokens=30, reasoning_tokens=10).total_tokens == 150
    )


def test_addition_of_concrete_values() -> None:
    a = Usage(
        input_tokens=10, cached_tokens=4, output_tokens=5, cost=Cost(amount=0.25, provider_amount="0.25")
    )
    b = Usage(
        input_tokens=1, cache_write_tokens=1, output_tokens=2, reasoning_tokens=2, cost=Cost(amount=0.5)
    )
    total = a + b
    assert _tokens(total) == (11, 4, 1, 7, 2)
    assert total.cost == Cost(amount=0.75)  # provider_amount is lost once one side has none
    assert total.total_tokens == 18


@given(a=usages(), b=usages(), c=usages())
def test_addition_is_associative(a: Usage, b: Usage, c: Usage) -> None:
    left, right = (a + b) + c, a + (b + c)
    assert _tokens(left) == _tokens(right)
    assert _same_cost(left.cost, right.cost)
    assert left.metadata == right.metadata


@given(a=usages(), b=usages())
def test_addition_is_commutative_apart_from_metadata_clashes(a: Usage, b: Usage) -> None:
    ab, ba = a + b, b + a
    assert _tokens(ab) == _tokens(ba)
    assert _same_cost(ab.cost, ba.cost)
    if a.metadata.keys().isdisjoint(b.metadata.keys()):
        assert ab.metadata == ba.metadata


def test_metadata_clash_is_won_by_the_right_operand() -> None:
    a, b = Usage(metadata={"k": 1, "a": True}), Usage(metadata={"k": 2})
    assert (a + b).metadata == {"k": 2, "a": True}
    assert (b + a).metadata == {"k": 1, "a": True}


@given(u=usages())
def test_zero_is_the_identity(u: Usage) -> None:
    assert Usage.zero() + u == u
    assert u + Usage.zero() == u
    assert 0 + u == u


@given(items=st.lists(usages(), max_size=6))
def test_sum_totals_every_field(items: list[Usage]) -> None:
    total = sum(items, Usage.zero())
    assert sum(items) == (total if items else 0)
    assert total.input_tokens == sum(u.input_tokens for u in items)
    assert total.output_tokens == sum(u.output_tokens for u in items)
    assert total.cached_tokens == sum(u.cached_tokens for u in items)
    assert total.cache_write_tokens == sum(u.cache_write_tokens for u in items)
    assert total.reasoning_tokens == sum(u.reasoning_tokens for u in items)
    assert total.total_tokens == sum(u.total_tokens for u in items)
    reported = [u.cost.amount for u in items if u.cost is not None]
    if reported:
        assert total.cost is not None
        assert _close(total.cost.amount, math.fsum(reported))
    else:
        assert total.cost is None


@given(u=usages())
def test_usage_json_round_trip(u: Usage) -> None:
    assert Usage.model_validate_json(u.model_dump_json()) == u


def test_adding_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Usage() + 1  # type: ignore[operator]
    with pytest.raises(TypeError):
        1 + Usage()
    with pytest.raises(TypeError):
        True + Usage()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input_tokens": -1}, "input_tokens\n  Input should be greater than or equal to 0"),
        ({"output_tokens": -5}, "output_tokens\n  Input should be greater than or equal to 0"),
        ({"input_tokens": 1.5}, "input_tokens\n  Input should be a valid integer"),
        ({"input_tokens": 10, "cached_tokens": 8, "cache_write_tokens": 3}, "exceed input_tokens"),
        (
            {"output_tokens": 2, "reasoning_tokens": 3},
            "reasoning_tokens \\(3\\) exceed output_tokens \\(2\\)",
        ),
        ({"total_tokens": 3}, "total_tokens\n  Extra inputs are not permitted"),
        ({"metadata": {"x": b"bytes"}}, "metadata"),
    ],
)
def test_invalid_usage_is_refused_with_the_field_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Usage.model_validate(fields)


def test_usage_is_frozen() -> None:
    u = Usage()
    with pytest.raises(ValidationError, match="frozen"):
        u.input_tokens = 3  # type: ignore[misc]


# --- Cost --------------------------------------------------------------------------------------------


def test_cost_addition_requires_the_same_currency() -> None:
    with pytest.raises(ValueError, match="cannot add costs in different currencies: USD and EUR"):
        Cost(amount=1) + Cost(amount=1, currency="EUR")
    with pytest.raises(ValueError, match="different currencies: EUR and USD"):
        Usage(cost=Cost(amount=1, currency="EUR")) + Usage(cost=Cost(amount=2))


def test_none_cost_adds_as_nothing() -> None:
    c = Cost(amount=0.5, currency="EUR", provider_amount="0.50", breakdown=CostBreakdown(input=0.5))
    assert (Usage() + Usage(cost=c)).cost == c
    assert (Usage(cost=c) + Usage()).cost == c


def test_provider_amounts_add_exactly_as_decimals() -> None:
    total = Cost(amount=0.1, provider_amount="0.1") + Cost(amount=0.2, provider_amount="0.2")
    assert total.provider_amount == "0.3"
    assert Cost(amount=1, provider_amount="n/a") + Cost(amount=1, provider_amount="1") == Cost(amount=2)


def test_breakdowns_add_part_by_part_and_vanish_when_one_is_missing() -> None:
    a = Cost(amount=1.0, breakdown=CostBreakdown(input=0.25, output=0.5, cache_read=0.125, cache_write=0.125))
    b = Cost(amount=2.0, breakdown=CostBreakdown(input=1.0, output=1.0))
    assert (a + b).breakdown == CostBreakdown(input=1.25, output=1.5, cache_read=0.125, cache_write=0.125)
    assert (a + Cost(amount=1.0)).breakdown is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"amount": -0.01}, "amount\n  Input should be greater than or equal to 0"),
        ({"amount": float("nan")}, "amount\n  Input should be a finite number"),
        ({"amount": float("inf")}, "amount\n  Input should be a finite number"),
        ({"amount": 1, "currency": "usd"}, "ISO 4217 code of three upper-case letters, got 'usd'"),
        ({"amount": 1, "currency": "US"}, "ISO 4217 code of three upper-case letters, got 'US'"),
        ({"amount": 1, "currency": "USDT"}, "got 'USDT'"),
        ({"amount": 1, "provider_amount": "  "}, "provider_amount must not be blank"),
        (
            {"amount": 1, "breakdown": {"input": -1}},
            "breakdown.input\n  Input should be greater than or equal",
        ),
        ({"currency": "USD"}, "amount\n  Field required"),
    ],
)
def test_invalid_cost_is_refused_with_the_problem_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Cost.model_validate(fields)


def test_cost_defaults_to_usd() -> None:
    assert Cost(amount=0).currency == "USD"


# --- FinishReason ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "raw", "kind"),
    [
        ("openai", "stop", FinishReasonKind.COMPLETED),
        ("openai", "tool_calls", FinishReasonKind.TOOL_CALL),
        ("openai", "function_call", FinishReasonKind.TOOL_CALL),
        ("openai", "length", FinishReasonKind.MAX_TOKENS),
        ("openai", "content_filter", FinishReasonKind.BLOCKED),
        ("anthropic", "end_turn", FinishReasonKind.COMPLETED),
        ("anthropic", "stop_sequence", FinishReasonKind.COMPLETED),
        ("anthropic", "tool_use", FinishReasonKind.TOOL_CALL),
        ("anthropic", "pause_turn", FinishReasonKind.TOOL_CALL),
        ("anthropic", "max_tokens", FinishReasonKind.MAX_TOKENS),
        ("anthropic", "refusal", FinishReasonKind.BLOCKED),
        ("Anthropic", "END_TURN", FinishReasonKind.COMPLETED),
        ("gemini", "STOP", FinishReasonKind.COMPLETED),
        ("gemini", "SAFETY", FinishReasonKind.BLOCKED),
        ("vertex", "MAX_TOKENS", FinishReasonKind.MAX_TOKENS),
        ("azure", "tool_calls", FinishReasonKind.TOOL_CALL),
        ("some-new-gateway", "end_turn", FinishReasonKind.COMPLETED),
        ("some-new-gateway", "length", FinishReasonKind.MAX_TOKENS),
    ],
)
def test_from_provider_maps_known_values(provider: str, raw: str, kind: FinishReasonKind) -> None:
    reason = FinishReason.from_provider(provider, raw)
    assert reason.kind is kind
    assert reason.raw == raw  # the provider's own spelling is kept


@pytest.mark.parametrize(
    ("provider", "raw"),
    [("openai", "end_turn"), ("anthropic", "weird_new_reason"), ("x", "FINISH_REASON_UNSPECIFIED")],
)
def test_unknown_values_become_other_with_raw(provider: str, raw: str) -> None:
    reason = FinishReason.from_provider(provider, raw)
    assert reason == FinishReason.other(raw)
    assert str(reason) == f"other({raw})"


@pytest.mark.parametrize("raw", ["", "   "])
def test_from_provider_refuses_an_empty_value(raw: str) -> None:
    with pytest.raises(ValueError, match="finish reason from 'openai' is empty"):
        FinishReason.from_provider("openai", raw)


def test_provider_tables_agree_where_they_overlap() -> None:
    # The fallback for unknown providers is the union of the tables, which is only sound if they agree.
    seen: dict[str, FinishReasonKind] = {}
    for table in _PROVIDER_TABLES.values():
        for raw, kind in table.items():
            assert raw == raw.lower()
            assert seen.setdefault(raw, kind) is kind, raw


def test_other_needs_a_raw_value() -> None:
    with pytest.raises(ValidationError, match="kind 'other' needs the provider's raw value"):
        FinishReason(kind=FinishReasonKind.OTHER)
    with pytest.raises(ValidationError, match="kind 'other' needs"):
        FinishReason.other("")


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValidationError, match="kind\n  Input should be 'completed', 'tool_call'"):
        FinishReason.model_validate({"kind": "finished"})


@pytest.mark.parametrize(
    "reason",
    [
        FinishReason.completed(),
        FinishReason.completed("stop"),
        FinishReason.tool_call("tool_use"),
        FinishReason.max_tokens(),
        FinishReason.cancelled("user"),
        FinishReason.blocked("refusal"),
        FinishReason.error(),
        FinishReason.other("pause_for_thought"),
    ],
)
def test_finish_reason_json_round_trip(reason: FinishReason) -> None:
    data = reason.model_dump_json()
    assert FinishReason.model_validate_json(data) == reason
    assert '"kind":"' + reason.kind.value + '"' in data


def test_factories_set_the_kind_and_str_is_readable() -> None:
    assert FinishReason.completed().kind is FinishReasonKind.COMPLETED
    assert FinishReason.tool_call().kind is FinishReasonKind.TOOL_CALL
    assert FinishReason.max_tokens().kind is FinishReasonKind.MAX_TOKENS
    assert FinishReason.cancelled().kind is FinishReasonKind.CANCELLED
    assert FinishReason.blocked().kind is FinishReasonKind.BLOCKED
    assert FinishReason.error().kind is FinishReasonKind.ERROR
    assert str(FinishReason.tool_call("tool_use")) == "tool_call"
    assert FinishReason.completed("stop") != FinishReason.completed("end_turn")  # raw is part of the value
