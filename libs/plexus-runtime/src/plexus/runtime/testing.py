"""Pytest plugin and helpers for testing against a real nats-server (registered as the ``plexus`` plugin).

Fixtures:
- ``nats_server`` — a fresh JetStream server per test (random loopback ports, own store dir, stopped by PID).
- ``nats_cluster`` — a factory: ``nats_cluster(n=3)`` returns a started `NatsCluster`, stopped after the test.
- ``nats_url`` — the URL of ``nats_server``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .ops._server import NatsCluster, NatsServer

__all__ = ["NatsCluster", "NatsServer", "nats_cluster", "nats_server", "nats_url"]


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[Callable[..., NatsCluster]]:
    started: list[NatsCluster] = []

    def make(n: int = 3, sync_interval: str | None = None) -> NatsCluster:
        cluster = NatsCluster(n=n, base_dir=tmp_path / f"cluster{len(started)}", sync_interval=sync_interval)
        started.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in started:
            cluster.stop()
