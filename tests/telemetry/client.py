"""A client process for the telemetry tests: one traced request to relay/<key>, then a flush.

``python -m tests.telemetry.client NATS_URL KEY`` with the OTEL_* environment of the test."""

from __future__ import annotations

import asyncio
import sys

from opentelemetry import trace

from plexus.core import AgentId, TextBlock
from plexus.runtime import Runtime, configure_telemetry


async def main(url: str, key: str) -> None:
    telemetry = configure_telemetry("telemetry-test-client")
    rt = await Runtime.connect(url)
    try:
        with trace.get_tracer("tests").start_as_current_span("client request"):
            await rt.send_message([TextBlock(text="hi")], AgentId("relay", key), timeout=30)
    finally:
        await rt.close()
        telemetry.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
