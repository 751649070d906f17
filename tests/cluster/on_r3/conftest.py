"""The e2e suite (orchestrated runs) and the failover suite (send, kill, hand-over) again, on a 3-node
JetStream cluster with R3 streams and buckets (issue 13, item 1).

`nats_server` is overridden here: it starts `NatsCluster(3)`, creates the topology with replicas=3 before
any test process connects (connections without `replicas` never scale it down), and hands the tests the
first node's URL; clients and workers learn the other nodes from the server (nats-py's discovered servers),
as a client given one seed of a real cluster does.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plexus.runtime import NatsCluster
from tests.e2e.conftest import orchestrator_process, runtime, worker_process
from tests.runtime.conftest import start_worker

__all__ = ["orchestrator_process", "runtime", "start_worker", "worker_process"]

REPO = Path(__file__).resolve().parents[3]


class ClusterSeed:
    """What the suites use of a `NatsServer` (its `url`), backed by a 3-node cluster."""

    def __init__(self, cluster: NatsCluster) -> None:
        self.cluster = cluster

    @property
    def url(self) -> str:
        return self.cluster.urls[0]


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[ClusterSeed]:
    cluster = NatsCluster(3, base_dir=tmp_path / "cluster").start()
    try:
        subprocess.run(
            [sys.executable, "-m", "deploy.local", "topology", *cluster.urls],
            check=True,
            cwd=REPO,
            capture_output=True,
            timeout=120,
        )
        yield ClusterSeed(cluster)
    finally:
        cluster.cleanup()
