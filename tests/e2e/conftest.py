"""Fixtures for whole-system tests: real nats-server, worker processes and orchestrator processes.

The suite runs under the secured configuration of `plexus security init` (issue 14): TLS, an account for
the tenant, and each process connected as its role's least-privileged user (tests/security/seeds.py); a
permissions violation anywhere fails the test at teardown."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from plexus.runtime import NatsServer
from tests.runtime.conftest import REPO, runtime, worker_process
from tests.security.seeds import SecuredSeed, identity_env, running_seed

__all__ = ["OrchestratorProcess", "orchestrator_process", "runtime", "worker_process"]

OrchestratorProcess = Callable[..., subprocess.Popen[bytes]]
#: Seconds an orchestrator process may take to say it is serving.
STARTUP_S = 60.0

# Collected on a 3-node R3 cluster instead (tests/cluster/on_r3/test_e2e_on_r3.py); naming the file on the
# command line still runs it here on one node.
collect_ignore = ["test_orchestrated_runs.py"]


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[SecuredSeed]:
    async with running_seed(tmp_path, 1) as seed:
        yield seed


@pytest.fixture
def orchestrator_process(nats_server: NatsServer, tmp_path: Path) -> Iterator[OrchestratorProcess]:
    """Start `plexus orchestrator` as a real process (killed by PID at teardown)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        path = tmp_path / f"orchestrator{len(procs)}.log"
        log = path.open("wb")
        cmd = [sys.executable, "-m", "plexus.runtime.cli", "orchestrator", "--nats", nats_server.url, *args]
        env = {**os.environ, "PYTHONPATH": str(REPO), **identity_env(nats_server, "orchestrator")}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        procs.append(proc)
        # Serving once it says so: on a loaded machine a test's first request came before that and found no
        # orchestrator at all (ServiceUnavailableError).
        deadline = time.monotonic() + STARTUP_S
        while "serving" not in path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"plexus orchestrator did not start: {path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
