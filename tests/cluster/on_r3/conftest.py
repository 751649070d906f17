"""The e2e suite (orchestrated runs) and the core failover tests again, on a 3-node JetStream cluster with
R3 streams and buckets (issue 13, item 1).

`nats_server` is overridden here: it starts `NatsCluster(3)`, creates the topology with replicas=3 before
any test process connects (connections without `replicas` never scale it down), and hands the tests the
first node's URL; clients and workers learn the other nodes from the server (nats-py's discovered servers),
as a client given one seed of a real cluster does. Nodes are killed at teardown (a graceful cluster stop
costs ~3 s per test and checks nothing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plexus.runtime import NatsCluster, Runtime
from tests.e2e.conftest import orchestrator_process, runtime, worker_process
from tests.runtime.conftest import start_worker

__all__ = ["orchestrator_process", "runtime", "start_worker", "worker_process"]


class ClusterSeed:
    """What the suites use of a `NatsServer` (its `url`), backed by a 3-node cluster."""

    def __init__(self, cluster: NatsCluster) -> None:
        self.cluster = cluster

    @property
    def url(self) -> str:
        return self.cluster.urls[0]


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[ClusterSeed]:
    cluster = NatsCluster(3, base_dir=tmp_path / "cluster").start()
    try:
        admin = await Runtime.connect(cluster.urls, replicas=3)
        await admin.close()
        yield ClusterSeed(cluster)
    finally:
        for server in cluster.servers:
            server.kill()
        cluster.cleanup()
