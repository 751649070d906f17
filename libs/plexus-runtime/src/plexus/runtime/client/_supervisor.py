"""The supervision seam: budget accounting and spawning go through a `Supervisor`.

`LocalSupervisor` is the default: it enforces a run's `ExecutionBudget` per process and spawns children
without a cluster-wide limit. The orchestrator service replaces it with one that keeps the accounting in
JetStream so a whole run tree on many workers shares one budget.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from ulid import ULID

from plexus.core import AgentId, BudgetExhaustedError, ExecutionBudget, MessageId, Priority, RunId, Usage
from plexus.runtime.wire._envelope import RunInfo

__all__ = ["LocalSupervisor", "Supervisor", "child_run_id", "new_root_run"]


class Supervisor(Protocol):
    async def consume(self, run: RunInfo, agent_id: AgentId, usage: Usage, turns: int) -> None:
        """Account `usage` to the run tree; raise BudgetExhaustedError when a dimension is exhausted."""
        ...

    async def check(self, run: RunInfo, max_age_s: float = 0.0) -> None:
        """Raise if the run tree may not continue (budget exhausted, cancelled, past its deadline).

        ``max_age_s``: the tree's budget may be taken as this process last verified it (a consume or check
        of the same tree) when that was at most this long ago, instead of being read again."""
        ...

    async def spawn(
        self,
        parent: RunInfo,
        parent_agent: AgentId,
        child: AgentId,
        priority: int | None,
        run_id: str | None = None,
    ) -> RunInfo:
        """Admit a child run (SpawnDenied when over the tree's SpawnBudget); return its RunInfo.

        ``run_id`` is the child's id when the caller chose one (`child_run_id`): admitting the same id
        twice must not take a second slot."""
        ...

    async def finished(self, run: RunInfo, status: str) -> None:
        """A (child) run ended; release its slot."""
        ...


def child_run_id(message_id: str, ordinal: int, parent_run_id: str | None = None) -> str:
    """The run id of the `ordinal`-th child spawned while handling message `message_id`.

    Deterministic, so a handler retried after its worker crashed spawns its children under the same run
    ids: the orchestrator admits a known id once (no second spawn slot) and its EventLog entries match. The
    ULID keeps a stable creation time — the parent message's, else the parent run's — so ids still sort by
    time; the rest is a hash.
    """
    digest = hashlib.sha256(f"{message_id}\x00{ordinal}".encode()).digest()
    millis = _ulid_millis(MessageId, message_id) or _ulid_millis(RunId, parent_run_id) or 0
    return f"{RunId.prefix}_{ULID.from_bytes(millis.to_bytes(6, 'big') + digest[:10])}"


def _ulid_millis(kind: type[MessageId] | type[RunId], value: str | None) -> int | None:
    if not value or not value.startswith(kind.prefix + "_"):
        return None
    try:
        minted = kind(value).ulid
    except (TypeError, ValueError):
        return None
    return int(minted.milliseconds) if minted is not None else None


def new_root_run(
    *,
    session_id: str | None = None,
    priority: int = int(Priority.NORMAL),
    budget: ExecutionBudget | None = None,
    deadline: float | None = None,
    run_id: str | None = None,
) -> RunInfo:
    """A run with no parent: the root of a new run tree (`run_id` defaults to a fresh `RunId`)."""
    run_id = run_id or str(RunId.new())
    if budget is not None and budget.deadline_s is not None and deadline is None:
        deadline = time.time() + budget.deadline_s
    return RunInfo(
        run_id=run_id,
        root_id=run_id,
        parent_id=None,
        depth=0,
        priority=priority,
        session_id=session_id,
        deadline=deadline,
        budget=budget.model_dump(mode="json") if budget is not None else None,
    )


@dataclass
class _Totals:
    tokens: int = 0
    cost: float = 0.0
    turns: int = 0


class LocalSupervisor:
    """Per-process budget enforcement (the orchestrator makes it cluster-wide)."""

    def __init__(self) -> None:
        # Bounded: every client send starts a new root run; the oldest trees' totals are forgotten first.
        self._totals: OrderedDict[str, _Totals] = OrderedDict()
        self._memory = 10_000

    async def consume(self, run: RunInfo, agent_id: AgentId, usage: Usage, turns: int) -> None:
        totals = self._totals.setdefault(run.root_id, _Totals())
        self._totals.move_to_end(run.root_id)
        while len(self._totals) > self._memory:
            self._totals.popitem(last=False)
        totals.tokens += usage.total_tokens
        totals.cost += usage.cost.amount if usage.cost else 0.0
        totals.turns += turns
        await self.check(run)

    async def check(self, run: RunInfo, max_age_s: float = 0.0) -> None:
        # The totals are this process's own: always current, so ``max_age_s`` changes nothing here.
        if run.budget is None:
            return
        budget = ExecutionBudget.model_validate(run.budget)
        totals = self._totals.get(run.root_id, _Totals())
        if budget.max_tokens is not None and totals.tokens > budget.max_tokens:
            raise BudgetExhaustedError("tokens", totals.tokens, budget.max_tokens)
        if budget.max_cost_usd is not None and totals.cost > budget.max_cost_usd:
            raise BudgetExhaustedError("cost", totals.cost, budget.max_cost_usd)
        if budget.max_turns is not None and totals.turns > budget.max_turns:
            raise BudgetExhaustedError("turns", totals.turns, budget.max_turns)

    async def spawn(
        self,
        parent: RunInfo,
        parent_agent: AgentId,
        child: AgentId,
        priority: int | None,
        run_id: str | None = None,
    ) -> RunInfo:
        await self.check(parent)
        return RunInfo(
            run_id=run_id or str(RunId.new()),
            root_id=parent.root_id,
            parent_id=parent.run_id,
            depth=parent.depth + 1,
            priority=parent.priority if priority is None else priority,
            session_id=parent.session_id,
            deadline=parent.deadline,
            budget=parent.budget,
        )

    async def finished(self, run: RunInfo, status: str) -> None:
        return None
