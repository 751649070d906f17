"""Scheduled runs under `plexus security init` on one node: the orchestrator, as the orchestrator user,
writes the schedules and consumes their fires; the client and the gateway users create, list, pause, resume,
trigger and delete them through the orchestrator only (any permissions violation fails the test)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from pathlib import Path

from plexus.core import AgentId, TextBlock
from plexus.orchestrator import Orchestrator
from plexus.runtime import Runtime
from plexus.runtime.kernel import AgentTypeInfo
from plexus.runtime.orchestration import ScheduledRun
from tests.security.seeds import running_seed

WAIT_S = 30.0


async def _until(rt: Runtime, done: Callable[[list[ScheduledRun]], bool]) -> None:
    """Poll schedule "sec" until its last runs satisfy `done` (within WAIT_S)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            if done((await rt.get_schedule("sec")).state.last_runs):
                return
            await asyncio.sleep(0.3)


async def test_scheduled_runs_under_the_orchestrator_client_and_gateway_roles(tmp_path: Path) -> None:
    async with running_seed(tmp_path, 1) as seed:
        admin = await Runtime.connect(seed.url, auth=seed.auth("operator"))
        await admin.registry.register_type(
            AgentTypeInfo(namespace="default", type="echo", durable=True, partitions=admin.partitions)
        )
        orch = await Orchestrator.connect(seed.url, auth=seed.auth("orchestrator"))
        await orch.start()
        client = await Runtime.connect(seed.url, auth=seed.auth("client"))
        gateway = await Runtime.connect(seed.url, auth=seed.auth("gateway"))
        try:
            await client.schedule_run(
                AgentId("echo", "k"),
                [TextBlock(text="tick")],
                every=datetime.timedelta(seconds=1),
                overlap="allow",
                schedule_id="sec",
            )
            await _until(gateway, lambda runs: any(r.outcome == "started" for r in runs))
            await gateway.pause_schedule("sec")
            run_id = await gateway.trigger_schedule("sec")
            await _until(client, lambda runs: run_id in [r.run_id for r in runs])
            await client.resume_schedule("sec")
            assert [s.schedule.id for s in (await gateway.list_schedules()).schedules] == ["sec"]
            await client.delete_schedule("sec")
            assert (await client.list_schedules()).schedules == []
        finally:
            for rt in (gateway, client):
                await rt.close()
            await orch.stop()
            await orch.nc.close()
            await admin.close()
