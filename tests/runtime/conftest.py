"""Shared fixtures for end-to-end runtime tests: a connected Runtime, in-process and subprocess workers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from plexus.runtime import App, NatsServer, Runtime, Worker, WorkerConfig
from tests.security.seeds import identity_auth, identity_env

REPO = Path(__file__).resolve().parents[2]

#: Short TTLs keep failover tests fast; production defaults are 10 s.
HEARTBEAT_TTL_S = 3.0
LEASE_TTL_S = 3.0


@pytest.fixture
async def runtime(nats_server: NatsServer) -> AsyncIterator[Runtime]:
    # On a secured seed the test's own connection, which inspects internals, is the operator's.
    rt = await Runtime.connect(
        nats_server.url,
        heartbeat_ttl_s=HEARTBEAT_TTL_S,
        lease_ttl_s=LEASE_TTL_S,
        auth=identity_auth(nats_server, "operator"),
    )
    try:
        yield rt
    finally:
        await rt.close()


StartWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start_worker(nats_server: NatsServer) -> AsyncIterator[StartWorker]:
    """Start an in-process Worker for `app` on its own connection (to `url`, default the server's); all are
    stopped at teardown."""
    started: list[tuple[Worker, Runtime]] = []

    async def start(app: App, url: str | None = None, **config: object) -> Worker:
        rt = await Runtime.connect(
            url or nats_server.url,
            namespace=app.namespace,
            heartbeat_ttl_s=HEARTBEAT_TTL_S,
            lease_ttl_s=LEASE_TTL_S,
            auth=identity_auth(nats_server, "worker"),
        )
        options: dict[str, object] = {"lease_ttl_s": 3.0, "heartbeat_s": 0.5, "ack_wait_s": 5.0}
        options.update(config)
        worker = Worker(app, rt, WorkerConfig(**options))  # type: ignore[arg-type]
        await worker.start()
        started.append((worker, rt))
        return worker

    try:
        yield start
    finally:
        for worker, rt in reversed(started):
            with contextlib.suppress(Exception):
                await worker.stop(drain_timeout=5)
            with contextlib.suppress(Exception):
                await rt.close()


WorkerProcess = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def worker_process(nats_server: NatsServer, tmp_path: Path) -> Iterator[WorkerProcess]:
    """Start `plexus worker <app_spec>` as a real process (killed by PID at teardown)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(app_spec: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"worker{len(procs)}.log").open("wb")
        cmd = [sys.executable, "-m", "plexus.runtime.cli", "worker", app_spec, "--nats", nats_server.url]
        cmd += ["--lease-ttl", "3", "--ack-wait", "5", *args]
        full_env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            **identity_env(nats_server, "worker"),
            **(env or {}),
        }
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
