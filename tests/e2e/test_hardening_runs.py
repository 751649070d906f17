"""Regression tests for issue 9's worker-side run and fault defects (items 3, 9 and 11), on real worker and
orchestrator processes and a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
from nats.aio.msg import Msg

from plexus.core import AgentId, AgentProgress, KernelError, RetryPolicy, RunId, SpawnBudget, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.wire._envelope import RunInfo, decode_reply, encode_envelope
from tests.runtime.apps_misc import acked, dead_letters, envelope, good_headers
from tests.runtime.conftest import WorkerProcess

from .conftest import OrchestratorProcess
from .test_orchestrated_runs import until

pytest.importorskip("plexus.orchestrator")

APP = "tests.e2e.apps_hardening:app"
FAST = ("--heartbeat-ttl", "3")


async def serving_types(rt: Runtime, *types: str) -> None:
    async def hosted() -> bool:
        return all([len(await rt.workers(t)) >= 1 for t in types])

    await until(hosted, 20, "workers registered")


async def test_forged_orchestrated_run_is_dead_lettered_not_redelivered_forever(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    """Item 3: an envelope claiming an orchestrated run that was never started ran, its run-end report got
    "unknown run", and it was never acked: the caller got its reply again on every redelivery."""
    orchestrator_process()
    worker_process(APP, *FAST)
    await serving_types(runtime, "echo")
    rt = runtime
    forged = str(RunId.new())
    env = envelope("echo/forger", reply_to=rt.nc.new_inbox())
    env = msgspec.structs.replace(env, run=RunInfo(run_id=forged, root_id=forged, orchestrated=True))
    assert env.reply_to is not None
    replies: list[Msg] = []

    async def on_reply(msg: Msg) -> None:
        replies.append(msg)

    sub = await rt.nc.subscribe(env.reply_to, cb=on_reply)
    try:
        async with dead_letters(rt) as dlq:
            ack = await rt.js.publish(
                rt.subjects.inbox("echo", "forger"), encode_envelope(env), headers=good_headers(env)
            )
            dead = await dlq.expect(lambda m: (m.headers or {}).get("Plexus-Dlq-Run") == forged, timeout=30)
        assert dead.headers is not None
        assert dead.headers["Plexus-Dlq-Reason"] == "report_rejected"
        await acked(rt, ack.seq)  # before the fix: never acked, redelivered every ack_wait
        # Past the worker's ack_wait (5 s): a redelivery would have answered a second time.
        await asyncio.sleep(6)
    finally:
        await sub.unsubscribe()
    assert len(replies) == 1
    assert decode_reply(replies[0].data).ok


async def test_sequential_spawns_under_a_two_agent_budget_are_never_denied(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    """Item 9: the worker replied to the parent before reporting the child's run finished (which frees its
    slot), so a root spawning children one after another under max_agents=2 got SpawnDenied about every
    second time although no other child was alive."""
    orchestrator_process()
    worker_process(APP, *FAST)
    await serving_types(runtime, "seq-root", "seq-leaf")
    children = 8
    run_id = await runtime.start_run(
        AgentId("seq-root", "r"), [TextBlock(text=str(children))], spawn_budget=SpawnBudget(max_agents=2)
    )
    reply = await runtime.run_result(run_id, timeout=60)
    results = json.loads("".join(getattr(b, "text", "") for b in reply))
    assert results == [f"ok:r-{i}" for i in range(children)]


@asynccontextmanager
async def progress_marks(rt: Runtime) -> AsyncIterator[list[tuple[str, int, str, float]]]:
    """(step, pid, message id, arrival time) of every Effect agent's progress event, as they arrive."""
    marks: list[tuple[str, int, str, float]] = []

    async def on(msg: Msg) -> None:
        event = AgentProgress.model_validate_json(msg.data)
        if event.agent_id.startswith(("effect/", "quiet-effect/")):
            pid, message_id = "".join(getattr(b, "text", "") for b in event.content).split(":", 1)
            marks.append((str(event.step), int(pid), message_id, time.monotonic()))

    sub = await rt.nc.subscribe(f"{rt.subjects.base}.progress.>", cb=on)
    try:
        yield marks
    finally:
        await sub.unsubscribe()


