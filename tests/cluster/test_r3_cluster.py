"""Plexus on a 3-node JetStream cluster with R3 streams and buckets (issue 13 item 1, first part): the
topology is replicated, a process connecting with defaults never scales it down, durable sends keep their
answers and their state when the node a worker is connected to is killed, and an orchestrated run tree
(orchestrator process connected with the seed list) completes when that node dies mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, TypeVar

import nats.errors
import pytest

from plexus.core import AgentId, BaseBlock, KernelError, TextBlock
from plexus.gateway import SessionStore
from plexus.gateway._access import TokenRegistry
from plexus.runtime import Agent, App, Context, Runtime, Worker, WorkerConfig
from plexus.runtime.kernel import NatsCluster
from plexus.runtime.orchestration import RunRecord

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


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


async def test_a_bare_topology_run_keeps_an_r3_cluster_at_r3_and_raises_what_an_upgrade_adds(
    nats_cluster: Callable[..., NatsCluster],
) -> None:
    """The upgrade step docs/operations.md gives is a bare ``plexus topology``. Its ``--replicas`` once
    defaulted to 1 and scaled every stream of an R3 cluster down; now it keeps the replicas it finds, and a
    bucket the upgrade adds (here: one deleted before the run) is created at them too."""
    cluster = nats_cluster(3)
    admin = await Runtime.connect(cluster.urls, replicas=3)
    try:
        added = admin.topology.names.consumers_bucket
        await admin.js.delete_key_value(added)
        argv = [arg for url in cluster.urls for arg in ("--nats", url)]
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "plexus.runtime.cli", "topology", *argv],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "with 3 replica(s)" in done.stdout, done.stdout
        replicas = {info.config.name: info.config.num_replicas for info in await admin.js.streams_info()}
        assert replicas[f"KV_{added}"] == 3
        assert set(replicas.values()) == {3}, replicas
    finally:
        await admin.close()


async def test_every_stream_and_bucket_has_the_topologys_replicas(
    nats_cluster: Callable[..., NatsCluster],
) -> None:
    """Issue 36 item 2: on an R3 cluster the gateway's buckets (sessions, tokens) were R1, made by the first
    gateway and `plexus tokens` with their defaults. Everything in the account is the topology's, at R3."""
    cluster = nats_cluster(3)
    admin = await Runtime.connect(cluster.urls, replicas=3)
    gateway = await Runtime.connect(cluster.urls)  # a gateway connects with defaults, then opens its buckets
    try:
        await SessionStore.open(gateway.js)
        await TokenRegistry(gateway.js).open()
        names = admin.topology.names
        expected = {
            names.inbox_stream,
            names.events_stream,
            names.progress_stream,
            names.dlq_stream,
            names.counters_stream,
            names.schedules_stream,
            *(
                f"KV_{bucket}"
                for bucket in (
                    names.checkpoints_bucket,
                    names.registry_bucket,
                    names.subscriptions_bucket,
                    names.workers_bucket,
                    names.leases_bucket,
                    names.consumers_bucket,
                    names.runs_bucket,
                    "plexus_sessions",
                    "plexus_gateway_tokens",
                )
            ),
            f"OBJ_{names.artifacts_bucket}",
        }
        replicas = {info.config.name: info.config.num_replicas for info in await admin.js.streams_info()}
        assert replicas == dict.fromkeys(expected, 3)
    finally:
        await gateway.close()
        await admin.close()


async def test_durable_sends_survive_the_loss_of_the_workers_node(
    nats_cluster: Callable[..., NatsCluster],
) -> None:
    cluster = nats_cluster(3)
    admin = await Runtime.connect(cluster.urls, replicas=3)
    app = App()
    app.register("counter", lambda _id: Counter())
    # Production lease TTL (10 s): it must outlive the leader elections that follow a node loss.
    wrt = await Runtime.connect(cluster.urls, heartbeat_ttl_s=3.0)
    worker = Worker(app, wrt, WorkerConfig(heartbeat_s=0.5, ack_wait_s=5.0))
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
        assert len(await _answered(lambda: wrt.event_log(target).read())) >= 40
    finally:
        await client.close()
        await worker.stop(drain_timeout=5)
        await wrt.close()
        await admin.close()
    await asyncio.sleep(0)


