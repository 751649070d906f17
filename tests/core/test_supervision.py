"""Supervision values: priorities, budgets, retention, retry policy and the run-tree record."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from plexus.core._errors import BudgetExhaustedError, CancellationError, SpawnDenied
from plexus.core._ids import RunId, SessionId
from plexus.core._supervision import (
    DEFAULT_NON_RETRYABLE,
    ExecutionBudget,
    HistoryRetention,
    Priority,
    RetentionMode,
    RetryPolicy,
    SpawnBudget,
    Supervision,
)
from plexus.core._usage import Cost, Usage

_seconds = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)

execution_budgets = st.builds(
    ExecutionBudget,
    max_tokens=st.none() | st.integers(1, 10**9),
    max_cost_usd=st.none() | st.floats(0, 1e4, allow_nan=False, allow_infinity=False),
    max_turns=st.none() | st.integers(1, 1000),
    deadline_s=st.none() | _seconds,
)
spawn_budgets = st.builds(SpawnBudget, max_agents=st.integers(1, 1000), allow_preempt=st.booleans())
retentions = st.one_of(
    st.builds(HistoryRetention.full, max_age_s=st.none() | _seconds),
    st.builds(HistoryRetention.last, n=st.integers(1, 10_000), max_age_s=st.none() | _seconds),
    st.just(HistoryRetention.none()),
)
priorities = st.sampled_from(Priority)
retry_policies = st.builds(
    lambda retries, initial, extra, multiplier, names: RetryPolicy(
        max_retries=retries,
        initial_backoff_s=initial,
        max_backoff_s=initial + extra,
        multiplier=multiplier,
        non_retryable=frozenset(names),
    ),
    st.integers(0, 20),
    st.floats(0, 100, allow_nan=False),
    st.floats(0, 1000, allow_nan=False),
    st.floats(1, 10, allow_nan=False),
    st.sets(st.sampled_from(["ValueError", "KeyError", "SpawnDenied", "X"]), max_size=3),
)


@st.composite
def supervisions(draw: st.DrawFn) -> Supervision:
    node = Supervision.root(
        draw(st.none() | st.just(SessionId.new()) | st.just(SessionId("user-chat"))),
        spawn_budget=draw(spawn_budgets),
        execution_budget=draw(execution_budgets),
        retention=draw(retentions),
        priority=draw(priorities),
    )
    for _ in range(draw(st.integers(0, 4))):
        node = node.spawn_child(draw(st.none() | priorities), retention=draw(st.none() | retentions))
    return node


def _round_trips(value: BaseModel) -> None:
    data = value.model_dump_json()
    json.loads(data)  # real JSON
    assert type(value).model_validate_json(data) == value


# --- Priority -----------------------------------------------------------------------------------------


def test_priority_values_and_order() -> None:
    assert [(p.name, p.value) for p in Priority] == [
        ("BACKGROUND", 0),
        ("LOW", 1),
        ("NORMAL", 2),
        ("HIGH", 4),
        ("CRITICAL", 8),
    ]
    assert Priority.BACKGROUND < Priority.LOW < Priority.NORMAL < Priority.HIGH < Priority.CRITICAL


# --- ExecutionBudget ----------------------------------------------------------------------------------


def test_execution_budget_defaults_to_unlimited() -> None:
    budget = ExecutionBudget()
    assert (budget.max_tokens, budget.max_cost_usd, budget.max_turns, budget.deadline_s) == (None,) * 4
    huge = Usage(input_tokens=10**12, cost=Cost(amount=1e9))
    assert budget.exceeded(huge, turns=10**6, elapsed_s=1e9) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 0}, "max_tokens\n  Input should be greater than or equal to 1"),
        ({"max_tokens": -5}, "max_tokens\n  Input should be greater than or equal to 1"),
        ({"max_tokens": 1.5}, "max_tokens\n  Input should be a valid integer"),
        ({"max_turns": 0}, "max_turns\n  Input should be greater than or equal to 1"),
        ({"max_cost_usd": -0.01}, "max_cost_usd\n  Input should be greater than or equal to 0"),
        ({"max_cost_usd": float("nan")}, "max_cost_usd\n  Input should be a finite number"),
        ({"deadline_s": 0}, "deadline_s\n  Input should be greater than 0"),
        ({"deadline_s": float("inf")}, "deadline_s\n  Input should be a finite number"),
        ({"max_agents": 3}, "max_agents\n  Extra inputs are not permitted"),
    ],
)
def test_execution_budget_refuses_bad_limits(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ExecutionBudget.model_validate(fields)


def test_zero_cost_budget_means_free_calls_only() -> None:
    budget = ExecutionBudget(max_cost_usd=0)
    assert budget.exceeded(Usage(cost=Cost(amount=0))) is None
    error = budget.exceeded(Usage(cost=Cost(amount=0.001)))
    assert error == BudgetExhaustedError("cost", 0.001, 0)


def test_exceeded_reports_each_dimension_in_the_seed_wording() -> None:
    budget = ExecutionBudget(max_tokens=4000, max_cost_usd=1.5, max_turns=3, deadline_s=60)
    over_tokens = Usage(input_tokens=4000, output_tokens=200)
    error = budget.exceeded(over_tokens)
    assert error is not None
    assert str(error) == "Token budget exceeded: 4200 > 4000"
    assert (error.dimension, error.used, error.limit) == ("tokens", 4200, 4000)
    assert str(budget.exceeded(Usage(cost=Cost(amount=2.25)))) == "Cost budget exceeded: 2.25 > 1.5"
    assert str(budget.exceeded(turns=4)) == "Turn budget exceeded: 4 > 3"
    assert str(budget.exceeded(elapsed_s=60.5)) == "Deadline budget exceeded: 60.5 > 60"


def test_limits_are_inclusive_and_tokens_are_checked_first() -> None:
    budget = ExecutionBudget(max_tokens=100, max_cost_usd=1.0, max_turns=3, deadline_s=10)
    at_limit = Usage(input_tokens=60, output_tokens=40, cost=Cost(amount=1.0))
    assert budget.exceeded(at_limit, turns=3, elapsed_s=10) is None
    everything_over = Usage(input_tokens=101, cost=Cost(amount=2.0))
    error = budget.exceeded(everything_over, turns=9, elapsed_s=99)
    assert error is not None
    assert error.dimension == "tokens"


def test_check_raises_the_budget_error() -> None:
    budget = ExecutionBudget(max_turns=1)
    budget.check(turns=1)
    with pytest.raises(BudgetExhaustedError, match="Turn budget exceeded: 2 > 1"):
        budget.check(turns=2)


def test_a_cost_in_another_currency_cannot_be_checked_against_usd() -> None:
    budget = ExecutionBudget(max_cost_usd=1)
    with pytest.raises(ValueError, match="cannot check a cost in EUR against max_cost_usd"):
        budget.exceeded(Usage(cost=Cost(amount=0.5, currency="EUR")))
    assert ExecutionBudget().exceeded(Usage(cost=Cost(amount=0.5, currency="EUR"))) is None


# --- SpawnBudget --------------------------------------------------------------------------------------


def test_spawn_budget_defaults_and_limits() -> None:
    assert SpawnBudget() == SpawnBudget(max_agents=50, allow_preempt=True)
    assert SpawnBudget(max_agents=1).max_agents == 1  # only the root
    with pytest.raises(ValidationError, match="max_agents\n  Input should be greater than or equal to 1"):
        SpawnBudget(max_agents=0)


def test_spawn_denied_accepts_a_spawn_budget() -> None:
    error = SpawnDenied("run_x", SpawnBudget(max_agents=3))
    assert error.budget == {"max_agents": 3, "allow_preempt": True}
    assert "spawn budget of 3 agents exhausted" in str(error)


# --- HistoryRetention ---------------------------------------------------------------------------------


def test_retention_modes() -> None:
    full, last3, nothing = HistoryRetention.full(), HistoryRetention.last(3), HistoryRetention.none()
    assert HistoryRetention() == full
    assert [full.retains(i, 0) for i in range(5)] == [True] * 5
    assert [last3.retains(i, 0) for i in range(5)] == [True, True, True, False, False]
    assert [nothing.retains(i, 0) for i in range(3)] == [False] * 3
    assert last3.mode is RetentionMode.LAST_N


def test_max_age_drops_old_entries_in_any_mode() -> None:
    full = HistoryRetention.full(max_age_s=3600)
    assert full.retains(100, 3600)
    assert not full.retains(0, 3600.5)
    assert not HistoryRetention.last(10, max_age_s=5).retains(0, 6)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "last_n"}, "retention mode 'last_n' needs last_n"),
        ({"mode": "full", "last_n": 3}, "last_n is only meaningful with mode 'last_n', not 'full'"),
        ({"mode": "none", "last_n": 3}, "not 'none'"),
        ({"mode": "last_n", "last_n": 0}, "last_n\n  Input should be greater than or equal to 1"),
        ({"mode": "some"}, "mode\n  Input should be 'full', 'last_n' or 'none'"),
        ({"max_age_s": 0}, "max_age_s\n  Input should be greater than 0"),
    ],
)
def test_retention_refuses_inconsistent_settings(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        HistoryRetention.model_validate(fields)


def test_retains_refuses_negative_positions() -> None:
    with pytest.raises(ValueError, match="must be >= 0, got -1 and 0"):
        HistoryRetention().retains(-1, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        HistoryRetention().retains(0, -0.5)


# --- RetryPolicy --------------------------------------------------------------------------------------


def test_retry_policy_defaults_and_backoff_sequence() -> None:
    policy = RetryPolicy()
    assert (policy.max_retries, policy.initial_backoff_s, policy.multiplier, policy.max_backoff_s) == (
        3,
        1.0,
        2.0,
        60.0,
    )
    assert policy.non_retryable == DEFAULT_NON_RETRYABLE
    assert [policy.backoff(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert policy.backoff(10**6) == 60.0  # no OverflowError


def test_backoff_refuses_attempt_zero() -> None:
    with pytest.raises(ValueError, match="attempt counts failures and starts at 1, got 0"):
        RetryPolicy().backoff(0)
    with pytest.raises(ValueError, match="starts at 1"):
        RetryPolicy().should_retry("ValueError", 0)


@given(policy=retry_policies, attempt=st.integers(1, 5000))
def test_backoff_is_capped_and_never_decreases(policy: RetryPolicy, attempt: int) -> None:
    delay = policy.backoff(attempt)
    assert 0 <= delay <= policy.max_backoff_s
    assert policy.backoff(attempt + 1) >= delay
    if attempt == 1:
        assert delay == policy.initial_backoff_s


def test_should_retry_counts_attempts() -> None:
    policy = RetryPolicy(max_retries=2)
    assert [policy.should_retry("TimeoutError", n) for n in (1, 2, 3)] == [True, True, False]
    assert not RetryPolicy.no_retries().should_retry("TimeoutError", 1)


def test_should_retry_refuses_non_retryable_names_and_their_subclasses() -> None:
    policy = RetryPolicy()
    assert not policy.should_retry("BudgetExhaustedError", 1)
    assert not policy.should_retry(CancellationError("x"), 1)
    custom = RetryPolicy(non_retryable=DEFAULT_NON_RETRYABLE | {"LookupError"})
    assert not custom.should_retry(KeyError("k"), 1)  # KeyError is a LookupError
    assert custom.should_retry(ValueError("v"), 1)
    assert custom.should_retry("KeyError", 1)  # a bare name has no base classes to consult


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_retries": -1}, "max_retries\n  Input should be greater than or equal to 0"),
        ({"multiplier": 0.5}, "multiplier\n  Input should be greater than or equal to 1"),
        ({"initial_backoff_s": -1}, "initial_backoff_s\n  Input should be greater than or equal to 0"),
        (
            {"initial_backoff_s": 10, "max_backoff_s": 5},
            r"max_backoff_s \(5.0\) must be >= initial_backoff_s",
        ),
        ({"max_backoff_s": float("inf")}, "max_backoff_s\n  Input should be a finite number"),
    ],
)
def test_retry_policy_refuses_bad_settings(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RetryPolicy.model_validate(fields)


def test_retry_policy_json_is_deterministic() -> None:
    policy = RetryPolicy(non_retryable=frozenset({"b", "a", "c"}))
    assert json.loads(policy.model_dump_json())["non_retryable"] == ["a", "b", "c"]


@given(policy=retry_policies)
def test_retry_policy_json_round_trip(policy: RetryPolicy) -> None:
    _round_trips(policy)


# --- Supervision --------------------------------------------------------------------------------------


def test_root_is_its_own_root() -> None:
    session = SessionId("user-42")
    root = Supervision.root(session, priority=Priority.HIGH)
    assert root.is_root
    assert root.depth == 0
    assert root.parent_id is None
    assert root.root_id == root.run_id
    assert root.run_id.startswith("run_")
    assert root.session_id == session
    assert root.priority is Priority.HIGH
    assert root.spawn_budget == SpawnBudget()
    assert root.execution_budget == ExecutionBudget()
    assert root.retention == HistoryRetention()
    fixed = RunId("run-fixed")
    assert Supervision.root(run_id=fixed).run_id == fixed


def test_spawn_child_shares_the_tree_and_goes_one_level_down() -> None:
    budget = ExecutionBudget(max_tokens=1000)
    spawn = SpawnBudget(max_agents=5, allow_preempt=False)
    root = Supervision.root(
        SessionId.new(), spawn_budget=spawn, execution_budget=budget, priority=Priority.LOW
    )
    child = root.spawn_child()
    grandchild = child.spawn_child(Priority.CRITICAL, retention=HistoryRetention.last(2))
    for node, parent in ((child, root), (grandchild, child)):
        assert node.parent_id == parent.run_id
        assert node.run_id not in (parent.run_id, root.run_id)
        assert node.root_id == root.run_id
        assert node.session_id == root.session_id
        assert node.spawn_budget is spawn
        assert node.execution_budget is budget
        assert node.depth == parent.depth + 1
        assert not node.is_root
    assert child.priority is Priority.LOW  # inherited
    assert grandchild.priority is Priority.CRITICAL
    assert child.retention == HistoryRetention()
    assert grandchild.retention == HistoryRetention.last(2)
    assert root.spawn_child().run_id != child.run_id


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"run_id": "r1", "root_id": "r1", "parent_id": "p"}, "a root run \\(depth 0\\) has no parent_id"),
        ({"run_id": "r1", "root_id": "r0"}, "a root run's root_id must be its run_id r1, got r0"),
        ({"run_id": "r1", "root_id": "r0", "depth": 2}, "a child run \\(depth 2\\) needs a parent_id"),
        ({"run_id": "r1", "root_id": "r0", "parent_id": "r1", "depth": 1}, "must differ from its parent"),
        (
            {"run_id": "r1", "root_id": "r1", "parent_id": "r0", "depth": 1},
            "must differ from its parent and root",
        ),
        (
            {"run_id": "r1", "root_id": "r1", "depth": -1},
            "depth\n  Input should be greater than or equal to 0",
        ),
        ({"run_id": "r1", "root_id": "r1", "priority": 3}, "priority\n  Input should be 0, 1, 2, 4 or 8"),
        ({"run_id": str(SessionId.new()), "root_id": "r1"}, "is a SessionId .* not a RunId"),
        ({"run_id": "r1"}, "root_id\n  Field required"),
    ],
)
def test_supervision_refuses_a_broken_tree(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Supervision.model_validate(fields)


def test_supervision_is_frozen() -> None:
    root = Supervision.root()
    with pytest.raises(ValidationError, match="frozen"):
        root.depth = 3  # type: ignore[misc]


@given(node=supervisions())
def test_supervision_json_round_trip(node: Supervision) -> None:
    _round_trips(node)
    data = json.loads(node.model_dump_json())
    assert data["priority"] == int(node.priority)
    assert isinstance(data["run_id"], str)


@given(budget=execution_budgets, spawn=spawn_budgets, retention=retentions)
def test_budget_values_json_round_trip(
    budget: ExecutionBudget, spawn: SpawnBudget, retention: HistoryRetention
) -> None:
    for value in (budget, spawn, retention):
        _round_trips(value)
