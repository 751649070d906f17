"""What the sweeper finishes when a replica died half way: states written directly into the bucket stand in
for the moment of the kill (each is one a killed replica can leave behind)."""

from __future__ import annotations

import time

import pytest

from plexus.core import AgentId, SpawnBudget, TextBlock
from plexus.orchestrator import Orchestrator, RunStore
from plexus.runtime import Runtime
from plexus.runtime.wire._envelope import decode_envelope, payload_from_blocks
from plexus.runtime.wire._orchestration import (
    RunRecord,
    RunStatus,
    Slot,
    SpawnReply,
    SpawnRequest,
    TreeRecord,
)
from plexus.runtime.wire._subjects import Subjects, inbox_partition

from .conftest import Broadcasts, call, wait_deleted, wait_status, wait_tree


@pytest.fixture
def store(rt: Runtime) -> RunStore:
    return RunStore(rt.topology.runs)


async def test_a_start_that_died_before_dispatching_is_dispatched(
    orch: Orchestrator, rt: Runtime, store: RunStore
) -> None:
    run_id = "run-undispatched"
    await store.put_input(run_id, bytes(payload_from_blocks([TextBlock(text="late")])))
    now = time.time()
    await store.create_run(
        RunRecord(run_id=run_id, root_id=run_id, agent_id="echo/late", created_at=now, updated_at=now)
    )
    record = await wait_status(rt, run_id, "running")
    assert record.attempts == 1
    msg = await rt.js.get_last_msg(
        "PLEXUS_INBOX", Subjects().inbox_partitioned("echo", inbox_partition("late", 16), "late")
    )
    env = decode_envelope(msg.data or b"", msg.headers)
    assert env.id == f"start-{run_id}"
    assert env.run is not None
    assert env.run.orchestrated


async def test_a_tree_whose_closing_was_cut_short_is_closed(
    orch: Orchestrator, rt: Runtime, store: RunStore, broadcasts: Broadcasts
) -> None:
    root = await rt.start_run(AgentId("boss", "1"), [TextBlock(text="go")])
    child = await call(
        rt,
        "spawn",
        SpawnRequest(parent_run_id=root, root_id=root, parent_agent="boss/1", child_agent="w/1"),
        SpawnReply,
    )

    def fail(rec: RunRecord) -> bool:  # what end_tree writes first, and all a killed replica got to write
        rec.status = RunStatus.FAILED
        rec.reason = "boom"
        rec.updated_at = time.time()
        return True

    await store.update_run(root, fail)
    notice = await broadcasts.next_cancel()
    assert notice["root_id"] == root
    orphan = await wait_status(rt, child.run_id, "failed")
    assert orphan.reason == "boom"
    await wait_tree(rt, root, lambda tree: tree.active == {})


async def test_interrupted_spawns_are_resolved_after_the_grace(
    orch: Orchestrator, rt: Runtime, store: RunStore
) -> None:
    budget = SpawnBudget(max_agents=3)
    root = await rt.start_run(AgentId("boss", "2"), [TextBlock(text="go")], spawn_budget=budget)
    now = time.time()

    def child(run_id: str) -> RunRecord:
        return RunRecord(
            run_id=run_id,
            root_id=root,
            parent_id=root,
            depth=1,
            agent_id=f"w/{run_id}",
            status=RunStatus.PENDING,
            created_at=now,
            updated_at=now,
        )

    # Killed after writing the child, before taking its slot: the child is removed.
    await store.create_run(child("run-unadmitted"))
    # Killed after taking the slot, before answering: the spawner never heard of it, so it fails.
    await store.create_run(child("run-admitted"))

    def take(tree: TreeRecord) -> bool:
        tree.active["run-admitted"] = Slot(agent_id="w/run-admitted", priority=2)
        return True

    await store.update_tree(root, take)
    abandoned = await wait_status(rt, "run-admitted", "failed")
    assert abandoned.error is not None
    assert "interrupted" in abandoned.error["message"]
    await wait_tree(rt, root, lambda tree: set(tree.active) == {root})
    await wait_deleted(rt, "run-unadmitted")
    assert await store.get_run("run-unadmitted") is None


async def test_a_slot_held_by_an_ended_run_is_freed(orch: Orchestrator, rt: Runtime, store: RunStore) -> None:
    budget = SpawnBudget(max_agents=2)
    root = await rt.start_run(AgentId("boss", "3"), [TextBlock(text="go")], spawn_budget=budget)
    child = await call(
        rt,
        "spawn",
        SpawnRequest(parent_run_id=root, root_id=root, parent_agent="boss/3", child_agent="w/1"),
        SpawnReply,
    )

    def complete(rec: RunRecord) -> bool:  # the finished handler died before freeing the slot
        rec.status = RunStatus.COMPLETED
        rec.updated_at = time.time()
        return True

    await store.update_run(child.run_id, complete)
    await wait_tree(rt, root, lambda tree: child.run_id not in tree.active)
    again = await call(
        rt,
        "spawn",
        SpawnRequest(parent_run_id=root, root_id=root, parent_agent="boss/3", child_agent="w/2"),
        SpawnReply,
    )
    assert again.depth == 1


async def test_deleting_an_unadmitted_run_is_refused_once_it_changed(rt: Runtime, store: RunStore) -> None:
    now = time.time()
    record = RunRecord(
        run_id="run-raced",
        root_id="run-root",
        parent_id="run-root",
        depth=1,
        agent_id="w/raced",
        status=RunStatus.PENDING,
        created_at=now,
        updated_at=now,
    )
    revision = await store.create_run(record)
    assert revision is not None

    def admitted(rec: RunRecord) -> bool:  # another request admitted it after we read `revision`
        rec.status = RunStatus.RUNNING
        return True

    await store.update_run("run-raced", admitted)
    # JetStream refuses the stale delete (error 10071); the run must survive, not raise.
    assert await store.delete_run("run-raced", revision) is False
    kept = await store.get_run("run-raced")
    assert kept is not None
    assert kept[0].status == RunStatus.RUNNING
    # At the current revision the delete goes through.
    assert await store.delete_run("run-raced", kept[1]) is True
    assert await store.get_run("run-raced") is None
