"""Orchestrated run trees across real worker and orchestrator processes (the orchestrator issue's list)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence

import pytest

from plexus.core import (
    AgentCrashError,
    AgentId,
    AgentProgress,
    BudgetExhaustedError,
    CancellationError,
    ExecutionBudget,
    KernelError,
    MiddlewareTermination,
    Priority,
    RetryPolicy,
    SpawnBudget,
    TextBlock,
)
from plexus.runtime import Runtime
from plexus.runtime.client._cluster import ServiceUnavailableError
from plexus.runtime.kernel import escape_token
from plexus.runtime.orchestration import TERMINAL, RunStatus
from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.wire._orchestration import RunRecord, budget_counter_subject
from tests.runtime.conftest import WorkerProcess

from .conftest import OrchestratorProcess

# The service is a separate distribution; these tests need it installed (the workspace does that).
pytest.importorskip("plexus.orchestrator")

APP = "tests.e2e.apps_tree:app"
FAST = ("--heartbeat-ttl", "3")


def cmd(**fields: object) -> list[TextBlock]:
    return [TextBlock(text=json.dumps(fields))]


async def until(predicate: object, timeout: float, what: str) -> None:
    """Wait for a condition that has no event to await (process state, registry contents)."""
    async with asyncio.timeout(timeout):
        while not await predicate():  # type: ignore[operator]  # noqa: ASYNC110 - cross-process state
            await asyncio.sleep(0.1)
    _ = what


async def ready(rt: Runtime, workers: int) -> None:
    async def hosts() -> bool:
        return len(await rt.workers("leaf")) >= workers

    async def orchestrator() -> bool:
        try:
            await rt.get_run("run_probe")
        except ServiceUnavailableError:
            return False
        except KernelError:
            return True  # a typed "unknown run" answer: the service is up
        return True

    async def shared() -> bool:
        # Every worker holds its fair share of the leaf partitions (so a tree really spans the workers).
        holders = await LeaseManager(rt.topology.leases, "probe", 3).holders()
        owners = [owner for key, owner in holders.items() if ".leaf." in key]
        return len(owners) == rt.partitions and len(set(owners)) >= workers

    await until(hosts, 20, "workers registered")
    await until(orchestrator, 20, "orchestrator answering")
    await until(shared, 20, "partitions shared by every worker")


@contextlib.asynccontextmanager
async def recording(rt: Runtime, run_id: str) -> AsyncIterator[list[AgentProgress]]:
    events: list[AgentProgress] = []

    async def collect() -> None:
        async for event in rt.progress(run_id):
            events.append(event)

    task = asyncio.create_task(collect())
    try:
        yield events
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def start_budgeted_tree(runtime: Runtime, key: str, agents: int, max_tokens: int) -> str:
    """A root plus `agents - 1` leaves, each spending 100 tokens per step for 40 steps."""
    return await runtime.start_run(
        AgentId("root", key),
        cmd(children=agents - 1, leaf={"steps": 40, "tokens": 100, "sleep": 0.05}),
        budget=ExecutionBudget(max_tokens=max_tokens),
        spawn_budget=SpawnBudget(max_agents=agents),
    )


async def assert_failed_on_budget(runtime: Runtime, record: RunRecord, agents: int, max_tokens: int) -> None:
    """Failed on its token budget, over it only by increments in flight: at most one per agent."""
    assert record.status == "failed"
    assert (record.reason or "").startswith("Token budget exceeded:"), record.reason
    total = await counter_total(runtime, record.run_id, "tokens")
    assert max_tokens < total <= max_tokens + agents * 100, total


def agent_events(events: list[AgentProgress]) -> list[AgentProgress]:
    """Events of the tree's agents (the orchestrator's own decision events may trail a cancel)."""
    return [e for e in events if not e.agent_id.startswith("orchestrator/")]


def pid_of(event: AgentProgress) -> int | None:
    text = "".join(getattr(b, "text", "") for b in event.content)
    return int(text.split("pid=")[1].split()[0]) if "pid=" in text else None


async def counter_total(rt: Runtime, root_id: str, dimension: str) -> int:
    subject = budget_counter_subject(rt.prefix, escape_token(rt.namespace), escape_token(root_id), dimension)
    msg = await rt.js.get_last_msg(rt.topology.names.counters_stream, subject)
    return int(json.loads(msg.data or b"{}")["val"])


async def test_token_budget_holds_across_a_20_agent_tree_on_two_workers(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    worker_process(APP, *FAST)
    worker_process(APP, *FAST)
    await ready(runtime, 2)
    run_id = await start_budgeted_tree(runtime, "budget", agents=20, max_tokens=4000)
    async with recording(runtime, run_id) as events:
        record = await runtime.wait_run(run_id, timeout=60)
        await assert_failed_on_budget(runtime, record, agents=20, max_tokens=4000)
        # Every agent stops: nothing more happens in the tree once it has failed.
        await asyncio.sleep(1.5)
        settled = len(agent_events(events))
        await asyncio.sleep(1.5)
        assert len(agent_events(events)) == settled
    started_pids = {pid_of(e) for e in events if e.step == "started" and e.agent_id.startswith("leaf/")}
    assert len(started_pids - {None}) == 2, "the tree ran on both workers"
    with pytest.raises(BudgetExhaustedError) as info:
        await runtime.run_result(run_id, timeout=5)
    assert info.value.dimension == "tokens"


async def test_spawn_denied_at_max_agents(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    worker_process(APP, *FAST)
    await ready(runtime, 1)
    run_id = await runtime.start_run(
        AgentId("root", "spawny"),
        cmd(children=5, leaf={"steps": 1, "sleep": 1.5}),
        spawn_budget=SpawnBudget(max_agents=3, allow_preempt=False),
    )
    results = json.loads(
        "".join(getattr(b, "text", "") for b in await runtime.run_result(run_id, timeout=30))
    )
    # The root holds one slot of three: two children run, three are denied while they hold theirs.
    assert sorted(r.split(":")[0] for r in results) == ["denied", "denied", "denied", "ok", "ok"]


async def test_a_run_ended_by_a_guard_is_guardrail_tripped_not_failed(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    """Seed 002 / issue 10: `MiddlewareTermination` ends the run with status `guardrail_tripped` and the
    reason (before, it was recorded as an ordinary failure)."""
    orchestrator_process()
    worker_process(APP, *FAST)
    await ready(runtime, 1)
    run_id = await runtime.start_run(AgentId("guarded", "g"), [TextBlock(text="x")])
    record = await runtime.wait_run(run_id, timeout=30)
    assert record.status == RunStatus.GUARDRAIL_TRIPPED
    assert record.reason == "guardrail: forbidden topic x"
    with pytest.raises(MiddlewareTermination) as info:
        await runtime.run_result(run_id, timeout=5)
    assert str(info.value) == "guardrail: forbidden topic x"
    assert record.status in TERMINAL


async def test_high_priority_spawn_preempts_the_lowest_priority_agent(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    worker_process(APP, *FAST)
    await ready(runtime, 1)
    # 80 steps (≥ 8 s): the LOW child must still be working when the HIGH child starts. With 20, CI on a
    # loaded R3 cluster once saw no LOW step while the HIGH child ran and none after it: the LOW child had
    # finished before the HIGH child started, 1.7 s or more after it, and had nothing left to resume; with
    # 40, twice on 2026-11-26, the HIGH child started 4.7 s after the LOW one (0.5 s when run alone).
    low = {"priority": int(Priority.LOW), "leaf": {"steps": 80, "tokens": 1, "sleep": 0.1}}
    # The HIGH child works for ~1.5 s, so a LOW child that was not really paused would show steps in it. It is
    # spawned 0.5 s after the LOW child's first step (one worker runs both): with a fixed 0.5 s after the LOW
    # child's spawn, a loaded R3 cluster once started the HIGH child before the LOW child had made any step.
    high = {"priority": int(Priority.HIGH), "after": 0, "delay": 0.5, "leaf": {"steps": 15, "sleep": 0.1}}
    run_id = await runtime.start_run(
        AgentId("root", "preempt"),
        cmd(specs=[low, high]),
        spawn_budget=SpawnBudget(max_agents=2, allow_preempt=True),
        priority=int(Priority.NORMAL),
    )
    async with recording(runtime, run_id) as events:
        results = json.loads(
            "".join(getattr(b, "text", "") for b in await runtime.run_result(run_id, timeout=60))
        )
    # The HIGH child got the LOW child's slot instead of a denial, and the LOW child finished after resuming.
    assert [r.split(":")[0] for r in results] == ["ok", "ok"], results
    low_steps = [e for e in events if e.agent_id.endswith("-s0") and e.step == "thinking"]
    assert len(low_steps) == 80
    low_run = str(low_steps[0].run_id)
    high_done = max(e.ts for e in events if e.agent_id.endswith("-s1") and e.step == "thinking")
    high_start = min(e.ts for e in events if e.agent_id.endswith("-s1") and e.step == "started")
    assert high_done - high_start > 1.2
    paused_window = [e for e in low_steps if high_start + 0.3 < e.ts < high_done - 0.2]
    assert paused_window == [], "the preempted agent kept working while paused"
    assert any(e.ts < high_start for e in low_steps), "the LOW child was working before it was preempted"
    timeline = f"HIGH {high_start:.2f}-{high_done:.2f}, LOW steps at {[round(e.ts, 2) for e in low_steps]}"
    assert any(e.ts > high_done for e in low_steps), f"the LOW child resumed after the HIGH child: {timeline}"
    # The orchestrator suspended the LOW child's run for the HIGH child, and resumed it afterwards.
    decisions = [
        (e.metadata.get("decision"), e.metadata.get("status"))
        for e in events
        if e.agent_id == f"orchestrator/{low_run}"
    ]
    assert ("preempted", "suspended") in decisions, decisions
    assert ("resumed", "running") in decisions, decisions
    assert decisions.index(("preempted", "suspended")) < decisions.index(("resumed", "running"))
    assert (await runtime.get_run(low_run)).status == "completed"


async def test_worker_killed_mid_run_is_retried_from_its_checkpoint(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    workers = [worker_process(APP, *FAST), worker_process(APP, *FAST)]
    await ready(runtime, 2)
    run_id = await runtime.start_run(
        AgentId("root", "crash"),
        cmd(children=1, leaf={"steps": 8, "sleep": 0.4, "checkpoint": True}),
        retry=RetryPolicy(max_retries=3, initial_backoff_s=0.2),
    )
    async with recording(runtime, run_id) as events:

        async def leaf_step_3() -> bool:
            return any(e.agent_id.startswith("leaf/") and "step 3 " in _text(e) for e in events)

        await until(leaf_step_3, 30, "leaf at step 3")
        victim_pid = next(
            pid_of(e) for e in events if e.agent_id.startswith("leaf/") and "step 3 " in _text(e)
        )
        os.kill(victim_pid or 0, signal.SIGKILL)
        results = json.loads(_blocks_text(await runtime.run_result(run_id, timeout=60)))
    assert len(results) == 1
    assert results[0].startswith("ok:"), results
    resumed_from = int(results[0].rsplit("from ", 1)[1])
    assert resumed_from >= 3, "the retry resumed from the checkpoint, not from scratch"
    survivor = next(w.pid for w in workers if w.pid != victim_pid)
    assert any(
        pid_of(e) == survivor for e in events if e.agent_id.startswith("leaf/") and e.step == "started"
    )
    # The retry was the orchestrator's: it recorded the crash and the second attempt of the leaf's run.
    leaf_run = next(str(e.run_id) for e in events if e.agent_id.startswith("leaf/"))
    leaf = await runtime.get_run(leaf_run)
    assert leaf.status == "completed"
    assert leaf.attempts >= 2, leaf.attempts
    assert any(
        e.agent_id == f"orchestrator/{leaf_run}" and e.metadata.get("decision") == "retry_scheduled"
        for e in events
    )


async def test_retries_exhausted_dead_letters_and_the_caller_gets_agent_crash_error(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    doomed = [worker_process(APP, *FAST, env={"DOOMED_KILL": "1"}) for _ in range(2)]
    await ready(runtime, 2)
    run_id = await runtime.start_run(
        AgentId("doomed", "d"), [], retry=RetryPolicy(max_retries=1, initial_backoff_s=0.1)
    )

    async def both_dead() -> bool:
        return all(p.poll() is not None for p in doomed)

    await until(both_dead, 40, "both doomed workers killed themselves")
    worker_process(APP, *FAST)  # a healthy worker sees attempt 3 > max_retries + 1
    with pytest.raises(AgentCrashError) as info:
        await runtime.run_result(run_id, timeout=40)
    assert info.value.run_id == run_id
    assert info.value.agent_id == "doomed/d"
    dlq = await runtime.js.get_last_msg(runtime.topology.names.dlq_stream, runtime.subjects.dlq("doomed"))
    assert dlq.headers is not None
    assert dlq.headers["Plexus-Dlq-Reason"] == "retries_exhausted"
    assert dlq.headers["Plexus-Dlq-Run"] == run_id


async def test_cancel_cascades_to_every_agent_on_every_worker(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    worker_process(APP, *FAST)
    worker_process(APP, *FAST)
    await ready(runtime, 2)
    run_id = await runtime.start_run(
        AgentId("root", "cancel"), cmd(children=12, leaf={"steps": 600, "sleep": 0.1})
    )
    async with recording(runtime, run_id) as events:

        async def all_started() -> bool:
            return len({e.agent_id for e in events if e.step == "started"}) >= 12

        await until(all_started, 30, "twelve leaves running")
        await runtime.cancel_run(run_id, "user pressed stop")
        with pytest.raises(CancellationError):
            await runtime.run_result(run_id, timeout=10)
        await asyncio.sleep(1.0)  # within 1 s of the cancel, no agent of the tree is still working
        settled = len(agent_events(events))
        await asyncio.sleep(1.0)
        assert len(agent_events(events)) == settled
    pids = {pid_of(e) for e in events if e.step == "started" and e.agent_id.startswith("leaf/")}
    assert len(pids - {None}) == 2


async def test_deadline_holds_for_agents_that_never_check(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    orchestrator_process()
    worker_process(APP, *FAST)
    await ready(runtime, 1)
    run_id = await runtime.start_run(
        AgentId("sleeper", "late"), cmd(sleep=120), budget=ExecutionBudget(deadline_s=2)
    )
    async with recording(runtime, run_id) as events:

        async def started() -> bool:
            return any(e.agent_id == "sleeper/late" and e.step == "started" for e in events)

        await until(started, 15, "sleeper started")
        # Freeze the worker: no agent or worker code can notice the deadline, only the orchestrator.
        # (SIGKILL at teardown ends a stopped process too.)
        pid = next(pid_of(e) for e in events if e.agent_id == "sleeper/late" and e.step == "started")
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        record = await runtime.wait_run(run_id, timeout=15)
    assert record.status == "failed", record
    assert "deadline" in (record.reason or ""), record.reason


async def test_killing_one_of_two_orchestrators_keeps_the_budget(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    replicas: list[subprocess.Popen[bytes]] = [orchestrator_process(), orchestrator_process()]
    worker_process(APP, *FAST)
    worker_process(APP, *FAST)
    await ready(runtime, 2)
    run_id = await start_budgeted_tree(runtime, "ha", agents=10, max_tokens=2000)
    await asyncio.sleep(0.5)
    os.kill(replicas[0].pid, signal.SIGKILL)
    record = await runtime.wait_run(run_id, timeout=60)
    await assert_failed_on_budget(runtime, record, agents=10, max_tokens=2000)
    # The survivor also serves new runs from start to finish (start, spawn, reports, completion).
    second = await runtime.start_run(AgentId("root", "ha-after"), cmd(children=1, leaf={"steps": 2}))
    results = json.loads(_blocks_text(await runtime.run_result(second, timeout=30)))
    assert [r.split(":")[0] for r in results] == ["ok"], results
    assert (await runtime.get_run(second)).status == "completed"


def _text(event: AgentProgress) -> str:
    return "".join(getattr(b, "text", "") for b in event.content) + " "


def _blocks_text(blocks: Sequence[object]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)
