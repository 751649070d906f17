"""The one source of a Plexus deployment's settings: ports, replica counts, stream replicas, the
environment each service reads, and the commands it runs.

`deploy/local` (network namespaces), `deploy/compose.yaml` and `deploy/k8s/` are all built from these
values (`python -m deploy render` writes the last two; `make test` fails when they drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "APP",
    "GATEWAY_PORT",
    "HEALTH_PORT",
    "IMAGE",
    "METRICS_PORT",
    "NATS_CLIENT_PORT",
    "NATS_CLUSTER_PORT",
    "NATS_IMAGE",
    "NATS_MONITOR_PORT",
    "NATS_NODES",
    "ORCHESTRATORS",
    "SERVICES",
    "STREAM_REPLICAS",
    "WORKERS",
    "Service",
    "nats_seeds",
]

APP = "examples.research_team:app"
"""The App the workers serve (replace with your own `module:attribute`)."""

IMAGE = "plexus"
"""Image name; the Dockerfile has a target per service (``plexus:worker``, ``plexus:orchestrator``...)."""
NATS_IMAGE = "nats:2.12-alpine"
"""nats-server >= 2.12.3 (docs/security.md: the Jepsen fixes)."""

NATS_NODES = 3
STREAM_REPLICAS = 3
ORCHESTRATORS = 2
WORKERS = 2
NATS_CLIENT_PORT = 4222
NATS_CLUSTER_PORT = 6222
NATS_MONITOR_PORT = 8222
GATEWAY_PORT = 8470
HEALTH_PORT = 8480
"""``/healthz`` and ``/readyz`` of workers and orchestrators (the gateway serves them on its own port)."""
METRICS_PORT = 9464
"""Prometheus ``/metrics`` of every Plexus process (the OpenTelemetry Prometheus exporter's usual port)."""


def nats_seeds(hosts: list[str]) -> list[str]:
    """Client URLs of every NATS node: every Plexus process gets the whole seed list."""
    return [f"nats://{host}:{NATS_CLIENT_PORT}" for host in hosts]


@dataclass(frozen=True)
class Service:
    """One Plexus service as every deployment runs it."""

    name: str
    command: list[str]
    replicas: int
    port: int
    """The HTTP port its probes use (health, and the API for the gateway)."""
    env: dict[str, str] = field(default_factory=dict)


_COMMON_ENV = {
    "PLEXUS_METRICS_PORT": str(METRICS_PORT),
    "PLEXUS_METRICS_HOST": "0.0.0.0",
    "PLEXUS_HEALTH_HOST": "0.0.0.0",
}

SERVICES = (
    Service(
        "orchestrator",
        ["plexus", "orchestrator"],
        ORCHESTRATORS,
        HEALTH_PORT,
        {**_COMMON_ENV, "PLEXUS_HEALTH_PORT": str(HEALTH_PORT)},
    ),
    Service(
        "worker",
        ["plexus", "worker", APP],
        WORKERS,
        HEALTH_PORT,
        {**_COMMON_ENV, "PLEXUS_HEALTH_PORT": str(HEALTH_PORT)},
    ),
    Service(
        "gateway",
        ["plexus", "gateway", "--host", "0.0.0.0"],
        1,
        GATEWAY_PORT,
        {**_COMMON_ENV, "PLEXUS_GATEWAY_PORT": str(GATEWAY_PORT)},
    ),
)
