"""A 3-node cluster under `plexus security init`'s config: TLS for clients and (verified) TLS on the routes;
R3 streams are created by the tenant's operator and served to a least-privileged client."""

from __future__ import annotations

from pathlib import Path

import pytest

from plexus.runtime import Runtime
from plexus.runtime.kernel import NatsAuth, NatsCluster
from plexus.runtime.ops._security import security_init

pytestmark = pytest.mark.timeout(120)


async def test_a_secured_cluster_replicates_over_tls_routes(tmp_path: Path) -> None:
    layout = security_init(tmp_path / "sec", ["acme"])
    assert layout.route_cert is not None
    assert layout.route_key is not None
    assert layout.ca is not None
    cluster = NatsCluster(
        3,
        base_dir=tmp_path / "nats",
        extra_config=layout.config.read_text(),
        route_tls=(str(layout.route_cert), str(layout.route_key), str(layout.ca)),
    ).start()
    try:
        conf = (tmp_path / "nats" / "n0" / "nats.conf").read_text()
        assert "verify: true" in conf.split("cluster {", 1)[1]  # routes authenticate each other
        operator = await Runtime.connect(
            cluster.urls, replicas=3, auth=NatsAuth.from_env(layout.env("acme", "operator"))
        )
        try:
            info = await operator.js.stream_info(operator.topology.names.inbox_stream)
            assert info.config.num_replicas == 3
            assert info.cluster is not None
            assert len(info.cluster.replicas or []) == 2
            assert all(r.current for r in info.cluster.replicas or [])
        finally:
            await operator.close()
        client = await Runtime.connect(cluster.urls, auth=NatsAuth.from_env(layout.env("acme", "client")))
        try:  # a least-privileged user finds the R3 topology without touching it
            assert client.topology.streams[client.topology.names.inbox_stream].config.num_replicas == 3
        finally:
            await client.close()
        for server in cluster.servers:
            assert "Violation" not in server.log_tail(10_000)
    finally:
        cluster.cleanup()
