"""The run's RetryPolicy retrying a handler in place, next to the other two levels (crashed attempts, fenced
writes): a fenced write is never retried in place, both kinds of retries share one attempt counter bounded
by ``max_retries``, and a reply timeout is not retried in place by default (the callee may still work)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from plexus.core import (
    AgentId,
    BaseBlock,
    RetryPolicy,
    RunMessageReceived,
    TextBlock,
)
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.orchestration import RunStatus

from .conftest import StartWorker

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
