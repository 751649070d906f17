"""The run's RetryPolicy retrying a handler in place, next to the other two levels (crashed attempts, fenced
writes): a fenced write is never retried in place, both kinds of retries share one attempt counter bounded
by ``max_retries``, and a reply timeout is not retried in place by default (the callee may still work)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plexus.core import (
    DEFAULT_NON_RETRYABLE,
    AgentCrashError,
    AgentId,
    BaseBlock,
    ReplyTimeoutError,
    RetryPolicy,
    RunMessageReceived,
    TextBlock,
)
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.orchestration import RunStatus

from .conftest import StartWorker, WorkerProcess

FAST_POLICY = RetryPolicy(max_retries=3, initial_backoff_s=0.05, max_backoff_s=0.05)


@pytest.fixture
async def orchestrator(runtime: Runtime) -> AsyncIterator[Any]:
    """An in-process orchestrator replica on its own connection."""
    orchestration = pytest.importorskip("plexus.orchestrator")
    url = runtime.nc.connected_url
    assert url is not None
    orch = await orchestration.Orchestrator.connect(f"nats://{url.hostname}:{url.port}")
    await orch.start()
    try:
        yield orch
    finally:
        await orch.stop()


def _texts(blocks: list[BaseBlock]) -> list[str]:
    return [b.text for b in blocks if isinstance(b, TextBlock)]


async def test_a_fenced_checkpoint_is_not_retried_in_place_but_fenced(
    runtime: Runtime, start_worker: StartWorker, orchestrator: Any
) -> None:
    """Another writer appends to the agent's EventLog while its first handler runs, so the handler's
    `ctx.checkpoint()` is fenced (ConcurrentAppendError). Before: the policy retried the same activation in
    place (its log_seq still stale) max_retries times, each fenced again, before Fencing dropped it (5 runs
    of the handler, 4 reported attempts). Now the error goes straight to Fencing, which drops the activation
    while we hold the partition and runs the message once more from what is stored."""
    calls: list[str] = []

    class Fenced(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            calls.append(ctx.message_id)
            if len(calls) == 1:  # another writer moves the log under this activation
                log = runtime.event_log(ctx.agent_id)
                other = RunMessageReceived(
                    run_id="run_other", agent_id=str(ctx.agent_id), message_id="msg-other-writer"
                )
                await log.append([other], expected_seq=await log.last_seq())
            await ctx.checkpoint()
            return [TextBlock(text=f"call {len(calls)}")]

    app = App()
    app.register("fenced", lambda _id: Fenced())
    await start_worker(app)
    run_id = await runtime.start_run(AgentId("fenced", "f1"), [TextBlock(text="go")], retry=FAST_POLICY)
    reply = await runtime.run_result(run_id, timeout=30)
    assert _texts(reply) == ["call 2"]
    assert len(calls) == 2  # the fenced run and Fencing's one rerun; no in-place retry of the policy
    record = await runtime.get_run(run_id)
    assert (record.status, record.attempts) == (RunStatus.COMPLETED, 2)


async def _kill(worker: subprocess.Popen[bytes]) -> None:
    os.kill(worker.pid, signal.SIGKILL)
    assert await asyncio.to_thread(worker.wait, 10) == -signal.SIGKILL


def _count(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


async def _starts(log: Path, n: int) -> None:
    """Until the handler has started `n` times."""
    for _ in range(1200):
        if await asyncio.to_thread(_count, log) >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the handler never started {n} times")


@pytest.mark.parametrize("max_retries", [3, 1])
async def test_an_in_place_retry_then_a_crash_count_on_one_attempt_counter(
    runtime: Runtime, worker_process: WorkerProcess, orchestrator: Any, tmp_path: Path, max_retries: int
) -> None:
    """Attempt 1 fails (retried in place: attempt 2), attempt 2 dies with its worker (SIGKILL), the
    redelivery on another worker is attempt 3. Before: the in-place retry reported attempt 2 and the crash
    attempt 2 again, which the orchestrator ignored as seen (the run stayed at 2 attempts), and each kind had
    its own max_retries. Now, with max_retries=3 the run completes after 3 attempts, all counted; with
    max_retries=1 attempt 3 is one too many: the run fails with AgentCrashError, the handler ran twice."""
    log = tmp_path / "starts.log"
    env = {"RETRY_LOG": str(log)}
    first = worker_process("tests.runtime.apps_retries:app", "--worker-id", "w1", env=env)
    await runtime.get("flaky", lazy=False, timeout=60)
    policy = RetryPolicy(max_retries=max_retries, initial_backoff_s=0.05, max_backoff_s=0.05)
    run_id = await runtime.start_run(AgentId("flaky", "k"), [TextBlock(text="go")], retry=policy)
    await _starts(log, 2)
    await _kill(first)
    worker_process("tests.runtime.apps_retries:app", "--worker-id", "w2", env=env)
    if max_retries >= 2:
        reply = await runtime.run_result(run_id, timeout=60)
        assert _texts(reply) == ["ok after 3 starts"]
        record = await runtime.get_run(run_id)
        assert (record.status, record.attempts) == (RunStatus.COMPLETED, 3)
    else:
        with pytest.raises(AgentCrashError):
            await runtime.run_result(run_id, timeout=60)
        assert _count(log) == 2  # max_retries + 1 runs of the handler in all


def _asker_app(asks: list[str]) -> App:
    """`asker` sends to `slowpoke`, which answers long after the asker's reply timeout."""

    class Asker(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            asks.append(ctx.message_id)
            return await ctx.send([TextBlock(text="take your time")], AgentId("slowpoke", "s"), timeout=0.3)

    class Slowpoke(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            await asyncio.sleep(1.5)
            return [TextBlock(text="late")]

    app = App()
    app.register("asker", lambda _id: Asker())
    app.register("slowpoke", lambda _id: Slowpoke())
    return app


async def test_a_reply_timeout_is_not_retried_in_place_by_default(
    runtime: Runtime, start_worker: StartWorker, orchestrator: Any
) -> None:
    """The callee of a timed-out send may still be working on it: retrying the handler would send it again
    under a new message id (a duplicate request). Before: the default RetryPolicy retried it 3 times."""
    asks: list[str] = []
    await start_worker(_asker_app(asks))
    run_id = await runtime.start_run(AgentId("asker", "a1"), [TextBlock(text="go")])  # RetryPolicy()
    with pytest.raises(ReplyTimeoutError):
        await runtime.run_result(run_id, timeout=30)
    assert len(asks) == 1
    record = await runtime.get_run(run_id)
    assert (record.status, record.attempts) == (RunStatus.FAILED, 1)


async def test_a_policy_may_opt_in_to_retrying_reply_timeouts(
    runtime: Runtime, start_worker: StartWorker, orchestrator: Any
) -> None:
    asks: list[str] = []
    await start_worker(_asker_app(asks))
    policy = FAST_POLICY.model_copy(
        update={"max_retries": 1, "non_retryable": DEFAULT_NON_RETRYABLE - {"ReplyTimeoutError"}}
    )
    run_id = await runtime.start_run(AgentId("asker", "a2"), [TextBlock(text="go")], retry=policy)
    with pytest.raises(ReplyTimeoutError):
        await runtime.run_result(run_id, timeout=30)
    assert len(asks) == 2
    record = await runtime.get_run(run_id)
    assert (record.status, record.attempts) == (RunStatus.FAILED, 2)
