"""A nats-server secured by `plexus security init` (tenants acme and beta; acme's workers may write the
state of `ledger` and `tree` only), and connections as any tenant's role."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from plexus.runtime import NatsServer, Runtime
from plexus.runtime.kernel import NatsAuth
from plexus.runtime.ops._security import SecurityLayout, security_init

REPO = Path(__file__).resolve().parents[2]
APP = "tests.security.app:app"


@dataclass
class Secured:
    server: NatsServer
    layout: SecurityLayout
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.server.client_port}"

    def auth(self, tenant: str, role: str) -> NatsAuth:
        return NatsAuth.from_env(self.layout.env(tenant, role))

    def spawn(self, tenant: str, role: str, *args: str) -> subprocess.Popen[bytes]:
        """A `plexus` command run as `tenant`'s `role` user (its env file, nothing else)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLEXUS_NATS")}
        env.update(self.layout.env(tenant, role))
        env["PYTHONPATH"] = str(REPO)
        log = (self.tmp / f"{tenant}-{role}-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "plexus.runtime.cli", *args, "--nats", self.url],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        self.procs.append(proc)
        return proc

    def violations(self) -> list[str]:
        return [line for line in self.server.log_tail(100_000).splitlines() if "Violation" in line]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    layout = security_init(tmp_path / "security", ["acme", "beta"], worker_types={"acme": ["ledger", "tree"]})
    server = NatsServer(store_dir=tmp_path / "nats", extra_config=layout.config.read_text())
    server.start()
    sec = Secured(server, layout, tmp_path)
    try:
        yield sec
    finally:
        for proc in sec.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        server.cleanup()


@dataclass
class Identity:
    """A raw nats-py connection as one user, with the asynchronous errors the server sent it."""

    nc: Client
    errors: list[str]

    async def refused(self, subject: str, payload: bytes = b"x") -> bool:
        """Publish `subject` and wait for the server's permissions violation for it."""
        self.errors.clear()
        await self.nc.publish(subject, payload)
        await self.nc.flush()
        for _ in range(40):
            # nats-py lower-cases the server's error text, subject included.
            if any(
                f'permissions violation for publish to "{subject.lower()}"' in e.lower() for e in self.errors
            ):
                return True
            await asyncio.sleep(0.05)
        return False


@contextlib.asynccontextmanager
async def connect_as(sec: Secured, tenant: str, role: str) -> AsyncIterator[Identity]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        sec.url, error_cb=on_error, allow_reconnect=False, **sec.auth(tenant, role).connect_options()
    )
    try:
        yield Identity(nc, errors)
    finally:
        await nc.close()


async def operator_topology(sec: Secured, tenant: str) -> None:
    """The operator creates the tenant's topology once; every other role only looks it up."""
    rt = await Runtime.connect(sec.url, auth=sec.auth(tenant, "operator"))
    await rt.close()
