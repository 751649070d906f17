"""/healthz (liveness) and /readyz (readiness) for probes: a frozen NATS server makes the gateway unready,
not dead; readiness comes back by itself."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from plexus.runtime import NatsServer

from .conftest import Stack


async def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` (a child of this process) and return once every thread of it has stopped.

    ``kill`` only queues the signal: one thread of the server stops when it next runs, and only then are the
    others told to stop. Under load that takes tens of milliseconds, in which the server still answers
    requests sent after the ``kill``. The kernel reports the stop to the parent (``waitpid`` with
    ``WUNTRACED``) once the whole process has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        stopped, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)  # noqa: ASYNC222 - WNOHANG never blocks
        if stopped == pid and os.WIFSTOPPED(status):
            return
        assert stopped == 0, f"nats-server {pid} changed state unexpectedly: {status:#x}"
        assert time.monotonic() < deadline, f"nats-server {pid} did not stop within {timeout}s"
        await asyncio.sleep(0.001)


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
