"""/healthz (liveness) and /readyz (readiness) for probes: a frozen NATS server makes the gateway unready,
not dead; readiness comes back by itself."""

from __future__ import annotations

import os
import signal

from plexus.runtime import NatsServer
from tests.freeze import freeze

from .conftest import Stack


async def test_ready_while_nats_answers_unready_but_alive_while_it_does_not(
    gw: Stack, nats_server: NatsServer
) -> None:
    ready = await gw.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"ready": True, "nats": True, "jetstream": True, "orchestrator": True}
    assert (await gw.client.get("/healthz")).json() == {"ok": True, "connected": True}

    assert nats_server.pid is not None
    try:
        await freeze(nats_server.pid)
        frozen = await gw.client.get("/readyz")
        assert frozen.status_code == 503
        assert frozen.json()["jetstream"] is False
        assert (await gw.client.get("/healthz")).status_code == 200  # not a reason to restart the gateway
    finally:
        os.kill(nats_server.pid, signal.SIGCONT)
    again = await gw.client.get("/readyz")
    assert again.status_code == 200, again.text
