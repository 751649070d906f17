"""`ClusterSupervisor.consume` in an orchestrated run: one round trip that increments the dimensions the
call moves and reads the budgeted ones it does not, so a consume enforces the whole budget as `check` does
(the LLM loop skips its check between a model call's consume and its tool step on the strength of it)."""

from __future__ import annotations

import msgspec
import pytest

from plexus.core import AgentId, BudgetExhaustedError, Cost, ExecutionBudget, Usage
from plexus.runtime import Runtime
from plexus.runtime.client._cluster import ClusterSupervisor, RunControl
from plexus.runtime.client._supervisor import new_root_run


async def test_a_consume_moving_tokens_only_still_enforces_a_spent_cost_budget(runtime: Runtime) -> None:
    run = msgspec.structs.replace(
        new_root_run(budget=ExecutionBudget(max_tokens=1_000_000, max_cost_usd=0.01)), orchestrated=True
    )
    supervisor = ClusterSupervisor(runtime.connection, RunControl(runtime.connection))
    agent = AgentId("spender", "k")
    with pytest.raises(BudgetExhaustedError) as spent:  # another agent of the tree spends the cost budget
        await supervisor.consume(run, agent, Usage(output_tokens=1, cost=Cost(amount=0.02)), 1)
    assert spent.value.dimension == "cost"
    with pytest.raises(BudgetExhaustedError) as refused:  # this call moves tokens (and turns) only
        await supervisor.consume(run, agent, Usage(output_tokens=5), 0)
    assert refused.value.dimension == "cost"
    with pytest.raises(BudgetExhaustedError):
        await supervisor.check(run)
