"""`ClusterSupervisor.consume` in an orchestrated run: one round trip that increments the dimensions the
call moves and reads the budgeted ones it does not, so a consume enforces the whole budget as `check` does
(the LLM loop skips its check between a model call's consume and its tool step on the strength of it)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from plexus.core import (
    AgentId,
    BaseBlock,
    BudgetExhaustedError,
    CancellationError,
    Cost,
    ExecutionBudget,
    KernelError,
    TextBlock,
    Usage,
)
from plexus.runtime import Agent, App, Context, NatsServer, Runtime
from plexus.runtime.client._cluster import ClusterSupervisor, RunControl
from plexus.runtime.client._supervisor import new_root_run
from plexus.runtime.wire._envelope import RunInfo
from plexus.runtime.wire._orchestration import CancelNotice
from tests.security.seeds import identity_auth


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


def _orchestrated(budget: ExecutionBudget) -> RunInfo:
    return msgspec.structs.replace(new_root_run(budget=budget), orchestrated=True)


async def test_a_check_that_accepts_an_age_answers_from_this_process_s_last_verdict(runtime: Runtime) -> None:
    """`check(max_age_s=…)` skips the server while this process verified the tree's budget within that age
    (the LLM loop's check before a step that follows a model call's consume); without an age it reads the
    counters; and once this process has seen the budget spent, no age makes a check pass again."""
    run = _orchestrated(ExecutionBudget(max_tokens=100))
    here = ClusterSupervisor(runtime.connection, RunControl(runtime.connection))
    elsewhere = ClusterSupervisor(runtime.connection, RunControl(runtime.connection))  # another process
    agent = AgentId("spender", "k")
    await here.consume(run, agent, Usage(output_tokens=10), 1)  # within limits: verified now
    with pytest.raises(BudgetExhaustedError):
        await elsewhere.consume(run, agent, Usage(output_tokens=500), 1)
    await here.check(run, max_age_s=60.0)  # the verdict of moments ago, accepted at that age
    with pytest.raises(BudgetExhaustedError):
        await here.check(run, max_age_s=0.0001)  # older than that: read again
    with pytest.raises(BudgetExhaustedError):
        await here.check(run, max_age_s=60.0)  # seen spent: never answered from memory again
    await elsewhere.check(_orchestrated(ExecutionBudget(max_tokens=100)), max_age_s=60.0)  # another tree


async def test_a_check_that_accepts_an_age_still_sees_a_cancelled_tree_at_once(runtime: Runtime) -> None:
    run = _orchestrated(ExecutionBudget(max_tokens=100))
    control = RunControl(runtime.connection)
    here = ClusterSupervisor(runtime.connection, control)
    await here.check(run)
    await here.check(run, max_age_s=60.0)
    control.on_cancel(CancelNotice(root_id=run.root_id, run_id=run.run_id, reason="user"))
    with pytest.raises(CancellationError):
        await here.check(run, max_age_s=60.0)


async def test_a_consume_in_a_tree_that_ended_raises_its_end_and_still_counts_the_usage(
    runtime: Runtime,
) -> None:
    """An end this process knows is raised at once (before any budget verdict, waiting for no ack), and the
    usage reported with it was spent, so it is still counted."""
    run = _orchestrated(ExecutionBudget(max_tokens=100))
    control = RunControl(runtime.connection)
    here = ClusterSupervisor(runtime.connection, control)
    agent = AgentId("spender", "k")
    await here.consume(run, agent, Usage(output_tokens=10), 1)
    control.on_cancel(CancelNotice(root_id=run.root_id, run_id=run.run_id, reason="user"))
    with pytest.raises(CancellationError):  # over the budget too (510 > 100): the end comes first
        await here.consume(run, agent, Usage(output_tokens=500), 1)
    elsewhere = ClusterSupervisor(runtime.connection, RunControl(runtime.connection))  # knows of no end
    deadline = time.monotonic() + 5
    spent: BudgetExhaustedError | None = None
    while spent is None:  # the increments were sent, not waited for: counted once the server stored them
        assert time.monotonic() < deadline, "the usage sent with a known end was never counted"
        try:
            await elsewhere.check(run)
        except BudgetExhaustedError as exc:
            spent = exc
        await asyncio.sleep(0.01)
    assert spent.dimension == "tokens"
    assert spent.used == 510


async def test_a_known_end_is_raised_even_when_the_usage_cannot_be_sent(
    runtime: Runtime, nats_server: NatsServer
) -> None:
    run = _orchestrated(ExecutionBudget(max_tokens=100))
    closing = await Runtime.connect(nats_server.url, auth=identity_auth(nats_server, "operator"))
    control = RunControl(closing.connection)
    here = ClusterSupervisor(closing.connection, control)
    await here.consume(run, AgentId("spender", "k"), Usage(output_tokens=10), 1)
    control.on_cancel(CancelNotice(root_id=run.root_id, run_id=run.run_id, reason="user"))
    await closing.close()  # its connection gone: a publish would raise ConnectionClosedError
    with pytest.raises(CancellationError):
        await here.consume(run, AgentId("spender", "k"), Usage(output_tokens=5), 1)


async def test_context_check_refuses_a_negative_age(runtime: Runtime, start_worker: Any) -> None:
    class Checker(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            await ctx.check(max_age=-1)
            return blocks

    app = App()
    app.register("checker", lambda _id: Checker(), durable=False)
    await start_worker(app)
    with pytest.raises(KernelError, match="max_age must be >= 0"):
        await runtime.send_message([TextBlock(text="x")], AgentId("checker", "c"), timeout=10)
