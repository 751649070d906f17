"""A real multi-host Plexus on one machine: three hosts in network namespaces (`netns.Network`), a
3-node JetStream cluster with R3 streams and buckets, two orchestrator replicas, two workers and the
gateway, each process on its host and every one of them talking over the bridge.

Placement (addresses from ``10.77.0.0/24``; the machine itself is ``.1`` on the bridge)::

    h1 10.77.0.10   nats n1   orchestrator o1   worker w1   gateway :8470
    h2 10.77.0.11   nats n2   orchestrator o2   worker w2
    h3 10.77.0.12   nats n3

`up` returns once the gateway answers ``/readyz``; the processes keep running in their own sessions,
their PIDs and logs under the state directory, until `down` stops them (SIGTERM, then SIGKILL) and deletes
the hosts. Needs root (network namespaces).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from deploy.spec import (
    APP,
    GATEWAY_PORT,
    HEALTH_PORT,
    METRICS_PORT,
    NATS_CLIENT_PORT,
    NATS_CLUSTER_PORT,
    SERVICES,
    STREAM_REPLICAS,
)
from plexus.runtime.kernel import NatsCluster

from .netns import Host, Network, netns_available
from .processes import start_time, stop

__all__ = ["APP", "GATEWAY_PORT", "NATS_CLIENT_PORT", "NATS_CLUSTER_PORT", "LocalCluster"]

REPO = Path(__file__).resolve().parents[2]
PLACEMENT = {
    "h1": ("n1", "orchestrator", "worker", "gateway"),
    "h2": ("n2", "orchestrator", "worker"),
    "h3": ("n3",),
}


_SERVICE_ENV = {service.name: service.env for service in SERVICES}
_SERVICE_COMMAND = {service.name: service.command for service in SERVICES}


class ClusterError(RuntimeError):
    """The local cluster could not be brought up (the message says which part and its log's tail)."""


@dataclass
class LocalCluster:
    """`up()` / `down()` of the placement above; `state_dir` keeps stores, logs and ``state.json``."""

    state_dir: Path
    app: str = APP
    network: Network = field(default_factory=lambda: Network("plx", "10.77.0.0/24"))

    @property
    def _state_file(self) -> Path:
        return self.state_dir / "state.json"

    def up(self, timeout_s: float = 90.0) -> dict[str, object]:
        """Start everything; returns the state (URLs, PIDs). An earlier cluster in `state_dir` is stopped
        first."""
        reason = netns_available()
        if reason is not None:
            raise ClusterError(f"the local cluster needs network namespaces: {reason}")
        self.down()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.network.up()
        placed: dict[str, Host] = {label: self.network.add_host(label) for label in PLACEMENT}
        nats_hosts = [placed[h] for h, roles in PLACEMENT.items() if any(r.startswith("n") for r in roles)]
        cluster = NatsCluster(
            len(nats_hosts),
            base_dir=self.state_dir / "nats",
            hosts=[h.ip for h in nats_hosts],
            command_prefixes=[h.exec_prefix for h in nats_hosts],
            client_port=NATS_CLIENT_PORT,
            cluster_port=NATS_CLUSTER_PORT,
        )
        pids: dict[str, int] = {}
        # Each PID's start time (see processes.py) and how each service was started (for `restart`).
        started: dict[str, int | None] = {}
        spawned: dict[str, dict[str, object]] = {}
        state: dict[str, object] = {
            "pids": pids,
            "started": started,
            "spawn": spawned,
            "hosts": {h.name: h.ip for h in placed.values()},
        }
        try:
            cluster.start()
            for i, server in enumerate(cluster.servers):
                assert server.pid is not None
                pids[f"nats-n{i + 1}"] = server.pid
                started[f"nats-n{i + 1}"] = start_time(server.pid)
            seeds = cluster.urls
            state["nats"] = seeds
            self._write(state)
            # The topology is created R3 once, before any service connects with its R1 defaults.
            topology = ["plexus", "topology", "--replicas", str(STREAM_REPLICAS)]
            self._run([*topology, *(a for url in seeds for a in ("--nats", url))], "topology.log")
            health: dict[str, str] = {}
            metrics: dict[str, str] = {}
            state["health"], state["metrics"] = health, metrics
            counts: dict[str, int] = {}
            for label, roles in PLACEMENT.items():
                host = placed[label]
                services = [r for r in roles if not r.startswith("n")]
                for slot, role in enumerate(services):
                    counts[role] = counts.get(role, 0) + 1
                    name = role if role == "gateway" else f"{role}-{role[0]}{counts[role]}"
                    # The settings every deployment uses (deploy/spec.py); processes sharing a host get
                    # the next ports, as containers or pods would not need to.
                    env = {
                        **_SERVICE_ENV[role],
                        "PLEXUS_NATS": ",".join(seeds),
                        "PLEXUS_HEALTH_HOST": host.ip,
                        "PLEXUS_METRICS_HOST": host.ip,
                        "PLEXUS_METRICS_PORT": str(METRICS_PORT + slot),
                    }
                    metrics[name] = f"http://{host.ip}:{METRICS_PORT + slot}/metrics"
                    argv = list(_SERVICE_COMMAND[role])
                    if role == "gateway":
                        argv = [*argv[:2], "--dev", "--host", host.ip, "--port", str(GATEWAY_PORT)]
                        state["dashboard"] = f"http://{host.ip}:{GATEWAY_PORT}/"
                        health[name] = f"http://{host.ip}:{GATEWAY_PORT}/readyz"
                    else:
                        env["PLEXUS_HEALTH_PORT"] = str(HEALTH_PORT + slot)
                        health[name] = f"http://{host.ip}:{HEALTH_PORT + slot}/readyz"
                    if role == "worker":
                        argv = ["plexus", "worker", self.app, "--worker-id", f"w{counts[role]}"]
                    pids[name] = self._spawn(host, argv, f"{name}.log", env)
                    started[name] = start_time(pids[name])
                    spawned[name] = {"netns": host.netns, "host": host.name, "argv": argv, "env": env}
            self._write(state)
            self._wait_ready(str(state["dashboard"]), timeout_s)
            self._wait_healthy(health, timeout_s)
        except BaseException:
            self.down()
            raise
        return state

    def down(self) -> None:
        """Stop every process of the state file (SIGTERM, SIGKILL after 10 s) and delete the hosts."""
        state = self.status()
        stop(_recorded(state or {}))
        self.network.down()
        if self._state_file.exists():
            self._state_file.unlink()
        shutil.rmtree(self.state_dir / "nats", ignore_errors=True)

    def restart(self, name: str) -> int:
        """Stop service ``name`` if it is still the process recorded at `up` (a PID someone else now holds
        is left alone) and start it again as `up` did; returns its new PID."""
        state = self.status()
        if state is None:
            raise ClusterError("no local cluster is up")
        spawned = state.get("spawn") or {}
        assert isinstance(spawned, dict)
        if name not in spawned:
            names = ", ".join(sorted(spawned)) or "none (a state file from before restart existed)"
            raise ClusterError(f"cannot restart {name!r}: the services it can restart are {names}")
        stop({name: _recorded(state)[name]} if name in _recorded(state) else {})
        spec = spawned[name]
        host = Host(str(spec["host"]), str(spec["netns"]), "", "")
        pid = self._spawn(host, [str(a) for a in spec["argv"]], f"{name}.log", dict(spec["env"]))
        pids, started = state.setdefault("pids", {}), state.setdefault("started", {})
        assert isinstance(pids, dict)
        assert isinstance(started, dict)
        pids[name], started[name] = pid, start_time(pid)
        self._write(state)
        return pid

    def status(self) -> dict[str, object] | None:
        """The state of a cluster that is up (None if there is none)."""
        if not self._state_file.exists():
            return None
        state: dict[str, object] = json.loads(self._state_file.read_text())
        return state

    # -- helpers ------------------------------------------------------------------------------------
    def _write(self, state: dict[str, object]) -> None:
        self._state_file.write_text(json.dumps(state, indent=2) + "\n")

    def _env(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)  # the venv's `plexus` command
        return {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}

    def _spawn(self, host: Host, argv: list[str], log_name: str, env: dict[str, str]) -> int:
        with (self.state_dir / log_name).open("ab") as log:
            proc = host.popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self._env(), **env},
                cwd=REPO,
                start_new_session=True,
            )
        return proc.pid

    def _wait_healthy(self, urls: dict[str, str], timeout_s: float) -> None:
        """Every process's /readyz answers 200 (the probes a container platform would use)."""
        deadline = time.monotonic() + timeout_s
        waiting = dict(urls)
        while waiting and time.monotonic() < deadline:
            for name, url in list(waiting.items()):
                with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        del waiting[name]
            time.sleep(0.3)
        if waiting:
            name = sorted(waiting)[0]
            raise ClusterError(
                f"{name} was not ready within {timeout_s}s: {_tail(self.state_dir / f'{name}.log')}"
            )

    def _run(self, argv: list[str], log_name: str) -> None:
        with (self.state_dir / log_name).open("ab") as log:
            done = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self._env(), cwd=REPO, check=False
            )
        if done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {_tail(self.state_dir / log_name)}")

    def _wait_ready(self, dashboard: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = ""
        workers = {f"w{i + 1}" for i in range(sum("worker" in roles for roles in PLACEMENT.values()))}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{dashboard}readyz", timeout=2) as resp:
                    ready = resp.status == 200
                # Ready means serving: the gateway answers and every worker has registered its types.
                with urllib.request.urlopen(f"{dashboard}v1/agents", timeout=2) as resp:
                    agents = json.loads(resp.read())
                if ready and agents and all(set(a["workers"]) == workers for a in agents):
                    return
                last = f"workers so far: {[a['workers'] for a in agents]}"
            except (OSError, ValueError, KeyError, TypeError) as exc:
                last = str(exc)
            time.sleep(0.5)
        raise ClusterError(
            f"the gateway was not ready within {timeout_s}s ({last}): {_tail(self.state_dir / 'gateway.log')}"
        )


def _recorded(state: dict[str, object]) -> dict[str, tuple[int, int | None]]:
    """name -> (PID, start time) of a state file (no start time: a file written before they were recorded)."""
    pids = state.get("pids") or {}
    started = state.get("started") or {}
    assert isinstance(pids, dict)
    assert isinstance(started, dict)
    return {name: (int(pid), started.get(name)) for name, pid in pids.items()}


def _tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
