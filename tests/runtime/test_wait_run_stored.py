"""`Runtime.wait_run` answers with what the runs bucket stores, never with a write the stream refused."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from plexus.core import ReplyTimeoutError
from plexus.runtime import Runtime
from plexus.runtime.kernel import escape_token
from plexus.runtime.orchestration import RunStatus
from plexus.runtime.wire._orchestration import RunRecord, run_key

RUN = "run_phantom"


async def test_a_refused_write_of_an_ended_record_is_not_taken_for_the_end(runtime: Runtime) -> None:
    bucket = runtime.topology.names.runs_bucket
    key = run_key(escape_token(RUN))
    kv = await runtime.js.key_value(bucket)
    running = RunRecord(run_id=RUN, root_id=RUN, agent_id="root/x", status=RunStatus.RUNNING)
    revision = await kv.put(key, msgspec.json.encode(running))
    completed = msgspec.json.encode(msgspec.structs.replace(running, status=RunStatus.COMPLETED))

    async def lose_compare_and_set() -> None:
        # What a writer that lost a race publishes: the stream refuses it, core subscribers still see it.
        while True:
            with pytest.raises(Exception, match="wrong last sequence"):
                await runtime.js.publish(
                    f"$KV.{bucket}.{key}",
                    completed,
                    headers={"Nats-Expected-Last-Subject-Sequence": str(revision + 1000)},
                )
            await asyncio.sleep(0.05)

    loser = asyncio.create_task(lose_compare_and_set())
    try:
        with pytest.raises(ReplyTimeoutError):
            await runtime.wait_run(RUN, timeout=1.5)
        assert (await runtime.wait_run(RUN, until={RunStatus.RUNNING}, timeout=5)).status == "running"
    finally:
        loser.cancel()
    waiting = asyncio.create_task(runtime.wait_run(RUN, timeout=10))
    await kv.put(key, completed)
    assert (await waiting).status == "completed"