async def test_an_orchestrated_tree_completes_when_a_node_dies_mid_run(
    nats_cluster: Callable[..., NatsCluster], tmp_path: Path
) -> None:
    pytest.importorskip("plexus.orchestrator")
    from tests.e2e.apps_tree import app as tree_app

    cluster = nats_cluster(3)
    seeds = [arg for url in cluster.urls for arg in ("--nats", url)]
    log = (tmp_path / "orchestrator.log").open("wb")
    async with contextlib.AsyncExitStack() as stack:
        # Registered before anything that can fail: a failed start must not leave the process running.
        stack.callback(log.close)
        orch = _spawn(["orchestrator", *seeds], log)
        stack.callback(orch.wait, 10)
        stack.callback(_kill, orch.pid)
        admin = await Runtime.connect(cluster.urls, replicas=3)
        stack.push_async_callback(admin.close)
        # Production lease TTL (10 s): a JetStream leader election after a node loss takes seconds, and a
        # lease must outlive it (a 3 s TTL expires during the election and every partition moves).
        wrt = await Runtime.connect(cluster.urls, heartbeat_ttl_s=3.0)
        stack.push_async_callback(wrt.close)
        worker = Worker(tree_app, wrt, WorkerConfig(heartbeat_s=0.5, ack_wait_s=5.0))
        await worker.start()
        stack.push_async_callback(worker.stop, 5)
        worker_url = wrt.nc.connected_url
        assert worker_url is not None
        victim = next(s for s in cluster.servers if s.client_port == worker_url.port)
        client = await Runtime.connect([s.url for s in cluster.servers if s is not victim])
        stack.push_async_callback(client.close)
        leaf = {"steps": 4, "sleep": 0.25}
        run_id = await _start_when_served(
            client, AgentId("root", "r3"), json.dumps({"children": 4, "leaf": leaf})
        )
        await asyncio.sleep(0.5)  # the children are mid-way
        victim.kill()
        record = await _ended(client, run_id, timeout=90)
        assert record.status == "completed", record
        result = json.loads("".join(getattr(b, "text", "") for b in await client.run_result(run_id)))
        assert sorted(result) == [f"ok:r3-{i} did 4 steps from 0" for i in range(4)] or all(
            r.startswith("ok:r3-") for r in result
        )
        assert len(result) == 4


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def _answered(read: Callable[[], Awaitable[T]], timeout: float = 30) -> T:
    """`read()`, asked again while the cluster still elects leaders (a read is not what these tests check)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await read()
            except (TimeoutError, nats.errors.Error):
                await asyncio.sleep(0.2)


def _spawn(args: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A `plexus` command as its own process (stopped by PID at the end of the test)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "plexus.runtime.cli", *args]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


async def _start_when_served(client: Runtime, root: AgentId, text: str) -> str:
    """Start the run once an orchestrator answers (its process takes a moment to come up)."""
    async with asyncio.timeout(30):
        while True:
            try:
                return await client.start_run(root, [TextBlock(text=text)])
            except KernelError as exc:
                if exc.error_type != "ServiceUnavailableError":
                    raise
                await asyncio.sleep(0.2)


async def _ended(client: Runtime, run_id: str, timeout: float) -> RunRecord:
    """The run's record once it ended; requests that time out while the cluster re-elects are retried."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                record = await client.get_run(run_id)
                if record.status in ("completed", "failed", "cancelled"):
                    return record
            except (KernelError, TimeoutError, nats.errors.Error):
                pass
            await asyncio.sleep(0.25)
