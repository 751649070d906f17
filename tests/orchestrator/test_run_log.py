"""The orchestrator logs each ended run once, on ``plexus.orchestrator.runs`` (issue 44, item 4): here a run
whose type no live worker hosts, failed by the sweeper after the grace period (decision ``no_host``)."""

from __future__ import annotations

import logging

import pytest

from plexus.core import AgentId, TextBlock
from plexus.orchestrator import Orchestrator, OrchestratorConfig, SweeperConfig
from plexus.runtime import NatsServer, Runtime
from plexus.runtime.kernel import AgentTypeInfo

from .conftest import until_serving


async def test_a_run_nobody_hosts_ends_in_one_warning_line(
    nats_server: NatsServer, rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="plexus.orchestrator.runs")
    await rt.registry.register_type(
        AgentTypeInfo(namespace="default", type="ghost", durable=True, partitions=rt.partitions)
    )
    sweeper = SweeperConfig(tick_s=0.05, repair_s=0.2, no_host_grace_s=0.5)
    async with await Orchestrator.connect(nats_server.url, OrchestratorConfig(sweeper=sweeper)):
        await until_serving(rt.nc)
        run_id = await rt.start_run(AgentId("ghost", "k"), [TextBlock(text="x")])
        assert (await rt.wait_run(run_id, timeout=20)).status == "failed"
    lines = [
        r.__dict__
        for r in caplog.records
        if r.name == "plexus.orchestrator.runs" and r.__dict__.get("run_id") == run_id
    ]
    assert len(lines) == 1
    line = lines[0]
    assert line["levelno"] == logging.WARNING
    fields = (line["agent_id"], line["root_id"], line["status"], line["decision"])
    assert fields == ("ghost/k", run_id, "failed", "no_host")
    assert line["error_type"] == "AgentNotFoundError"
    assert "AgentNotFoundError" in line["msg"] % line["args"]
    assert line["usage"] == {"tokens": 0, "cost_micros": 0, "turns": 0}
