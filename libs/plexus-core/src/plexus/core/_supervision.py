"""Supervision values for a run tree: priorities, budgets, history retention, retry policy (seed 000 kernel).

These are plain frozen values. The runtime enforces them, and every one of them travels as JSON with a
spawned child.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from ._errors import BudgetExhaustedError
from ._ids import RunId, SessionId
from ._usage import Usage

__all__ = [
    "DEFAULT_NON_RETRYABLE",
    "ExecutionBudget",
    "HistoryRetention",
    "Priority",
    "RetentionMode",
    "RetryPolicy",
    "SpawnBudget",
    "Supervision",
]

_PositiveInt = Annotated[int, Field(ge=1, strict=True)]
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Priority(IntEnum):
    """Scheduling weight. With ``allow_preempt``, a HIGH or CRITICAL spawn may pause the lowest-priority
    active agent below it when the spawn budget is full."""

    BACKGROUND = 0
    LOW = 1
    NORMAL = 2
    HIGH = 4
    CRITICAL = 8


class ExecutionBudget(BaseModel):
    """Limits on a whole run tree; None means unlimited. ``deadline_s`` counts from the root's start.

    ``max_cost_usd=0`` is allowed and means "free calls only". A token or turn budget of 0 is refused
    because it could never let a run start.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: _PositiveInt | None = None
    max_cost_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    max_turns: _PositiveInt | None = None
    deadline_s: _Seconds | None = None

    def exceeded(
        self, usage: Usage | None = None, *, turns: int = 0, elapsed_s: float = 0.0
    ) -> BudgetExhaustedError | None:
        """The first limit that `usage`, `turns` and `elapsed_s` are over, in the order tokens, cost, turns,
        deadline (a limit is over when used > limit); None while everything is within budget.

        Raises ValueError when a cost limit is set and the cost is not in USD, since it cannot be compared.
        """
        usage = usage or Usage()
        if self.max_tokens is not None and usage.total_tokens > self.max_tokens:
            return BudgetExhaustedError("tokens", usage.total_tokens, self.max_tokens)
        if self.max_cost_usd is not None and usage.cost is not None:
            if usage.cost.currency != "USD":
                raise ValueError(f"cannot check a cost in {usage.cost.currency} against max_cost_usd")
            if usage.cost.amount > self.max_cost_usd:
                return BudgetExhaustedError("cost", usage.cost.amount, self.max_cost_usd)
        if self.max_turns is not None and turns > self.max_turns:
            return BudgetExhaustedError("turns", turns, self.max_turns)
        if self.deadline_s is not None and elapsed_s > self.deadline_s:
            return BudgetExhaustedError("deadline", elapsed_s, self.deadline_s)
        return None

    def check(self, usage: Usage | None = None, *, turns: int = 0, elapsed_s: float = 0.0) -> None:
        """Raise the `BudgetExhaustedError` that `exceeded` finds, if any."""
        error = self.exceeded(usage, turns=turns, elapsed_s=elapsed_s)
        if error is not None:
            raise error


class SpawnBudget(BaseModel):
    """How many agents may be alive at once in one run tree; the root counts as 1, so 1 means no children."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_agents: _PositiveInt = 50
    allow_preempt: bool = True


class RetentionMode(StrEnum):
    FULL = "full"
    LAST_N = "last_n"
    NONE = "none"


class HistoryRetention(BaseModel):
    """How much of a run's history (its event log and transcript entries) to keep once the run has ended.

    * ``FULL`` keeps every entry; ``LAST_N`` keeps the newest ``last_n``; ``NONE`` keeps none, leaving only
      the run's final status and result.
    * ``max_age_s`` additionally drops entries older than that, whatever the mode.

    A live run always keeps what it needs to resume; retention is applied when the run ends, and at
    compaction. `retains` is the rule, stated once so that every store applies it the same way.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: RetentionMode = RetentionMode.FULL
    last_n: _PositiveInt | None = None
    max_age_s: _Seconds | None = None

    @model_validator(mode="after")
    def _v_last_n(self) -> Self:
        if self.mode is RetentionMode.LAST_N and self.last_n is None:
            raise ValueError("retention mode 'last_n' needs last_n (how many entries to keep)")
        if self.mode is not RetentionMode.LAST_N and self.last_n is not None:
            raise ValueError(f"last_n is only meaningful with mode 'last_n', not {self.mode.value!r}")
        return self

    @classmethod
    def full(cls, max_age_s: float | None = None) -> HistoryRetention:
        return cls(mode=RetentionMode.FULL, max_age_s=max_age_s)

    @classmethod
    def last(cls, n: int, max_age_s: float | None = None) -> HistoryRetention:
        return cls(mode=RetentionMode.LAST_N, last_n=n, max_age_s=max_age_s)

    @classmethod
    def none(cls) -> HistoryRetention:
        return cls(mode=RetentionMode.NONE)

    def retains(self, index_from_end: int, age_s: float) -> bool:
        """Whether to keep an entry that has `index_from_end` newer entries after it and is `age_s` old."""
        if index_from_end < 0 or age_s < 0:
            raise ValueError(f"index_from_end and age_s must be >= 0, got {index_from_end} and {age_s}")
        if self.max_age_s is not None and age_s > self.max_age_s:
            return False
        if self.mode is RetentionMode.NONE:
            return False
        if self.mode is RetentionMode.LAST_N:
            assert self.last_n is not None  # guaranteed by the validator
            return index_from_end < self.last_n
        return True


