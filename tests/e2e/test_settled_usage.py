"""A settled run tree's records hold what it spent: the root its tree's counters, each child its own usage,
including usage reported after the tree had ended (issue 36, item 6)."""

from __future__ import annotations

import asyncio
import json

import pytest

from plexus.core import AgentId, ExecutionBudget, SpawnBudget, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.kernel import escape_token
from plexus.runtime.orchestration import TERMINAL, run_counter_subject
from tests.runtime.conftest import WorkerProcess

from .conftest import OrchestratorProcess
from .test_orchestrated_runs import APP, FAST, counter_total, ready

pytest.importorskip("plexus.orchestrator")


async def own_total(rt: Runtime, run_id: str) -> int:
    subject = run_counter_subject(rt.prefix, escape_token(rt.namespace), escape_token(run_id), "tokens")
    try:
        msg = await rt.js.get_last_msg(rt.topology.names.counters_stream, subject)
    except Exception:
        return 0
    return int(json.loads(msg.data or b"{}")["val"])


async def quiet_total(rt: Runtime, root_id: str, timeout: float = 30.0) -> int:
    """The tree's token counter once it stopped moving (every agent has stopped)."""
    async with asyncio.timeout(timeout):
        last = await counter_total(rt, root_id, "tokens")
        while True:
            await asyncio.sleep(1.5)
            now = await counter_total(rt, root_id, "tokens")
            if now == last:
                return now
            last = now


async def test_a_settled_tree_s_records_hold_what_it_spent_after_its_end(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    worker_process(APP, *FAST)
    worker_process(APP, *FAST)
    await ready(runtime, 2)
    # Twenty children; five go on spending after their BudgetExhaustedError until the cancellation stops them.
    specs = [{"leaf": {"steps": 40, "tokens": 10, "sleep": 0.05, "stubborn": i < 5}} for i in range(20)]
    root_id = await runtime.start_run(
        AgentId("root", "settle"),
        [TextBlock(text=json.dumps({"specs": specs}))],
        budget=ExecutionBudget(max_tokens=600),
        spawn_budget=SpawnBudget(max_agents=21),
    )
    ended = await runtime.wait_run(root_id, timeout=60)
    assert ended.status == "failed"
    spent = await quiet_total(runtime, root_id)
    assert spent > 600

    async def caught_up() -> int:
        while (await runtime.get_run(root_id)).usage.tokens != spent:  # noqa: ASYNC110 - records, no event
            await asyncio.sleep(0.2)
        return spent

    # Settling arrives within a generous bound (the watchers at once, the sweeper's pass after 5 s).
    await asyncio.wait_for(caught_up(), 30)
    root = await runtime.get_run(root_id)
    children = [await runtime.get_run(child) for child in root.children]
    assert len(children) > 1  # children the tree's end came before were never spawned
    assert all(child.status in TERMINAL for child in children)
    # Each child's record holds its own usage, and together they make up the tree's (the root spent none).
    for child in children:
        assert child.usage == child.own_usage
        assert child.usage.tokens == await own_total(runtime, child.run_id), child.run_id
    assert sum(child.usage.tokens for child in children) + root.own_usage.tokens == spent
    assert root.own_usage.tokens == 0
    assert any(child.usage.tokens > 0 for child in children)
