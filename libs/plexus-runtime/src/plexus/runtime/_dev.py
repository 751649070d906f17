"""`plexus dev`: the whole system on one machine for development — an embedded nats-server, worker processes,
and every installed service (``plexus.dev`` entry points: the orchestrator, the gateway), stopped together."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from plexus.core import KernelError

from ._app import App
from .client._client import Runtime
from .ops._arguments import port_number
from .ops._lines import whole_lines
from .ops._server import NatsServer
from .ops._settings import SettingsError

__all__ = ["run_dev"]

#: How long `plexus dev` waits for its services (orchestrator, gateway) to serve before it runs the script.
SERVICES_READY_S = 60.0
#: The dashboard's port when neither --gateway-port nor $PLEXUS_GATEWAY_PORT names one.
DEFAULT_GATEWAY_PORT = 8470


def _plexus_process(argv: list[str], *, relayed: bool = False) -> subprocess.Popen[bytes]:
    """``plexus <argv>`` in a child process that imports what this one can (the working directory first);
    ``relayed``: its output comes through a pipe (see `_relay`), not straight to the terminal."""
    cmd = [sys.executable, "-m", "plexus.runtime.cli", *argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    if not relayed:
        return subprocess.Popen(cmd, env=env)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


#: The services a full `plexus dev` starts, and what is missing without each.
_SERVICES = {
    "orchestrator": "orchestrated runs, their budgets and retries",
    "gateway": "the dashboard, the HTTP API and `plexus runs`",
}


def _installed_services(url: str) -> list[tuple[str, list[str]]]:
    """The long-running services `plexus dev` starts, from the ``plexus.dev`` entry points: each names a
    function ``(nats_url) -> argv`` for its ``plexus`` subcommand in local dev mode (e.g. the orchestrator;
    the gateway with ``--dev``). One-shot commands (``runs``, ``agents``...) are not services."""
    services = []
    for ep in sorted(entry_points(group="plexus.dev"), key=lambda ep: ep.name):
        try:
            services.append((ep.name, [str(a) for a in ep.load()(url)]))
        except Exception as exc:  # a broken plugin must not stop the others
            print(f"plexus dev: skipping {ep.name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    for name, what in _SERVICES.items():
        if name not in {found for found, _ in services}:  # say so: a run needing it fails much later
            print(
                f"plexus dev: no {name} ({what}): pip install plexus-kernel-{name}",
                file=sys.stderr,
                flush=True,
            )
    return services


def _relay(name: str, proc: subprocess.Popen[bytes]) -> threading.Event:
    """Copy a service's output to ours line by line; the event is set once it announces that it is serving
    (``plexus <name> ... serving ...``), or when its output ends."""
    ready = threading.Event()

    def copy() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.startswith(f"plexus {name}") and " serving " in line:
                ready.set()
        # Its output ended: it has exited (or is exiting); reaped first, so whoever wakes up sees its status.
        proc.wait()
        ready.set()

    threading.Thread(target=copy, name=f"plexus-dev-{name}", daemon=True).start()
    return ready


async def _until_hosted(rt: Runtime, app: App) -> None:
    """Wait until a worker hosts each of the app's types: a script's first send or run to a type the
    registry has not seen yet would fail at once (a worker that is still starting has not registered it)."""
    for name in app.types:
        try:
            await rt.get(name, lazy=False, timeout=SERVICES_READY_S)
        except KernelError:
            print(f"plexus dev: no worker hosts {name} after {SERVICES_READY_S:.0f} s; going on", flush=True)
            return


def _wait_ready(services: dict[str, threading.Event], timeout_s: float) -> list[str]:
    """The services that did not announce themselves within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for ready in services.values():
        ready.wait(max(0.0, deadline - time.monotonic()))
    return [name for name, ready in services.items() if not ready.is_set()]


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _choose_gateway_port(requested: int | None) -> None:
    """Settle the gateway's port for the services started next (they read $PLEXUS_GATEWAY_PORT): the one
    asked for, or a free one when it is taken: a busy 8470 never leaves `plexus dev` without a dashboard."""
    if requested is None:
        try:
            requested = port_number(os.environ.get("PLEXUS_GATEWAY_PORT", str(DEFAULT_GATEWAY_PORT)))
        except argparse.ArgumentTypeError as exc:
            raise SettingsError(f"PLEXUS_GATEWAY_PORT: {exc}") from None
    if requested and _port_taken(requested):
        print(
            f"plexus dev: port {requested} is taken; the gateway takes a free port (its URL follows)",
            flush=True,
        )
        requested = 0
    os.environ["PLEXUS_GATEWAY_PORT"] = str(requested)


