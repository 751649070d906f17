"""Spawn slots: the pure admission rules, and the service enforcing them across the tree and replicas."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plexus.core import AgentId, KernelError, Priority, SpawnBudget, SpawnDenied, TextBlock
from plexus.orchestrator import Orchestrator, admit, choose_victim, release, running_count
from plexus.runtime import Runtime
from plexus.runtime.wire._orchestration import (
    FinishedReport,
    RunRecord,
    RunStatus,
    Slot,
    SpawnReply,
    SpawnRequest,
    TreeRecord,
)

from .conftest import Broadcasts, StartReplica, call, decisions, wait_status

LOW, NORMAL, HIGH, CRITICAL = (
    int(p) for p in (Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.CRITICAL)
)


def tree(max_agents: int, *slots: tuple[str, int], allow_preempt: bool = True) -> TreeRecord:
    return TreeRecord(
        root_id="root",
        max_agents=max_agents,
        allow_preempt=allow_preempt,
        active={run: Slot(agent_id=f"a/{run}", priority=prio) for run, prio in slots},
    )


# -- pure rules -------------------------------------------------------------------------------------------
def test_admission_counts_the_root_and_refuses_over_budget() -> None:
    t = tree(2, ("root", NORMAL))
    assert admit(t, "c1", "w/1", NORMAL).admitted
    denied = admit(t, "c2", "w/2", NORMAL)
    assert not denied.admitted
    assert not denied.changed
    assert list(t.active) == ["root", "c1"]
    assert t.spawned_total == 1


def test_a_repeated_admission_takes_no_second_slot() -> None:
    t = tree(2, ("root", NORMAL))
    assert admit(t, "c1", "w/1", NORMAL).changed
    again = admit(t, "c1", "w/1", NORMAL)
    assert again.admitted
    assert not again.changed
    assert running_count(t) == 2


def test_high_priority_preempts_the_lowest_strictly_below_it_newest_first() -> None:
    t = tree(4, ("root", NORMAL), ("a", LOW), ("b", LOW), ("c", NORMAL))
    result = admit(t, "h", "w/h", HIGH, protected={"root"})
    assert result.admitted
    assert result.preempted == "b"  # LOW beats NORMAL; of the two LOW ones the newest
    assert t.active["b"].paused
    assert t.active["b"].preempted_by == "h"
    assert running_count(t) == 4


@pytest.mark.parametrize(
    ("request_priority", "allow", "victims"),
    [
        (NORMAL, True, "only HIGH and CRITICAL may preempt"),
        (HIGH, False, "the budget forbids preemption"),
        (HIGH, True, "nothing strictly below"),
    ],
)
def test_preemption_is_refused(request_priority: int, allow: bool, victims: str) -> None:
    t = tree(
        2, ("root", HIGH), ("a", HIGH if victims == "nothing strictly below" else LOW), allow_preempt=allow
    )
    assert not admit(t, "x", "w/x", request_priority, protected={"root"}).admitted


def test_ancestors_of_the_requester_are_never_paused() -> None:
    t = tree(2, ("root", LOW), ("child", LOW))
    assert choose_victim(t, CRITICAL, protected={"root", "child"}) is None
    assert choose_victim(t, CRITICAL, protected={"root"}) == "child"


def test_release_resumes_paused_runs_before_new_spawns_get_the_slot() -> None:
    t = tree(2, ("root", NORMAL), ("low", LOW))
    assert admit(t, "hi", "w/hi", HIGH, protected={"root"}).preempted == "low"
    changed, resumed = release(t, ["hi"])
    assert changed
    assert resumed == ["low"]
    assert not t.active["low"].paused
    assert not admit(t, "late", "w/late", NORMAL).admitted


@settings(max_examples=200, deadline=None)
@given(
    max_agents=st.integers(1, 6),
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(0, 12), st.sampled_from([LOW, NORMAL, HIGH, CRITICAL])),
        max_size=40,
    ),
)
def test_running_slots_never_exceed_the_budget(max_agents: int, ops: list[tuple[bool, int, int]]) -> None:
    t = tree(max_agents, ("root", NORMAL))
    for spawn, n, prio in ops:
        if spawn:
            admit(t, f"r{n}", f"w/{n}", prio, protected={"root"})
        else:
            release(t, [f"r{n}"])
        assert running_count(t) <= max_agents
        # A paused run only exists while the tree is full: otherwise it would have been resumed.
        if any(s.paused for s in t.active.values()):
            assert running_count(t) == max_agents


# -- the service ------------------------------------------------------------------------------------------
def spawn_request(
    root: str, parent: str, parent_agent: str, child: str, priority: int | None = None
) -> SpawnRequest:
    return SpawnRequest(
        parent_run_id=parent, root_id=root, parent_agent=parent_agent, child_agent=child, priority=priority
    )


async def test_spawn_slots_are_shared_and_released_when_children_finish(
    orch: Orchestrator, rt: Runtime
) -> None:
    root = await rt.start_run(
        AgentId("boss", "1"), [TextBlock(text="go")], spawn_budget=SpawnBudget(max_agents=3)
    )
    first = await call(rt, "spawn", spawn_request(root, root, "boss/1", "w/1"), SpawnReply)
    assert (first.root_id, first.parent_id, first.depth, first.priority) == (root, root, 1, NORMAL)
    # A grandchild shares the same budget.
    second = await call(rt, "spawn", spawn_request(root, first.run_id, "w/1", "w/2", LOW), SpawnReply)
    assert second.depth == 2
    assert second.priority == LOW

    with pytest.raises(SpawnDenied) as denied:
        await call(rt, "spawn", spawn_request(root, root, "boss/1", "w/3"), SpawnReply)
    assert denied.value.parent_run == root
    assert denied.value.budget == SpawnBudget(max_agents=3).model_dump(mode="json")

    await call(rt, "finished", FinishedReport(run_id=second.run_id, status="completed"), RunRecord)
    third = await call(rt, "spawn", spawn_request(root, root, "boss/1", "w/3"), SpawnReply)
    assert third.depth == 1
    parent = await rt.get_run(root)
    assert parent.children == [first.run_id, third.run_id]
    assert (await rt.get_run(first.run_id)).children == [second.run_id]
    assert (await rt.get_run(third.run_id)).status == RunStatus.RUNNING


async def test_preemption_pauses_the_low_priority_child_and_resumes_it(
    orch: Orchestrator, rt: Runtime, broadcasts: Broadcasts
) -> None:
    root = await rt.start_run(
        AgentId("boss", "2"), [TextBlock(text="go")], spawn_budget=SpawnBudget(max_agents=2)
    )
    low = await call(rt, "spawn", spawn_request(root, root, "boss/2", "w/low", LOW), SpawnReply)
    with pytest.raises(SpawnDenied):
        await call(rt, "spawn", spawn_request(root, root, "boss/2", "w/normal", NORMAL), SpawnReply)

    high = await call(rt, "spawn", spawn_request(root, root, "boss/2", "w/high", HIGH), SpawnReply)
    assert high.preempted == low.run_id
    notice = await broadcasts.next_pause()
    assert notice == {"root_id": root, "run_id": low.run_id, "paused": True}
    paused = await rt.get_run(low.run_id)
    assert paused.status == RunStatus.SUSPENDED
    assert paused.reason == f"preempted by run {high.run_id}"

    await call(rt, "finished", FinishedReport(run_id=high.run_id, status="completed"), RunRecord)
    notice = await broadcasts.next_pause()
    assert notice == {"root_id": root, "run_id": low.run_id, "paused": False}
    assert (await wait_status(rt, low.run_id, "running")).reason is None
    # Every decision is visible on the tree's progress subject, in order.
    expected = ["started", "spawned", "spawn_denied", "preempted", "spawned", "completed", "resumed"]
    assert await decisions(rt, root) == expected


async def test_spawning_from_an_ended_run_is_refused(orch: Orchestrator, rt: Runtime) -> None:
    root = await rt.start_run(AgentId("boss", "3"), [TextBlock(text="go")])
    child = await call(rt, "spawn", spawn_request(root, root, "boss/3", "w/1"), SpawnReply)
    await call(rt, "finished", FinishedReport(run_id=child.run_id, status="completed"), RunRecord)
    with pytest.raises(KernelError) as err:
        await call(rt, "spawn", spawn_request(root, child.run_id, "w/1", "w/2"), SpawnReply)
    assert err.value.error_type == "RunStateError"
    assert err.value.field_values() == {
        "run_id": child.run_id,
        "status": "completed",
        "action": "spawn a child",
    }


async def test_a_retried_spawn_with_the_same_child_id_is_admitted_once(
    orch: Orchestrator, rt: Runtime
) -> None:
    root = await rt.start_run(
        AgentId("boss", "4"), [TextBlock(text="go")], spawn_budget=SpawnBudget(max_agents=2)
    )
    request = spawn_request(root, root, "boss/4", "w/1")
    request.child_run_id = "run-child-fixed"
    a = await call(rt, "spawn", request, SpawnReply)
    b = await call(rt, "spawn", request, SpawnReply)
    assert a.run_id == b.run_id == "run-child-fixed"
    assert (await rt.get_run(root)).children == ["run-child-fixed"]


async def test_concurrent_spawns_on_two_replicas_never_exceed_the_budget(
    replicas: StartReplica, rt: Runtime
) -> None:
    await replicas()
    await replicas()
    root = await rt.start_run(
        AgentId("boss", "5"), [TextBlock(text="go")], spawn_budget=SpawnBudget(max_agents=5)
    )

    async def one(i: int) -> str:
        try:
            return (await call(rt, "spawn", spawn_request(root, root, "boss/5", f"w/{i}"), SpawnReply)).run_id
        except SpawnDenied:
            return "denied"

    results = await asyncio.gather(*(one(i) for i in range(30)))
    admitted = [r for r in results if r != "denied"]
    assert len(admitted) == 4  # the root holds the fifth slot
    assert sorted((await rt.get_run(root)).children) == sorted(admitted)
    # Denied children leave no record behind.
    for run_id in admitted:
        assert (await rt.get_run(run_id)).status == RunStatus.RUNNING


async def _preempted_low(orch: Orchestrator, rt: Runtime, key: str) -> tuple[str, str]:
    """A tree (max 2) whose LOW child's slot another replica has just paused for ``run-hi``."""
    root = await rt.start_run(
        AgentId("boss", key), [TextBlock(text="go")], spawn_budget=SpawnBudget(max_agents=2)
    )
    low = await call(rt, "spawn", spawn_request(root, root, f"boss/{key}", "w/low", LOW), SpawnReply)
    assert orch.engine is not None

    def preempt(t: TreeRecord) -> bool:
        return admit(t, "run-hi", "w/hi", HIGH, protected={root}).preempted == low.run_id

    assert (await orch.engine.store.update_tree(root, preempt)).written
    return root, low.run_id


