"""Runs through the orchestrator service: start, finish, crash retries, budgets, deadlines, cancellation."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest

from plexus.core import (
    AgentCrashError,
    AgentId,
    BudgetExhaustedError,
    CancellationError,
    ExecutionBudget,
    KernelError,
    Priority,
    ReplyTimeoutError,
    RetryPolicy,
    TextBlock,
)
from plexus.orchestrator import ORCHESTRATOR_TYPE, Orchestrator, RunDecision, SweeperConfig
from plexus.runtime import Runtime
from plexus.runtime.store._eventlog import EventLog
from plexus.runtime.wire._envelope import blocks_from_payload, decode_envelope, payload_from_blocks
from plexus.runtime.wire._orchestration import (
    CrashReport,
    FinishedReport,
    RunRecord,
    RunStatus,
    SpawnReply,
    SpawnRequest,
    TreeRecord,
    budget_counter_subject,
    tree_key,
)
from plexus.runtime.wire._subjects import Subjects, escape_token, inbox_partition

from .conftest import Broadcasts, StartReplica, call, decisions, wait_status

ECHO = AgentId("echo", "k1")


async def orch_log(rt: Runtime, root_id: str) -> list[object]:
    log = EventLog(rt.js, Subjects().evlog(ORCHESTRATOR_TYPE, root_id))
    return [record.entry for record in await log.read()]


async def incr(rt: Runtime, root_id: str, dimension: str, delta: int, namespace: str = "default") -> int:
    subject = budget_counter_subject("px", namespace, escape_token(root_id), dimension)
    reply = await rt.nc.request(subject, b"", headers={"Nats-Incr": str(delta)}, timeout=5)
    return int(json.loads(reply.data)["val"])


# -- start ------------------------------------------------------------------------------------------------
async def test_start_persists_the_run_and_publishes_the_root_envelope(
    orch: Orchestrator, rt: Runtime
) -> None:
    statuses: list[str] = []
    watcher = await rt.topology.runs.watch("run.>")

    budget = ExecutionBudget(max_tokens=4000, deadline_s=60)
    retry = RetryPolicy(max_retries=2)
    run_id = await rt.start_run(
        ECHO, [TextBlock(text="hi")], budget=budget, retry=retry, priority=Priority.HIGH, session_id="s1"
    )
    record = await rt.get_run(run_id)
    assert record.status == RunStatus.RUNNING
    assert (record.run_id, record.root_id, record.parent_id, record.depth) == (run_id, run_id, None, 0)
    assert record.agent_id == "echo/k1"
    assert record.session_id == "s1"
    assert record.priority == 4
    assert record.attempts == 1
    assert record.deadline == pytest.approx(record.created_at + 60)
    assert record.budget == budget.model_dump(mode="json")
    assert record.retry == retry.model_dump(mode="json")

    # Both transitions went through the store: PENDING first, then RUNNING.
    async with asyncio.timeout(5):
        while len(statuses) < 2:
            entry = await watcher.updates(timeout=5)  # type: ignore[no-untyped-call]
            if entry is not None and entry.value:
                statuses.append(msgspec.json.decode(entry.value, type=RunRecord).status)
    await watcher.stop()  # type: ignore[no-untyped-call]
    assert statuses == ["pending", "running"]

    subject = Subjects().inbox_partitioned("echo", inbox_partition("k1", 16), "k1")
    msg = await rt.js.get_last_msg("PLEXUS_INBOX", subject)
    env = decode_envelope(msg.data or b"", msg.headers)
    assert env.sender is None
    assert env.kind == "send"
    assert env.target == "echo/k1"
    assert blocks_from_payload(env.payload) == [TextBlock(text="hi")]
    assert env.run is not None
    assert env.run.run_id == env.run.root_id == run_id
    assert env.run.depth == 0
    assert env.run.parent_id is None
    assert env.run.orchestrated is True
    assert env.run.priority == 4
    assert env.run.session_id == "s1"
    assert env.run.budget == record.budget
    assert env.run.retry == record.retry
    assert env.run.deadline == record.deadline

    entries = await orch_log(rt, run_id)
    assert [type(e).__name__ for e in entries] == ["RunStarted"]
    assert await decisions(rt, run_id) == ["started"]


async def test_a_repeated_start_with_the_same_id_is_the_same_run(orch: Orchestrator, rt: Runtime) -> None:
    first = await rt.start_run(ECHO, [TextBlock(text="once")], run_id="run-fixed-1")
    again = await rt.start_run(ECHO, [TextBlock(text="once")], run_id="run-fixed-1")
    assert first == again == "run-fixed-1"
    info = await rt.js.stream_info("PLEXUS_INBOX")
    assert info.state.messages == 1  # one envelope: the second start neither re-created nor re-sent
    with pytest.raises(KernelError) as err:
        await rt.start_run(AgentId("other", "k"), [TextBlock(text="x")], run_id="run-fixed-1")
    assert err.value.error_type == "RunStateError"


async def test_finished_completes_the_run_with_its_output(orch: Orchestrator, rt: Runtime) -> None:
    run_id = await rt.start_run(ECHO, [TextBlock(text="hi")])
    output = payload_from_blocks([TextBlock(text="done")])
    record = await call(
        rt, "finished", FinishedReport(run_id=run_id, status="completed", output=output), RunRecord
    )
    assert record.status == RunStatus.COMPLETED
    assert record.output is not None
    assert blocks_from_payload(record.output) == [TextBlock(text="done")]
    stored = await rt.wait_run(run_id, timeout=5)
    assert stored.status == RunStatus.COMPLETED
    assert stored.error is None
    # A late or repeated report changes nothing.
    again = await call(rt, "finished", FinishedReport(run_id=run_id, status="failed"), RunRecord)
    assert again.status == RunStatus.COMPLETED
    assert [type(e).__name__ for e in await orch_log(rt, run_id)] == ["RunStarted", "RunCompleted"]
    assert await decisions(rt, run_id) == ["started", "completed"]
    tree = await rt.topology.runs.get(tree_key(escape_token(run_id)))
    assert json.loads(tree.value or b"{}").get("active", {}) == {}


async def test_a_failed_root_fails_with_the_reported_error(orch: Orchestrator, rt: Runtime) -> None:
    run_id = await rt.start_run(ECHO, [TextBlock(text="hi")])
    error = KernelError("boom").to_wire()
    record = await call(
        rt, "finished", FinishedReport(run_id=run_id, status="failed", error=error), RunRecord
    )
    assert record.status == RunStatus.FAILED
    assert record.error == error
    assert record.reason == "boom"


# -- budgets ----------------------------------------------------------------------------------------------
async def test_crossing_the_token_budget_fails_the_tree_and_broadcasts_the_error(
    orch: Orchestrator, rt: Runtime, broadcasts: Broadcasts
) -> None:
    run_id = await rt.start_run(ECHO, [TextBlock(text="hi")], budget=ExecutionBudget(max_tokens=4000))
    assert await incr(rt, run_id, "tokens", 3000) == 3000
    assert await incr(rt, run_id, "turns", 5) == 5
    assert (await rt.get_run(run_id)).status == RunStatus.RUNNING
    assert await incr(rt, run_id, "tokens", 1200) == 4200

    notice = await broadcasts.next_cancel()
    expected = BudgetExhaustedError("tokens", 4200, 4000)
    assert notice["root_id"] == run_id
    assert notice["run_id"] == run_id
    assert notice["error"] == expected.to_wire()
    assert KernelError.from_wire(notice["error"]) == expected
    record = await wait_status(rt, run_id, "failed")
    assert record.reason == "Token budget exceeded: 4200 > 4000"
    assert record.error == expected.to_wire()
    assert record.usage.tokens == 4200
    assert record.usage.turns == 5

    # From now on every agent of the tree gets the same error, e.g. when it tries to spawn.
    with pytest.raises(BudgetExhaustedError) as err:
        await call(
            rt,
            "spawn",
            SpawnRequest(parent_run_id=run_id, root_id=run_id, parent_agent="echo/k1", child_agent="w/1"),
            SpawnReply,
        )
    assert err.value == expected
    entries = await orch_log(rt, run_id)
    failed = [e for e in entries if type(e).__name__ == "RunFailed"]
    assert len(failed) == 1
    assert "budget_exceeded" in await decisions(rt, run_id)


async def test_a_root_that_completes_over_its_budget_fails_on_it(replicas: StartReplica, rt: Runtime) -> None:
    """The root's own report decides when it comes before the budget watcher's window ends (the root caught
    its children's BudgetExhaustedError and returned): the tree fails on its budget either way."""
    await replicas(budget_check_delay_s=60.0)  # the watcher stays out of it
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=100))
    assert await incr(rt, run_id, "tokens", 150) == 150
    record = await call(rt, "finished", FinishedReport(run_id=run_id, status="completed"), RunRecord)
    assert record.status == RunStatus.FAILED
    assert record.reason == "Token budget exceeded: 150 > 100"
    assert record.error == BudgetExhaustedError("tokens", 150, 100).to_wire()
    assert "budget_exceeded" in await decisions(rt, run_id)

    within = await rt.start_run(
        AgentId("echo", "k2"), [TextBlock(text="y")], budget=ExecutionBudget(max_tokens=100)
    )
    assert await incr(rt, within, "tokens", 100) == 100  # at the limit, not over it
    record = await call(rt, "finished", FinishedReport(run_id=within, status="completed"), RunRecord)
    assert record.status == RunStatus.COMPLETED


