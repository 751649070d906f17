"""The processes of a chaos run and the faults done to them (kill -9 and restart of a worker, an
orchestrator or a NATS node, the inbox stream's leader included; SIGSTOP of a worker past its lease; a
host cut off from the network past the lease TTL and reconnected).

Run as root, every process gets its own host (a network namespace on one bridge, `deploy.local.netns`):
NATS nodes, workers and orchestrators talk over the bridge as separate machines would, and `cut_host`
takes a host's link down without stopping its processes. Without root the fleet runs on loopback and
`cut_host` is not drawn."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local.netns import Host, Network

from plexus.runtime import Runtime
from plexus.runtime.kernel import NatsCluster

REPO = Path(__file__).resolve().parents[2]
APP = "tests.chaos.app:app"
LEASE_TTL_S = 10.0
KINDS = ("kill_worker", "kill_orchestrator", "kill_nats_leader", "kill_nats", "stall_worker")
NETNS_KINDS = (*KINDS, "cut_host")


@dataclass
class Fault:
    kind: str
    target: str
    at: float  # time.time() when injected
    healed_at: float = 0.0  # when the process was back (restarted / resumed)
    pid: int = 0  # the stalled process (stall_worker)


@dataclass
class Fleet:
    """3 NATS nodes (R3), `workers` worker processes and `orchestrators` orchestrator processes."""

    workdir: Path
    workers: int = 3
    orchestrators: int = 2
    #: Hosts in network namespaces (None: everything on loopback).
    network: Network | None = None
    cluster: NatsCluster = field(init=False)
    hosts: dict[str, Host] = field(default_factory=dict, init=False)
    worker_procs: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False)
    orch_procs: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False)

    @property
    def kinds(self) -> tuple[str, ...]:
        return NETNS_KINDS if self.network is not None else KINDS

    def start(self) -> None:
        if self.network is not None:
            self.network.up()
            for label in [*(f"n{j}" for j in range(3)), *(f"w{i}" for i in range(self.workers))]:
                self.hosts[label] = self.network.add_host(label)
            for i in range(self.orchestrators):
                self.hosts[f"o{i}"] = self.network.add_host(f"o{i}")
            nodes = [self.hosts[f"n{j}"] for j in range(3)]
            self.cluster = NatsCluster(
                3,
                base_dir=self.workdir / "nats",
                hosts=[h.ip for h in nodes],
                command_prefixes=[h.exec_prefix for h in nodes],
            ).start()
        else:
            self.cluster = NatsCluster(3, base_dir=self.workdir / "nats").start()
        for server in self.cluster.servers:
            server.port = server.client_port or -1  # a restarted node comes back on the seed list's port
        self.worker_procs = [self._worker(i) for i in range(self.workers)]
        self.orch_procs = [self._orchestrator(i) for i in range(self.orchestrators)]

    @property
    def seeds(self) -> list[str]:
        return [arg for url in self.cluster.urls for arg in ("--nats", url)]

    def _spawn(self, args: list[str], log_name: str, host: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PLEXUS_CHAOS_DIR": str(self.workdir)}
        prefix = self.hosts[host].exec_prefix if host in self.hosts else []
        with (self.workdir / log_name).open("ab") as log:
            return subprocess.Popen(
                [*prefix, sys.executable, "-m", "plexus.runtime.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )

    def _worker(self, i: int) -> subprocess.Popen[bytes]:
        args = ["worker", APP, *self.seeds, "--lease-ttl", str(LEASE_TTL_S), "--ack-wait", "10"]
        args += ["--heartbeat-ttl", "6", "--worker-id", f"chaos-w{i}"]
        return self._spawn(args, f"worker{i}.log", f"w{i}")

    def _orchestrator(self, i: int) -> subprocess.Popen[bytes]:
        return self._spawn(["orchestrator", *self.seeds], f"orchestrator{i}.log", f"o{i}")

    async def inject(self, kind: str, rng: random.Random, admin: Runtime) -> Fault:
        """Do one fault and heal it (restart / resume) before returning: faults never overlap, so the
        cluster keeps its quorum."""
        if kind == "kill_worker":
            i = rng.randrange(len(self.worker_procs))
            fault = Fault(kind, f"worker{i}", time.time())
            _kill(self.worker_procs[i])
            await asyncio.sleep(1.0)
            self.worker_procs[i] = self._worker(i)
        elif kind == "kill_orchestrator":
            i = rng.randrange(len(self.orch_procs))
            fault = Fault(kind, f"orchestrator{i}", time.time())
            _kill(self.orch_procs[i])
            await asyncio.sleep(1.0)
            self.orch_procs[i] = self._orchestrator(i)
        elif kind in ("kill_nats", "kill_nats_leader"):
            j = await self._leader(admin) if kind == "kill_nats_leader" else None
            j = rng.randrange(len(self.cluster.servers)) if j is None else j
            server = self.cluster.servers[j]
            fault = Fault(kind, server.server_name or f"n{j}", time.time())
            await asyncio.to_thread(server.kill)
            await asyncio.sleep(3.0)
            await asyncio.to_thread(server.start)
            await asyncio.to_thread(self.cluster._wait_meta_leader, 30.0)
        elif kind == "stall_worker":
            i = rng.randrange(len(self.worker_procs))
            fault = Fault(kind, f"worker{i}", time.time(), pid=self.worker_procs[i].pid)
            os.kill(self.worker_procs[i].pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(LEASE_TTL_S + 2.0)  # past its lease: its partitions move
            finally:
                os.kill(self.worker_procs[i].pid, signal.SIGCONT)
        elif kind == "cut_host" and self.hosts:
            host = self.hosts[rng.choice(sorted(self.hosts))]
            fault = Fault(kind, host.name, time.time())
            await asyncio.to_thread(host.cut)
            try:
                await asyncio.sleep(LEASE_TTL_S + 2.0)  # past its leases: partitions move, Raft re-elects
            finally:
                await asyncio.to_thread(host.heal)
        else:
            raise ValueError(f"unknown fault {kind!r}")
        fault.healed_at = time.time()
        return fault

    async def _leader(self, admin: Runtime) -> int | None:
        """The index of the node leading the inbox stream, if it can be asked now."""
        with contextlib.suppress(Exception):
            info = await admin.js.stream_info(admin.topology.names.inbox_stream)
            leader = info.cluster.leader if info.cluster else None
            for j, server in enumerate(self.cluster.servers):
                if server.server_name == leader:
                    return j
        return None

    def stop(self) -> None:
        for proc in [*self.worker_procs, *self.orch_procs]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            _kill(proc)
        if hasattr(self, "cluster"):
            self.cluster.cleanup()
        if self.network is not None:
            self.network.down()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
