"""A client process for the telemetry tests: one traced request to relay/<key>, then a flush.

``python -m tests.telemetry.client NATS_URL KEY [tree]`` with the OTEL_* environment of the test; with
``tree``, an orchestrated run of lead/<key> (which spawns a child) instead of a request."""

from __future__ import annotations

import asyncio
import sys

from opentelemetry import trace

from plexus.core import AgentId, SpawnBudget, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.kernel import configure_telemetry


async def main(url: str, key: str, mode: str) -> None:
    telemetry = configure_telemetry("telemetry-test-client")
    rt = await Runtime.connect(url)
    try:
        with trace.get_tracer("tests").start_as_current_span("client request"):
            if mode == "tree":
                run_id = await rt.start_run(
                    AgentId("lead", key), [TextBlock(text="hi")], spawn_budget=SpawnBudget(max_agents=4)
                )
                record = await rt.wait_run(run_id, timeout=30)
                assert record.status == "completed", record
            else:
                await rt.send_message([TextBlock(text="hi")], AgentId("relay", key), timeout=30)
    finally:
        await rt.close()
        telemetry.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "request"))