async def test_a_pause_that_lost_the_race_to_a_release_does_nothing(
    orch: Orchestrator, rt: Runtime, broadcasts: Broadcasts
) -> None:
    root, low = await _preempted_low(orch, rt, "6")
    engine = orch.engine
    assert engine is not None
    # Another replica frees the HIGH child's slot before this one gets to suspend the victim.
    await engine.release_slots(root, ["run-hi"])
    await engine._pause((await engine.store.require_run(root))[0], low, "run-hi")
    assert (await rt.get_run(low)).status == RunStatus.RUNNING
    with pytest.raises(TimeoutError):
        await broadcasts.next_pause(timeout=0.3)  # neither a pause nor a resume nobody asked for


async def test_a_release_during_the_pause_leaves_the_victim_running(
    orch: Orchestrator, rt: Runtime, broadcasts: Broadcasts, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, low = await _preempted_low(orch, rt, "7")
    engine = orch.engine
    assert engine is not None
    check = engine._preempted
    calls = 0

    async def released_right_after_the_check(root_id: str, run_id: str, by: str) -> bool:
        nonlocal calls
        calls += 1
        still = await check(root_id, run_id, by)
        if calls == 1:
            # The release lands between the check and the suspension: its resume finds the record
            # RUNNING, so it writes nothing and must announce nothing.
            await engine.release_slots(root_id, ["run-hi"])
        return still

    monkeypatch.setattr(engine, "_preempted", released_right_after_the_check)
    await engine._pause((await engine.store.require_run(root))[0], low, "run-hi")
    assert calls == 2
    assert await broadcasts.next_pause() == {"root_id": root, "run_id": low, "paused": True}
    assert await broadcasts.next_pause() == {"root_id": root, "run_id": low, "paused": False}
    record = await rt.get_run(low)
    assert (record.status, record.reason) == (RunStatus.RUNNING, None)
    tree = await engine.store.get_tree(root)
    assert tree is not None
    assert not tree[0].active[low].paused
    assert (await decisions(rt, root))[-2:] == ["preempted", "resumed"]
