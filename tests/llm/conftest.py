"""Fixtures for the LLM loop tests: the runtime suite's Runtime and worker fixtures, reused as they are, and
an orchestrator replica for orchestrated runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from plexus.runtime import Runtime
from tests.runtime.conftest import runtime, start_worker, worker_process

__all__ = ["orchestrator", "runtime", "start_worker", "worker_process"]


@pytest.fixture
async def orchestrator(runtime: Runtime) -> AsyncIterator[Any]:
    """An in-process orchestrator replica on its own connection (the tests' process is not the worker's)."""
    orchestration = pytest.importorskip("plexus.orchestrator")
    url = runtime.nc.connected_url
    assert url is not None
    orch = await orchestration.Orchestrator.connect(f"nats://{url.hostname}:{url.port}")
    await orch.start()
    try:
        yield orch
    finally:
        await orch.stop()
