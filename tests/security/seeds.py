"""Secured NATS for whole-suite runs: a single node or a 3-node cluster (TLS routes) under `plexus security
init`'s config for one tenant, with the env and `NatsAuth` of each role.

The shared fixtures (`runtime`, `start_worker`, `worker_process`, `orchestrator_process`) connect as the
role they play when the `nats_server` they get is one of these: workers as the worker user, orchestrators as
the orchestrator user, and the test's own `runtime`, which inspects internals (leases, counters, the
orchestrator's store), as the operator, who also created the topology. Anything a role was not allowed to
do shows up as a permissions violation in the server log, and teardown fails the test on any.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from plexus.runtime import NatsServer, Runtime
from plexus.runtime.kernel import NatsAuth, NatsCluster
from plexus.runtime.ops._security import SecurityLayout, security_init

__all__ = ["SecuredSeed", "identity_auth", "identity_env", "running_seed", "secured_seed"]

TENANT = "acme"
HEARTBEAT_TTL_S = LEASE_TTL_S = 3.0  # tests/runtime/conftest.py's
#: On a cluster the lease TTL stays at the production default: it must outlast a JetStream leader election
#: and a loaded machine's late renewal (with 3 s, a preempted run was once re-executed from its start).
CLUSTER_LEASE_TTL_S = 10.0


@dataclass
class SecuredSeed:
    """What the suites use of a `NatsServer` (`url`), plus the identities of the secured tenant."""

    layout: SecurityLayout
    servers: list[NatsServer]
    cluster: NatsCluster | None = None

    @property
    def url(self) -> str:
        if self.cluster is not None:
            return self.cluster.urls[0]
        return f"tls://127.0.0.1:{self.servers[0].client_port}"

    def env_for(self, role: str) -> dict[str, str]:
        return self.layout.env(TENANT, role)

    def auth(self, role: str) -> NatsAuth:
        return NatsAuth.from_env(self.env_for(role))

    def violations(self) -> list[str]:
        return [
            line
            for server in self.servers
            for line in server.log_tail(100_000).splitlines()
            if "Violation" in line
        ]


def identity_env(server: object, role: str) -> dict[str, str]:
    """The ``PLEXUS_NATS_*`` variables of `role` on a secured seed; nothing on an open server."""
    return server.env_for(role) if isinstance(server, SecuredSeed) else {}


def identity_auth(server: object, role: str) -> NatsAuth | None:
    """`role`'s `NatsAuth` on a secured seed; None (the environment's default) on an open server."""
    return server.auth(role) if isinstance(server, SecuredSeed) else None


async def secured_seed(tmp_path: Path, nodes: int) -> SecuredSeed:
    """Start a secured single node (``nodes=1``) or cluster; the operator creates the topology (R3 on a
    cluster) before anything else connects."""
    layout = security_init(tmp_path / "security", [TENANT])
    if nodes == 1:
        server = NatsServer(store_dir=tmp_path / "nats", extra_config=layout.config.read_text()).start()
        seed = SecuredSeed(layout, [server])
    else:
        assert layout.route_cert is not None
        assert layout.route_key is not None
        assert layout.ca is not None
        cluster = NatsCluster(
            nodes,
            base_dir=tmp_path / "cluster",
            extra_config=layout.config.read_text(),
            route_tls=(str(layout.route_cert), str(layout.route_key), str(layout.ca)),
        ).start()
        seed = SecuredSeed(layout, list(cluster.servers), cluster)
    # The operator creates the topology with the suites' short TTLs: other processes adopt them.
    admin = await Runtime.connect(
        seed.cluster.urls if seed.cluster else seed.url,
        replicas=3 if nodes > 1 else None,
        auth=seed.auth("operator"),
        heartbeat_ttl_s=HEARTBEAT_TTL_S,
        lease_ttl_s=LEASE_TTL_S if nodes == 1 else CLUSTER_LEASE_TTL_S,
    )
    await admin.close()
    return seed


@contextlib.asynccontextmanager
async def running_seed(tmp_path: Path, nodes: int) -> AsyncIterator[SecuredSeed]:
    """`secured_seed` for a fixture: yields it, fails on any permissions violation, kills every node after
    (a graceful stop costs seconds per test and checks nothing)."""
    seed = await secured_seed(tmp_path, nodes)
    try:
        yield seed
        assert seed.violations() == [], "a role did something its permissions do not allow"
    finally:
        for server in seed.servers:
            server.kill()
        if seed.cluster is not None:
            seed.cluster.cleanup()
        else:
            for server in seed.servers:
                server.cleanup()
