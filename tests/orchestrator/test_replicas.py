"""High availability: two `plexus orchestrator` processes; kill -9 one under load, the other keeps every
limit (deadlines, spawn slots, budgets) enforced, because neither holds state the other needs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plexus.core import AgentId, ExecutionBudget, KernelError, SpawnBudget, SpawnDenied, TextBlock
from plexus.runtime import NatsServer, Runtime
from plexus.runtime.client._cluster import ServiceUnavailableError
from plexus.runtime.wire._orchestration import (
    ORCH_SERVICE_NAME,
    TERMINAL,
    FinishedReport,
    RunRecord,
    SpawnReply,
    SpawnRequest,
    budget_counter_subject,
)
from plexus.runtime.wire._subjects import escape_token

from .conftest import all_runs, call, until_serving, wait_status

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def replica_processes(nats_server: NatsServer, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    for i in range(2):
        log = (tmp_path / f"orchestrator{i}.log").open("wb")
        cmd = [
            sys.executable,
            "-m",
            "plexus.runtime.cli",
            "orchestrator",
            "--nats",
            nats_server.url,
            "--tick",
            "0.05",
        ]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


async def instances(rt: Runtime, timeout: float = 0.5) -> set[str]:
    """Ids of the replicas answering ``$SRV.PING`` now."""
    inbox = rt.nc.new_inbox()
    sub = await rt.nc.subscribe(inbox)
    await rt.nc.publish(f"$SRV.PING.{ORCH_SERVICE_NAME}", b"", reply=inbox)
    ids: set[str] = set()
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=timeout)
            except Exception:
                return ids
            if msg.data:  # an empty message is the server's "no responders" status
                ids.add(json.loads(msg.data)["id"])
    finally:
        await sub.unsubscribe()


async def retrying(coro_factory: object, attempts: int = 20) -> object:
    """A client retries a request that the killed replica took with it (no reply = try again)."""
    for _ in range(attempts):
        try:
            return await coro_factory()  # type: ignore[operator]
        except ServiceUnavailableError:
            continue
    raise AssertionError("no replica answered")


async def test_killing_a_replica_under_load_keeps_every_limit(
    replica_processes: list[subprocess.Popen[bytes]], rt: Runtime
) -> None:
    async with asyncio.timeout(30):
        while len(await instances(rt)) < 2:
            pass
    await until_serving(rt.nc)
    boss = AgentId("boss", "ha")
    deadline_run = await rt.start_run(boss, [TextBlock(text="x")], budget=ExecutionBudget(deadline_s=3))
    budget_run = await rt.start_run(
        AgentId("boss", "ha2"), [TextBlock(text="x")], budget=ExecutionBudget(max_tokens=100)
    )
    slots_run = await rt.start_run(
        AgentId("boss", "ha3"), [TextBlock(text="x")], spawn_budget=SpawnBudget(max_agents=6)
    )

    # Load: spawn and finish children continuously on a tree with a generous budget while we kill.
    churn_root = await rt.start_run(
        AgentId("boss", "churn"), [TextBlock(text="x")], spawn_budget=SpawnBudget(max_agents=4)
    )
    stop = asyncio.Event()
    done = 0

    async def churn() -> None:
        nonlocal done
        while not stop.is_set():
            try:
                child = await call(
                    rt,
                    "spawn",
                    SpawnRequest(
                        parent_run_id=churn_root,
                        root_id=churn_root,
                        parent_agent="boss/churn",
                        child_agent="w/c",
                    ),
                    SpawnReply,
                )
                await retrying(
                    lambda c=child: call(
                        rt, "finished", FinishedReport(run_id=c.run_id, status="completed"), RunRecord
                    )
                )
                done += 1
            except (SpawnDenied, ServiceUnavailableError):
                await asyncio.sleep(0.01)

    workers = [asyncio.create_task(churn()) for _ in range(6)]
    await asyncio.sleep(1.0)
    victim = replica_processes[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*workers)
    assert done > 0, done
    assert len(await instances(rt)) == 1

    # Deadline started before the kill, due after it: the survivor enforces it.
    record = await wait_status(rt, deadline_run, "failed", timeout=15)
    assert record.reason == "deadline"

    # Budget crossed after the kill.
    subject = budget_counter_subject("px", "default", escape_token(budget_run), "tokens")
    await rt.nc.request(subject, b"", headers={"Nats-Incr": "101"}, timeout=5)
    record = await wait_status(rt, budget_run, "failed", timeout=15)
    assert record.reason == "Token budget exceeded: 101 > 100"

    # Spawn limit under concurrency, after the kill: exactly max_agents - 1 children.
    async def spawn_one(i: int) -> str | None:
        try:
            reply = await retrying(
                lambda: call(
                    rt,
                    "spawn",
                    SpawnRequest(
                        parent_run_id=slots_run,
                        root_id=slots_run,
                        parent_agent="boss/ha3",
                        child_agent=f"w/{i}",
                    ),
                    SpawnReply,
                )
            )
        except SpawnDenied:
            return None
        assert isinstance(reply, SpawnReply)
        return reply.run_id

    admitted = [r for r in await asyncio.gather(*(spawn_one(i) for i in range(20))) if r is not None]
    assert len(admitted) == 5

    # The churn tree's slot table is consistent whatever the kill interrupted: only runs that have not
    # ended hold slots (a retried report frees the slot its killed handler did not), and every admitted
    # run holds one. A spawn the kill cut short stays PENDING, with or without its slot, until the repair
    # after the spawn grace resolves it.
    tree_runs = await all_runs(rt)
    live = {r.run_id: r.status for r in tree_runs if r.root_id == churn_root and r.status not in TERMINAL}
    tree = await rt.topology.runs.get(f"tree.{escape_token(churn_root)}")
    holders = set(json.loads(tree.value or b"{}")["active"])
    assert holders <= set(live)
    assert {run_id for run_id, status in live.items() if status != "pending"} <= holders
    with contextlib.suppress(KernelError):
        await rt.cancel_run(churn_root)