def _exited(procs: dict[str, subprocess.Popen[bytes]]) -> tuple[str, int] | None:
    """The first part that is no longer running, with its exit status."""
    for name, proc in procs.items():
        code = proc.poll()
        if code is not None:
            return name, code
    return None


async def _until_stop_or_exit(
    stop: asyncio.Event, procs: dict[str, subprocess.Popen[bytes]]
) -> tuple[str, int] | None:
    while not stop.is_set():
        gone = _exited(procs)
        if gone is not None:
            return gone
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return None


@whole_lines()  # the services' relayed lines and the script's prints do not mix
async def run_dev(
    app: App,
    app_spec: str,
    script: Callable[[Runtime], Awaitable[Any]] | None,
    *,
    workers: int,
    concurrency: int,
    once: bool,
    gateway_port: int | None = None,
    keep: bool = False,
) -> int:
    """An embedded nats-server, ``workers`` worker processes serving ``app_spec`` and the installed
    services; ``script`` runs once they serve; then all serve until SIGINT/SIGTERM (``once``: until the
    script ends). Returns the exit status: 1 when a part fails to start or dies while serving."""
    store = Path(tempfile.mkdtemp(prefix="plexus-dev-"))
    server = NatsServer(store_dir=store)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    failed: tuple[str, int] | None = None
    try:
        await asyncio.to_thread(server.start)
        print(
            f"plexus dev: nats-server pid {server.pid} at {server.url} (JetStream store {store})", flush=True
        )
        print(
            "plexus dev: development mode - NATS open to every local process (no accounts, users or TLS); "
            "a secured cluster: `plexus security init` (docs/security.md)",
            flush=True,
        )
        _choose_gateway_port(gateway_port)
        worker = ["worker", app_spec, "--nats", server.url, "--concurrency", str(concurrency)]
        for i in range(workers):
            procs[f"worker {i + 1}"] = _plexus_process(worker)
        print(
            f"plexus dev: {workers} worker(s), pids {', '.join(str(w.pid) for w in procs.values())}",
            flush=True,
        )
        announced: dict[str, threading.Event] = {}
        for name, argv in _installed_services(server.url):
            proc = _plexus_process(argv, relayed=True)
            print(f"plexus dev: {name} pid {proc.pid}", flush=True)
            procs[name] = proc
            announced[name] = _relay(name, proc)
        # The demo starts once the services serve, so the dashboard shows it live and its URL comes first.
        late = await asyncio.to_thread(_wait_ready, announced, SERVICES_READY_S)
        failed = _exited(procs)
        if failed is None and late:
            print(
                f"plexus dev: {', '.join(late)} not serving after {SERVICES_READY_S:.0f} s; going on",
                flush=True,
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if failed is None and script is not None:
            rt = await Runtime.connect(server.url, namespace=app.namespace)
            try:
                await _until_hosted(rt, app)
                await script(rt)
            finally:
                await rt.close()
        if failed is None and (script is None or not once):
            print(
                f"plexus dev: serving on {server.url}; `plexus runs ls --nats {server.url}` lists the runs;"
                " Ctrl-C stops everything",
                flush=True,
            )
            failed = await _until_stop_or_exit(stop, procs)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
        await asyncio.to_thread(server.stop)
        if keep:
            print(f"plexus dev: the JetStream store is kept in {store} (--keep)", flush=True)
        else:
            await asyncio.to_thread(shutil.rmtree, store, True)
    if failed is not None:
        name, code = failed
        print(
            f"plexus dev: error: the {name} exited with status {code} (its output is above); all stopped",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print("plexus dev: stopped", flush=True)
    return 0
