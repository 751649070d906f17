"""The whole stack for gateway tests: a real nats-server, a real orchestrator, a real worker serving
`tests.gateway.apps`, and the gateway under real uvicorn on a loopback port, called over HTTP with httpx."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from plexus.gateway import Gateway, GatewayConfig, hash_token
from plexus.orchestrator import Orchestrator, OrchestratorConfig
from plexus.runtime import NatsServer, Runtime, Worker, WorkerConfig
from tests.orchestrator.conftest import FAST, until_serving

from .apps import app as agents_app

TOKEN = "test-token-0123456789"


@dataclass
class Stack:
    url: str
    rt: Runtime
    gateway: Gateway
    client: httpx.AsyncClient
    nats_url: str


@contextlib.asynccontextmanager
async def serving_cluster(url: str, config: OrchestratorConfig) -> AsyncIterator[Runtime]:
    """Orchestrator (`config`) + worker on their own connections; yields the gateway's Runtime."""
    orch = await Orchestrator.connect(url, config)
    await orch.start()
    worker_rt = await Runtime.connect(url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
    worker = Worker(agents_app, worker_rt, WorkerConfig(lease_ttl_s=3.0, heartbeat_s=0.5, ack_wait_s=5.0))
    await worker.start()
    rt = await Runtime.connect(url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
    await until_serving(rt.nc)
    try:
        yield rt
    finally:
        with contextlib.suppress(Exception):
            await worker.stop(drain_timeout=2)
        await worker_rt.close()
        await orch.stop()
        await rt.close()


@pytest.fixture
async def cluster(nats_server: NatsServer) -> AsyncIterator[Runtime]:
    """Orchestrator + worker on their own connections; yields the gateway's Runtime."""
    async with serving_cluster(nats_server.url, OrchestratorConfig(sweeper=FAST)) as rt:
        yield rt


StartGateway = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def start_gateway(cluster: Runtime, nats_server: NatsServer) -> AsyncIterator[StartGateway]:
    started: list[Stack] = []

    async def start(config: GatewayConfig | None = None, port: int = 0) -> Stack:
        cfg = config or GatewayConfig(token_hashes=frozenset({hash_token(TOKEN)}), heartbeat_s=1.0)
        gateway = Gateway(cluster, cfg, port=port)
        await gateway.start()
        client = httpx.AsyncClient(
            base_url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30.0
        )
        stack = Stack(gateway.url, cluster, gateway, client, nats_server.url)
        started.append(stack)
        return stack

    try:
        yield start
    finally:
        for stack in started:
            await stack.client.aclose()
            await stack.gateway.stop()


@pytest.fixture
async def gw(start_gateway: StartGateway) -> Stack:
    return await start_gateway()


@dataclass
class SseEvent:
    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


async def read_sse(
    client: httpx.AsyncClient,
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: Any = None,
    stop: Callable[[SseEvent], bool] | None = None,
    comments: list[str] | None = None,
) -> list[SseEvent]:
    """Read an SSE response until ``[DONE]`` (or until ``stop`` says so); comments go to ``comments``."""
    events: list[SseEvent] = []
    async with client.stream(method, url, headers=headers, json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line.startswith(":"):
                if comments is not None:
                    comments.append(line)
                continue
            if line == "":
                if not fields:
                    continue
                ev = SseEvent(fields.get("id"), fields.get("event", "message"), fields.get("data", ""))
                fields = {}
                events.append(ev)
                if ev.data == "[DONE]" or (stop is not None and stop(ev)):
                    break
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            fields[name] = fields[name] + "\n" + value if name == "data" and name in fields else value
    return events