async def test_a_run_whose_agent_ran_out_of_budget_ends_with_that_decision(
    replicas: StartReplica, rt: Runtime
) -> None:
    """A handler's `BudgetExhaustedError` (its own consume or a callee's) is the budget's decision in the
    run's log line and progress, as when the budget watcher ends the tree, not a plain ``failed``."""
    await replicas(budget_check_delay_s=60.0)
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=100))
    error = BudgetExhaustedError("tokens", 120, 100).to_wire()
    report = FinishedReport(run_id=run_id, status="failed", error=error)
    record = await call(rt, "finished", report, RunRecord)
    assert record.status == RunStatus.FAILED
    assert record.error == error
    assert "budget_exceeded" in await decisions(rt, run_id)
    other = await rt.start_run(AgentId("echo", "k3"), [TextBlock(text="y")])
    report = FinishedReport(run_id=other, status="failed", error=KernelError("boom").to_wire())
    await call(rt, "finished", report, RunRecord)
    assert "failed" in await decisions(rt, other)


async def test_finishing_a_budgeted_root_reads_its_tree_and_totals_once(
    replicas: StartReplica, rt: Runtime
) -> None:
    """The completion report checks the budget and records the final totals from one reading of the tree and
    its counters (not once to check and again to end), and answers with the record it wrote (no read-back)."""
    # The watcher and the sweeper stay out of it: every read counted below is the report's.
    await replicas(budget_check_delay_s=60.0, sweeper=SweeperConfig(tick_s=60.0, budget_recheck_s=60.0))
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=1000))
    assert await incr(rt, run_id, "tokens", 150) == 150
    assert await incr(rt, run_id, "turns", 2) == 2
    run_subject = f"$KV.plexus_runs.run.{escape_token(run_id)}".encode()
    tree_subject = f"$KV.plexus_runs.{tree_key(escape_token(run_id))}".encode()
    counters = budget_counter_subject("px", "default", escape_token(run_id), "").encode()
    reads: list[str] = []

    async def on_api(msg: object) -> None:
        data = getattr(msg, "data", b"")
        subject = getattr(msg, "subject", "")
        if ".MSG.GET." not in subject and ".DIRECT.GET." not in subject:
            return
        if run_subject in data or subject.endswith(run_subject.decode()):
            reads.append("run")
        elif tree_subject in data or subject.endswith(tree_subject.decode()):
            reads.append("tree")
        elif counters in data:
            reads.append("counter")

    spy = await rt.nc.subscribe("$JS.API.>", cb=on_api)
    try:
        record = await call(rt, "finished", FinishedReport(run_id=run_id, status="completed"), RunRecord)
        await rt.nc.flush()
    finally:
        await spy.unsubscribe()
    assert record.status == RunStatus.COMPLETED
    assert (record.usage.tokens, record.usage.turns) == (150, 2)  # the totals of that one reading
    assert (await rt.get_run(run_id)).usage == record.usage
    # The report's read of the run; the tree with every counter at once; the tree again after the root's
    # write (close_tree must see children admitted meanwhile), whose revision then clears the slots.
    assert reads.count("run") == 1, reads
    assert reads.count("tree") == 2, reads
    assert reads.count("counter") == 3, reads  # tokens, cost, turns: once each
    tree = await rt.topology.runs.get(tree_key(escape_token(run_id)))
    assert tree.value is not None
    assert msgspec.json.decode(tree.value, type=TreeRecord).active == {}  # its slot is freed