@pytest.mark.parametrize(
    ("agent_type", "handler_due_before_resume"),
    [("effect", False), ("effect", True), ("quiet-effect", True)],
    ids=["stopped-on-resume", "fenced-effect", "fenced-commit"],
)
async def test_worker_stalled_past_its_lease_starts_none_of_its_queued_work_after_resuming(
    runtime: Runtime, worker_process: WorkerProcess, agent_type: str, handler_due_before_resume: bool
) -> None:
    """Item 11: a worker stopped (SIGSTOP) past its lease TTL and resumed started the messages it had
    queued, already handled by the partition's new owner, on stale activations (side effects twice), and
    let the handler that was running when it stalled run to its end.

    `fenced-effect`: the stall outlasts the handler's sleep, so the handler's timer is due the moment the
    process resumes, before any renewal could answer that the lease is gone. Its next effect (the "done"
    progress event) must still not happen: an effect of a handler whose lease is not certainly fresh waits
    for the store's answer. (Before that gate, this case failed in CI whenever the successor was slow to
    start.)

    `fenced-commit`: the same, but the handler makes no `Context` call after its sleep: it returns, and its
    commit must not land ahead of the new owner's first append for the key (which the expected-sequence
    append alone does not fence) nor answer the caller: every answer comes from the successor."""
    rt = runtime
    stalled = worker_process(APP, *FAST)
    await serving_types(rt, agent_type)
    key = "stall"
    handler_s = 4.0 if handler_due_before_resume else 8.0
    async with progress_marks(rt) as marks:
        # One long handler running, five queued behind it on the same key.
        sends = [
            asyncio.create_task(
                rt.send_message([TextBlock(text=str(handler_s))], AgentId(agent_type, key), timeout=60)
            )
        ]
        await until(lambda: _true(any(m[0] == "started" for m in marks)), 20, "first handler started")
        handler_due = next(m[3] for m in marks if m[0] == "started") + handler_s
        sends += [
            asyncio.create_task(rt.send_message([TextBlock(text="0")], AgentId(agent_type, key), timeout=60))
            for _ in range(5)
        ]
        await asyncio.sleep(0.5)  # the five are fetched and queued in the stalled worker's mailbox
        os.kill(stalled.pid, signal.SIGSTOP)
        started_before = {m[2] for m in marks if m[1] == stalled.pid and m[0] == "started"}
        try:
            successor = worker_process(APP, *FAST)
            # The successor takes the partition once the lease expires (3 s) and runs all six messages.
            # Resumed only after it has started one: on a loaded machine its start can take longer than the
            # lease, and a worker resumed before anyone else took its partition rightly keeps its queue.
            await until(
                lambda: _true(any(m[0] == "started" and m[1] == successor.pid for m in marks)),
                60,
                "the successor took the partition",
            )
            if handler_due_before_resume:
                await asyncio.sleep(max(0.0, handler_due + 0.5 - time.monotonic()))
        finally:
            resumed_at = time.monotonic()
            os.kill(stalled.pid, signal.SIGCONT)
        assert resumed_at > handler_due or not handler_due_before_resume
        replies = await asyncio.gather(*sends)
        await asyncio.sleep(
            3
        )  # time for the resumed worker to (wrongly) start queued work or finish its handler

    after = [m for m in marks if m[1] == stalled.pid and m[3] >= resumed_at]
    assert [m for m in after if m[0] == "started" and m[2] not in started_before] == [], marks
    assert [m for m in after if m[0] == "done"] == [], (
        marks
    )  # the stalled handler was stopped, not run to its end
    answered_by = [int("".join(getattr(b, "text", "") for b in reply).split(":", 1)[0]) for reply in replies]
    assert answered_by == [successor.pid] * 6, (answered_by, stalled.pid, successor.pid)
    if agent_type == "effect":
        by_successor = {m[2] for m in marks if m[1] == successor.pid and m[0] == "done"}
        assert len(by_successor) == 6
    assert stalled.poll() is None  # and the resumed worker lives on


async def _true(value: bool) -> bool:
    return value