# Kernel failures that fail again the same way on a retry, and a reply timeout: its callee may still be
# working on the request, and a retry would send it again under a new message id (a duplicate). A policy
# whose `non_retryable` leaves "ReplyTimeoutError" out retries it all the same.
DEFAULT_NON_RETRYABLE: frozenset[str] = frozenset(
    {"BudgetExhaustedError", "CancellationError", "MiddlewareTermination", "ReplyTimeoutError", "SpawnDenied"}
)


class RetryPolicy(BaseModel):
    """Exponential backoff for a failed run or call (Temporal's shape).

    `attempt` counts failures so far (1 after the first failure), which is also the number of the retry
    being considered. ``backoff(n) = min(initial_backoff_s * multiplier**(n-1), max_backoff_s)``.
    ``non_retryable`` holds error type names. Passing your own set replaces the default, so extend
    `DEFAULT_NON_RETRYABLE` rather than drop it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_retries: Annotated[int, Field(ge=0, strict=True)] = 3
    initial_backoff_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    multiplier: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 2.0
    max_backoff_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 60.0
    non_retryable: frozenset[str] = DEFAULT_NON_RETRYABLE

    @model_validator(mode="after")
    def _v_cap(self) -> Self:
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(
                f"max_backoff_s ({self.max_backoff_s}) must be >= "
                f"initial_backoff_s ({self.initial_backoff_s})"
            )
        return self

    @field_serializer("non_retryable")
    def _ser_non_retryable(self, value: frozenset[str]) -> list[str]:
        return sorted(value)  # deterministic JSON

    @classmethod
    def no_retries(cls) -> RetryPolicy:
        return cls(max_retries=0)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (≥ 1), capped at ``max_backoff_s``."""
        if attempt < 1:
            raise ValueError(f"attempt counts failures and starts at 1, got {attempt}")
        try:
            raw = self.initial_backoff_s * self.multiplier ** (attempt - 1)
        except OverflowError:  # a late attempt of a steep policy; the cap applies anyway
            return self.max_backoff_s
        return min(raw, self.max_backoff_s)

    def should_retry(self, error_type: str | BaseException, attempt: int) -> bool:
        """Whether to retry after failure number `attempt` with `error_type` (a name, or the exception).

        An exception is non-retryable when its class or any base class is named in ``non_retryable``.
        """
        if attempt < 1:
            raise ValueError(f"attempt counts failures and starts at 1, got {attempt}")
        if isinstance(error_type, BaseException):
            names = {cls.__name__ for cls in type(error_type).__mro__}
        else:
            names = {error_type}
        return attempt <= self.max_retries and names.isdisjoint(self.non_retryable)


class Supervision(BaseModel):
    """Where a run sits in its tree and what governs it. Children share the tree's budgets and session.

    Invariants: a root has depth 0, no parent and ``root_id == run_id``; a child has depth ≥ 1, a parent,
    and a root other than itself.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: RunId
    session_id: SessionId | None = None
    root_id: RunId
    parent_id: RunId | None = None
    depth: Annotated[int, Field(ge=0, strict=True)] = 0
    spawn_budget: SpawnBudget = SpawnBudget()
    execution_budget: ExecutionBudget = ExecutionBudget()
    retention: HistoryRetention = HistoryRetention()
    priority: Priority = Priority.NORMAL

    @model_validator(mode="after")
    def _v_tree(self) -> Self:
        if self.depth == 0:
            if self.parent_id is not None:
                raise ValueError("a root run (depth 0) has no parent_id")
            if self.root_id != self.run_id:
                raise ValueError(f"a root run's root_id must be its run_id {self.run_id}, got {self.root_id}")
        else:
            if self.parent_id is None:
                raise ValueError(f"a child run (depth {self.depth}) needs a parent_id")
            if self.run_id in (self.parent_id, self.root_id):
                raise ValueError(f"a child run's run_id {self.run_id} must differ from its parent and root")
        return self

    @property
    def is_root(self) -> bool:
        return self.depth == 0

    @classmethod
    def root(
        cls,
        session_id: SessionId | None = None,
        *,
        run_id: RunId | None = None,
        spawn_budget: SpawnBudget | None = None,
        execution_budget: ExecutionBudget | None = None,
        retention: HistoryRetention | None = None,
        priority: Priority = Priority.NORMAL,
    ) -> Supervision:
        """A new run tree: a fresh run id (unless given), depth 0, ``root_id == run_id``."""
        rid = run_id if run_id is not None else RunId.new()
        return cls(
            run_id=rid,
            session_id=session_id,
            root_id=rid,
            parent_id=None,
            depth=0,
            spawn_budget=spawn_budget or SpawnBudget(),
            execution_budget=execution_budget or ExecutionBudget(),
            retention=retention or HistoryRetention(),
            priority=priority,
        )

    def spawn_child(
        self,
        priority: Priority | None = None,
        *,
        run_id: RunId | None = None,
        retention: HistoryRetention | None = None,
    ) -> Supervision:
        """A child one level down: a fresh run id, this run as parent, the same root, session and budgets.

        `priority` and `retention` default to this run's own. The budgets cannot be overridden because they
        belong to the whole tree. Whether a child is *allowed* (spawn budget) is the runtime's to decide.
        """
        return Supervision(
            run_id=run_id if run_id is not None else RunId.new(),
            session_id=self.session_id,
            root_id=self.root_id,
            parent_id=self.run_id,
            depth=self.depth + 1,
            spawn_budget=self.spawn_budget,
            execution_budget=self.execution_budget,
            retention=retention if retention is not None else self.retention,
            priority=priority if priority is not None else self.priority,
        )
