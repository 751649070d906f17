"""Plexus on a 3-node JetStream cluster with R3 streams and buckets (issue 13 item 1, first part): the
topology is replicated, a process connecting with defaults never scales it down, and durable sends keep
their answers and their state when the node a worker is connected to is killed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context, NatsCluster, Runtime, Worker, WorkerConfig

pytestmark = pytest.mark.slow


class Counter(Agent):
    """Counts its messages in durable state and answers the running count."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        return [TextBlock(text=str(self.state["n"]))]


async def _replicas(rt: Runtime) -> dict[str, int]:
    names = rt.topology.names
    out: dict[str, int] = {}
    for stream in (
        names.inbox_stream,
        names.events_stream,
        names.progress_stream,
        f"KV_{names.checkpoints_bucket}",
        f"KV_{names.leases_bucket}",
        f"KV_{names.runs_bucket}",
    ):
        out[stream] = (await rt.js.stream_info(stream)).config.num_replicas or 1
    return out


async def test_an_r3_topology_is_never_scaled_down_by_a_default_connection(
    nats_cluster: Callable[..., NatsCluster],
) -> None:
    cluster = nats_cluster(3)
    admin = await Runtime.connect(cluster.urls, replicas=3)
    try:
        assert set((await _replicas(admin)).values()) == {3}
    finally:
        await admin.close()
    # A worker or client started with defaults (no replicas given) reconciles nothing about replication.
    plain = await Runtime.connect(list(reversed(cluster.urls)))
    try:
        assert set((await _replicas(plain)).values()) == {3}
    finally:
        await plain.close()


async def test_durable_sends_survive_the_loss_of_the_workers_node(
    nats_cluster: Callable[..., NatsCluster],
) -> None:
    cluster = nats_cluster(3)
    admin = await Runtime.connect(cluster.urls, replicas=3)
    app = App()
    app.register("counter", lambda _id: Counter())
    wrt = await Runtime.connect(cluster.urls, lease_ttl_s=3.0, heartbeat_ttl_s=3.0)
    worker = Worker(app, wrt, WorkerConfig(lease_ttl_s=3.0, heartbeat_s=0.5, ack_wait_s=5.0))
    await worker.start()
    # The client starts on another node than the worker's, so the kill below leaves it connected.
    worker_url = wrt.nc.connected_url
    assert worker_url is not None
    victim = next(s for s in cluster.servers if s.client_port == worker_url.port)
    others = [s.url for s in cluster.servers if s is not victim]
    client = await Runtime.connect(others)
    target = AgentId("counter", "k")
    try:
        for i in range(1, 21):
            reply = await client.send_message([TextBlock(text="+1")], target, timeout=20)
            assert reply == [TextBlock(text=str(i))]
        victim.kill()
        # Every later send is answered, and the count continues: no accepted message and no state lost.
        for i in range(21, 41):
            reply = await client.send_message([TextBlock(text="+1")], target, timeout=30)
            assert reply == [TextBlock(text=str(i))]
        assert wrt.nc.connected_url is not None
        assert wrt.nc.connected_url.port != victim.client_port
        assert len(await wrt.event_log(target).read()) >= 40
    finally:
        await client.close()
        await worker.stop(drain_timeout=5)
        await wrt.close()
        await admin.close()
    await asyncio.sleep(0)
