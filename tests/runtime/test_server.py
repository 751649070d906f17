"""The embedded nats-server launcher and the pytest fixtures run real servers."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path

import nats
import nats.js.errors
import pytest

from plexus.runtime.ops import _server
from plexus.runtime.ops._server import NatsCluster, NatsServer, NatsServerError


async def test_fixture_server_has_jetstream(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="T", subjects=["t.>"])
        ack = await js.publish("t.x", b"hello")
        assert ack.seq == 1
        msg = await js.get_last_msg("T", "t.x")
        assert msg.data == b"hello"
    finally:
        await nc.close()


def test_stop_by_pid_and_restart_keeps_store(tmp_path: Path) -> None:
    server = NatsServer(store_dir=tmp_path / "s").start()
    pid = server.pid
    assert pid is not None
    server.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    server.start()
    assert server.pid != pid
    server.stop()
    assert (tmp_path / "s" / "js").is_dir()


def test_sync_interval_and_profile_reach_the_config(tmp_path: Path) -> None:
    def sync_lines(server: NatsServer) -> list[str]:
        config = server._config(tmp_path)
        return [ln.strip() for ln in config.splitlines() if ln.strip().startswith("sync_interval")]

    assert sync_lines(NatsServer(profile="production")) == ["sync_interval: always"]
    assert sync_lines(NatsServer()) == []
    assert sync_lines(NatsServer(sync_interval="1s")) == ['sync_interval: "1s"']


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    server = NatsServer(store_dir=tmp_path / "bad", extra_config="this is { not valid", ready_timeout=5)
    with pytest.raises(NatsServerError, match="exited"):
        server.start()


async def test_three_node_cluster_replicates(nats_cluster: Callable[..., NatsCluster]) -> None:
    cluster = nats_cluster(3)
    nc = await nats.connect(cluster.urls[0])
    try:
        js = nc.jetstream()
        await js.add_stream(name="R", subjects=["r.>"], num_replicas=3)
        # A just-created R3 stream answers once its leader is elected and its interest has reached the
        # node we talk to; until then a publish gets "no responders" (seen on a loaded machine).
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            try:
                ack = await js.publish("r.a", b"x", headers={"Nats-Msg-Id": "r-a-1"})
                break
            except nats.js.errors.NoStreamResponseError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
        info = await js.stream_info("R")
        assert ack.seq == 1
        assert info.cluster is not None
        assert len(info.cluster.replicas or []) == 2
    finally:
        await nc.close()


def test_a_cluster_whose_route_port_was_taken_meanwhile_starts_on_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Route ports are probed free and released before nats-server binds them; here another process holds
    # the first one by the time the node starts (what a parallel test run did once), so that node exits.
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = int(blocker.getsockname()[1])
        probe = _server._free_port
        handed = iter([taken])
        monkeypatch.setattr(_server, "_free_port", lambda: next(handed, None) or probe())
        cluster = NatsCluster(n=3, base_dir=tmp_path)
        try:
            cluster.start()
            assert taken not in [s.cluster_port for s in cluster.servers]
            assert all(s.process is not None and s.process.poll() is None for s in cluster.servers)
        finally:
            cluster.cleanup()