async def test_a_counter_moving_after_its_tree_ended_costs_no_read_unless_it_passed_the_record(
    replicas: StartReplica, rt: Runtime
) -> None:
    """The budget watcher's check comes `budget_check_delay_s` after a move; a short run has ended by then,
    and the index knows it and its recorded usage: no read of the root to find that out (one per run
    before). Usage reported after the end does move the counters past the record, which then catches up."""
    orch = await replicas(
        budget_check_delay_s=0.05, sweeper=SweeperConfig(tick_s=60.0, budget_recheck_s=60.0)
    )
    assert orch.index is not None
    assert orch.watcher is not None
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=1000))
    record = await call(rt, "finished", FinishedReport(run_id=run_id, status="completed"), RunRecord)
    assert record.status == RunStatus.COMPLETED
    checked: list[str] = []
    check, done = orch.watcher.check, asyncio.Event()

    async def counted(root_id: str) -> object:
        checked.append(root_id)
        try:
            return await check(root_id)
        finally:
            done.set()

    orch.watcher.check = counted
    run_subject = f"$KV.plexus_runs.run.{escape_token(run_id)}".encode()
    reads: list[bytes] = []

    async def on_api(msg: object) -> None:
        if ".GET." in getattr(msg, "subject", "") and run_subject in getattr(msg, "data", b""):
            reads.append(getattr(msg, "data", b""))

    spy = await rt.nc.subscribe("$JS.API.>", cb=on_api)
    try:
        for _ in range(500):  # until the index has seen the run end
            if run_id in orch.index.ended:
                break
            await asyncio.sleep(0.01)
        assert run_id in orch.index.ended
        orch.watcher.poke(run_id)  # a delayed check of moves the ending counted already
        await asyncio.wait_for(done.wait(), 5)  # the watcher's check ran, and is over
        await rt.nc.flush()
    finally:
        await spy.unsubscribe()
    assert checked == [run_id]
    assert reads == []
    assert await incr(rt, run_id, "tokens", 5000) == 5000  # over the budget, but the tree has ended
    async with asyncio.timeout(10):  # the record catches up with usage reported after the end
        while (await rt.get_run(run_id)).usage.tokens != 5000:  # noqa: ASYNC110 - a record, no event
            await asyncio.sleep(0.05)
    assert (await rt.get_run(run_id)).status == RunStatus.COMPLETED  # an ended tree stays as it ended


