"""Issue 15, item 1: `make cluster-up` / `make cluster-down` (deploy/local): three hosts in network
namespaces, NATS x3 with R3 streams, orchestrator x2, worker x2 and the gateway, each on its host; a run
tree completes on it, and `down` leaves no process and no host behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from deploy.local.cluster import LocalCluster
from deploy.local.netns import Network, netns_available

from plexus.core import AgentId, SpawnBudget, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.orchestration import RunStatus

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netns_available() is not None, reason=str(netns_available())),
]


def _netns_of(pid: int) -> str:
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)], capture_output=True, text=True
    ).stdout.strip()


def _running(pid: int) -> bool:
    """Alive and not a zombie (exited, not yet reaped by the process that started it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _hosts_left(prefix: str) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [n for n in names if n.startswith(f"{prefix}-")]


def _text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.timeout(240)
async def test_cluster_up_runs_a_tree_across_hosts_and_cluster_down_leaves_nothing(tmp_path: Path) -> None:
    # Its own prefix and subnet: a developer's `make cluster-up` (prefix plx) is left alone.
    cluster = LocalCluster(tmp_path / "state", network=Network("pxd", "10.77.4.0/24"))
    try:
        state = cluster.up()
        pids = state["pids"]
        assert isinstance(pids, dict)
        assert sorted(pids) == sorted(
            [
                "nats-n1",
                "nats-n2",
                "nats-n3",
                "orchestrator-o1",
                "orchestrator-o2",
                "worker-w1",
                "worker-w2",
                "gateway",
            ]
        )
        hosts = state["hosts"]
        assert isinstance(hosts, dict)
        # Every process runs in its host's network namespace, not the machine's.
        for name, pid in pids.items():
            assert _netns_of(pid).startswith("pxd-h"), name
        dashboard = str(state["dashboard"])
        assert dashboard == f"http://{hosts['h1']}:8470/"
        assert _get(f"{dashboard}readyz") == {
            "ready": True,
            "nats": True,
            "jetstream": True,
            "orchestrator": True,
        }
        agents = _get(f"{dashboard}v1/agents")
        assert isinstance(agents, list)
        assert {a["type"]: sorted(a["workers"]) for a in agents}["planner"] == ["w1", "w2"]

        seeds = state["nats"]
        assert isinstance(seeds, list)
        rt = await Runtime.connect(seeds)
        try:
            for stream in rt.topology.streams.values():
                assert stream.config.num_replicas == 3, stream.config.name
            info = await rt.js.stream_info(rt.topology.names.inbox_stream)
            assert info.cluster is not None
            assert len(info.cluster.replicas or []) == 2  # the leader plus two current followers
            run_id = await rt.start_run(
                AgentId("planner", "deploy"),
                [TextBlock(text="How does Plexus keep agents durable?")],
                spawn_budget=SpawnBudget(max_agents=10),
            )
            record = await rt.wait_run(run_id, timeout=120)
        finally:
            await rt.close()
        assert record.status == RunStatus.COMPLETED
        # Every process answers its readiness probe, and its Prometheus endpoint (deploy/spec.py's settings).
        health, metrics = state["health"], state["metrics"]
        assert isinstance(health, dict)
        assert isinstance(metrics, dict)
        assert set(health) == set(metrics) == {n for n in pids if not n.startswith("nats")}
        for name, url in health.items():
            assert _get(url)["ready"] is True, name  # type: ignore[index]

        def owned() -> float:
            return sum(
                float(line.rsplit(" ", 1)[1])
                for name in ("worker-w1", "worker-w2")
                for line in _text(metrics[name]).splitlines()
                if line.startswith("plexus_partitions_owned") and 'agent_type="planner"' in line
            )

        # Every planner partition has exactly one owner across the two workers, once a rebalance is over.
        deadline = time.monotonic() + 30
        while owned() != 16 and time.monotonic() < deadline:  # noqa: ASYNC110 - other processes
            await asyncio.sleep(0.5)
        if owned() != 16:  # say why: which worker holds what, and what their logs said last
            logs = {
                name: (tmp_path / "state" / f"{name}.log").read_text(errors="replace")[-3000:]
                for name in ("worker-w1", "worker-w2")
            }
            pytest.fail(f"{owned()} of 16 planner partitions owned after 30 s; worker logs: {logs}")
        scraped = {name: _text(url) for name, url in metrics.items()}
        assert "plexus_orchestrator_decisions" in scraped["orchestrator-o1"] + scraped["orchestrator-o2"]
        assert (tmp_path / "state" / "worker-w1.log").exists()
    finally:
        cluster.down()
    assert cluster.status() is None
    assert not [name for name, pid in pids.items() if _running(pid)]
    assert _hosts_left("pxd") == []


def test_the_cli_says_what_it_needs_when_it_cannot_build_hosts(tmp_path: Path) -> None:
    """Without root, `up` fails with one clear line (run as an unprivileged user when root is available)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    argv = [sys.executable, "-m", "deploy.local", "up", "--dir", str(tmp_path / "s")]
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "error: the local cluster needs network namespaces: network namespaces need root" in done.stderr
