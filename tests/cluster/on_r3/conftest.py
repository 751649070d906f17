"""The e2e suite (orchestrated runs) and the core failover tests again, on a 3-node JetStream cluster with
R3 streams and buckets (issue 13, item 1), secured as in production (issue 14): TLS for clients and routes,
the tenant's account, every process as its role's least-privileged user (tests/security/seeds.py).

`nats_server` is overridden here: it starts the cluster, has the operator create the topology with
replicas=3 before any test process connects (connections without `replicas` never scale it down), and
hands the tests the first node's URL; clients and workers learn the other nodes from the server (nats-py's
discovered servers), as a client given one seed of a real cluster does. A permissions violation on any
node fails the test. Nodes are killed at teardown (a graceful cluster stop costs ~3 s per test and checks
nothing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.conftest import orchestrator_process, runtime, worker_process
from tests.runtime.conftest import start_worker
from tests.security.seeds import SecuredSeed, running_seed

__all__ = ["orchestrator_process", "runtime", "start_worker", "worker_process"]


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[SecuredSeed]:
    async with running_seed(tmp_path, 3) as seed:
        yield seed