async def test_worker_whose_connection_is_closed_for_good_exits_nonzero(
    runtime: Runtime, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    """Item 1, second half: nats-py closes a connection for good after some server errors (here "maximum
    control line exceeded"), even with unlimited reconnects. The worker lingered as a zombie: alive,
    unregistered, serving nothing. It must exit (status 1) so a supervisor restarts it."""
    proc = worker_process(APP, *FAST)
    await serving_types(runtime, "conn-killer")
    # Registration comes early in `Worker.start`: wait for the end of start so the connection dies while
    # the worker serves (the zombie case); a death during start has its own test below.
    log_path = tmp_path / "worker0.log"
    await until(lambda: _true(" serving " in log_path.read_text()), 20, "the worker serves")
    with contextlib.suppress(KernelError):  # the worker dies before it can answer
        await runtime.send_message([TextBlock(text="x")], AgentId("conn-killer", "k"), timeout=5)
    async with asyncio.timeout(20):
        while proc.poll() is None:  # noqa: ASYNC110 - another process's state
            await asyncio.sleep(0.1)
    assert proc.returncode == 1
    log = (tmp_path / "worker0.log").read_text()
    assert "NATS connection was closed for good" in log


async def test_worker_whose_connection_dies_during_start_exits_nonzero_and_says_why(
    worker_process: WorkerProcess, tmp_path: Path
) -> None:
    """The same fatal server error while `Worker.start` runs: the start fails on a closed connection and
    the worker must exit 1 naming the cause, not die with a bare traceback or linger."""
    proc = worker_process(APP.replace(":app", ":start_killer"), *FAST)
    async with asyncio.timeout(30):
        while proc.poll() is None:  # noqa: ASYNC110 - another process's state
            await asyncio.sleep(0.1)
    assert proc.returncode == 1
    log = (tmp_path / "worker0.log").read_text()
    assert "NATS connection was closed for good" in log
    assert " serving " not in log


async def test_crash_retried_parent_spawns_its_child_under_the_same_run_id(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    """Issue 9: a parent retried after its worker was killed minted new child run ids, so a child spawned
    before the crash was spawned again under another id and took a second spawn slot."""
    orchestrator_process()
    first = worker_process(APP, *FAST)
    await serving_types(runtime, "crash-root", "effect")
    async with progress_marks(runtime) as marks:
        run_id = await runtime.start_run(
            AgentId("crash-root", "c"),
            [TextBlock(text="2")],
            spawn_budget=SpawnBudget(max_agents=3),
            retry=RetryPolicy(max_retries=2, initial_backoff_s=0.1),
        )
        await until(lambda: _true(any(m[0] == "started" for m in marks)), 20, "the child started")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        worker_process(APP, *FAST)
        reply = await runtime.run_result(run_id, timeout=90)
    assert "".join(getattr(b, "text", "") for b in reply).startswith("child:")
    record = await runtime.get_run(run_id)
    assert record.attempts >= 2  # the root really was retried after the crash
    assert len(record.children) == 1, record.children


async def test_a_draining_worker_still_delivers_cancellation_to_its_running_handlers(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator_process: OrchestratorProcess
) -> None:
    """Issue 12 (graceful-stop bug): `Worker.stop()` drained the cancel/pause subscriptions before the
    in-flight handlers finished, so a run cancelled during a graceful stop kept running to its end."""
    orchestrator_process()
    proc = worker_process(APP, *FAST)
    await serving_types(runtime, "effect")
    async with progress_marks(runtime) as marks:
        run_id = await runtime.start_run(AgentId("effect", "draining"), [TextBlock(text="15")])
        await until(lambda: _true(any(m[0] == "started" for m in marks)), 20, "the handler started")
        os.kill(proc.pid, signal.SIGTERM)  # graceful: stop pulling, finish in-flight work (up to 30 s)
        await asyncio.sleep(0.5)
        await runtime.cancel_run(run_id)
        async with asyncio.timeout(40):
            while proc.poll() is None:  # noqa: ASYNC110 - another process's state
                await asyncio.sleep(0.1)
    assert (await runtime.get_run(run_id)).status == "cancelled"
    assert [m for m in marks if m[0] == "done"] == []  # stopped by the cancellation, not run to its end