async def test_cost_and_turn_budgets_are_enforced_too(orch: Orchestrator, rt: Runtime) -> None:
    cost_run = await rt.start_run(ECHO, [TextBlock(text="a")], budget=ExecutionBudget(max_cost_usd=0.5))
    await incr(rt, cost_run, "cost_micros", 600_000)
    record = await wait_status(rt, cost_run, "failed")
    assert record.reason == "Cost budget exceeded: 0.6 > 0.5"

    turn_run = await rt.start_run(ECHO, [TextBlock(text="b")], budget=ExecutionBudget(max_turns=3))
    await incr(rt, turn_run, "turns", 4)
    record = await wait_status(rt, turn_run, "failed")
    assert record.reason == "Turn budget exceeded: 4 > 3"


async def test_a_finished_child_s_spend_in_another_namespace_still_counts(
    orch: Orchestrator, rt: Runtime
) -> None:
    """Agents report to their own namespace's counters; a child that ran in another namespace and ended keeps
    counting toward the tree's budget (its slot is gone, its spend is not)."""
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=100))
    child = await call(
        rt,
        "spawn",
        SpawnRequest(parent_run_id=run_id, root_id=run_id, parent_agent="echo/k1", child_agent="other/w/1"),
        SpawnReply,
    )
    assert await incr(rt, run_id, "tokens", 60, namespace="other") == 60
    await call(rt, "finished", FinishedReport(run_id=child.run_id, status="completed"), RunRecord)
    assert await incr(rt, run_id, "tokens", 50) == 50  # the root's own: 110 in all
    record = await wait_status(rt, run_id, "failed")
    assert record.reason == "Token budget exceeded: 110 > 100"
    assert record.usage.tokens == 110


async def test_the_budget_backstop_catches_a_crossing_nobody_delivered(
    replicas: StartReplica, rt: Runtime
) -> None:
    # The counter moves while no replica runs, so no increment is delivered to any: the periodic recheck
    # of the replica started afterwards must find the crossing.
    run_id = "run-backstop"
    first = await replicas()
    await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=10), run_id=run_id)
    await first.stop()
    await incr(rt, run_id, "tokens", 11)
    await replicas()
    record = await wait_status(rt, run_id, "failed")
    assert record.reason == "Token budget exceeded: 11 > 10"


async def test_waiting_for_a_run_creates_no_consumer_and_sees_its_end(
    orch: Orchestrator, rt: Runtime
) -> None:
    """`wait_run` follows the run's KV subject with a core subscription (no consumer per waiter) and reads the
    record once: a run that already ended is answered at once."""
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=10))
    stream = f"KV_{rt.topology.names.runs_bucket}"
    consumers = (await rt.js.stream_info(stream)).state.consumer_count
    waiters = [asyncio.create_task(rt.wait_run(run_id, timeout=10)) for _ in range(5)]
    await asyncio.sleep(0.3)
    assert not any(w.done() for w in waiters)
    assert (await rt.js.stream_info(stream)).state.consumer_count == consumers
    await incr(rt, run_id, "tokens", 11)
    for record in await asyncio.gather(*waiters):
        assert record.status == RunStatus.FAILED
        assert record.reason == "Token budget exceeded: 11 > 10"
    # The waiters saw the write on its way into the stream; once it is stored, a new waiter reads it at once
    # (in CI under load a read right after the waiters once still found the previous record).
    await wait_status(rt, run_id, "failed")
    async with asyncio.timeout(1):
        assert (await rt.wait_run(run_id, timeout=10)).status == RunStatus.FAILED
    with pytest.raises(ReplyTimeoutError):
        await rt.wait_run(run_id, timeout=0.3, until={RunStatus.SUSPENDED})


# -- deadlines and cancellation ---------------------------------------------------------------------------
async def test_a_deadline_holds_without_any_agent(
    orch: Orchestrator, rt: Runtime, broadcasts: Broadcasts
) -> None:
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], budget=ExecutionBudget(deadline_s=0.3))
    notice = await broadcasts.next_cancel()
    assert notice["root_id"] == run_id
    assert notice["reason"] == "deadline"
    assert notice["error"] == CancellationError("deadline").to_wire()
    record = await wait_status(rt, run_id, "failed")
    assert record.error == CancellationError("deadline").to_wire()
    assert record.reason == "deadline"
    assert "deadline" in await decisions(rt, run_id)


async def test_cancel_reaches_the_whole_tree_within_a_second(
    orch: Orchestrator, rt: Runtime, broadcasts: Broadcasts
) -> None:
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")])
    child = await call(
        rt,
        "spawn",
        SpawnRequest(parent_run_id=run_id, root_id=run_id, parent_agent="echo/k1", child_agent="w/1"),
        SpawnReply,
    )
    started = time.monotonic()
    record = await rt.cancel_run(child.run_id, reason="user pressed stop")  # any run of the tree
    notice = await broadcasts.next_cancel(timeout=1.0)
    assert time.monotonic() - started < 1.0
    assert notice["root_id"] == run_id
    assert notice["error"] == CancellationError("user pressed stop").to_wire()
    assert record.status == RunStatus.CANCELLED
    root = await rt.get_run(run_id)
    assert root.status == RunStatus.CANCELLED
    assert root.reason == "user pressed stop"
    # Persisted for agents that start later: a repeated cancel is a no-op that reports the state.
    again = await rt.cancel_run(run_id, reason="again")
    assert again.status == RunStatus.CANCELLED
    assert again.reason == "user pressed stop"
    assert [type(e).__name__ for e in await orch_log(rt, run_id)].count("RunCancelled") == 2  # root + child


# -- crashes ----------------------------------------------------------------------------------------------
async def test_a_crashed_attempt_goes_back_to_pending_then_running(orch: Orchestrator, rt: Runtime) -> None:
    run_id = await rt.start_run(ECHO, [TextBlock(text="x")], retry=RetryPolicy(max_retries=2))
    report = CrashReport(
        run_id=run_id,
        agent_id="echo/k1",
        message_id=f"start-{run_id}",
        attempt=2,
        decision="retry",
        backoff_s=0.3,
    )
    record = await call(rt, "crashed", report, RunRecord)
    assert record.status == RunStatus.PENDING
    assert record.attempts == 2
    assert record.retry_at is not None
    record = await wait_status(rt, run_id, "running")
    assert record.attempts == 2
    assert record.retry_at is None
    exhausted = CrashReport(
        run_id=run_id, agent_id="echo/k1", message_id=f"start-{run_id}", attempt=3, decision="exhausted"
    )
    record = await call(rt, "crashed", exhausted, RunRecord)
    assert record.status == RunStatus.FAILED
    assert record.error == AgentCrashError(run_id, "echo/k1").to_wire()
    names = [type(e).__name__ for e in await orch_log(rt, run_id)]
    assert names == ["RunStarted", "RunDecision", "RunDecision", "RunFailed"]
    entries = await orch_log(rt, run_id)
    assert [e.decision for e in entries if isinstance(e, RunDecision)] == ["retry_scheduled", "retry_started"]
