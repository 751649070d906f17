"""The `plexus` command line: `plexus worker`, `plexus dev`, `plexus types`.

Services add subcommands through the ``plexus.commands`` entry-point group (a callable taking the
argparse subparsers object), so this module never imports a service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

from plexus.core import PermissionDeniedError

from ._app import App
from ._dev import run_dev
from .client._client import Runtime
from .ops._allocator import ALLOCATORS, AllocatorError, allocator_in_use, use_allocator
from .ops._arguments import nats_url, port_number, positive_int, positive_seconds
from .ops._auth import NatsAuthError
from .ops._first_connect import NatsUnreachableError
from .ops._health import HealthServer
from .ops._logging import LOG_FORMATS, LOG_LEVELS, LogSettings, configure_logging
from .ops._security import add_security_command
from .ops._settings import NatsSettings, SettingsError, WorkerSettings, env_help, load_settings
from .ops._telemetry import configure_telemetry
from .ops._version import installed_version
from .store._consumer_records import delete_unrecorded
from .worker._config import WorkerConfig
from .worker._worker import Worker

__all__ = ["CliError", "ConnectionLostError", "load_object", "main", "until_stopped"]

log = logging.getLogger("plexus.cli")


class CliError(Exception):
    """Bad command-line input; printed as one line and exit status 2."""


def load_object(spec: str) -> Any:
    """Resolve ``module:attribute`` (e.g. ``examples.pipeline:app``) with an error that says what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"expected 'module:attribute', got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import module {module_name!r}: {exc}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _nats_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats",
        type=nats_url,
        action="append",
        default=None,
        help="server URL (repeat for every seed of a cluster); default $PLEXUS_NATS or nats://127.0.0.1:4222",
    )


def _servers(args: argparse.Namespace) -> list[str]:
    urls: list[str] = args.nats or load_settings(NatsSettings).nats
    return urls


#: `plexus worker` flags that default to the WorkerSettings field of the same name.
_WORKER_SETTINGS = (
    "concurrency",
    "replicas",
    "ack_wait",
    "lease_ttl",
    "heartbeat_ttl",
    "worker_id",
    "health_port",
    "allocator",
)


def _apply_settings(args: argparse.Namespace, settings: WorkerSettings) -> None:
    for name in _WORKER_SETTINGS:
        if getattr(args, name, None) is None:
            setattr(args, name, getattr(settings, name))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plexus", description="Plexus: a distributed actor kernel for AI agents."
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log everything (third-party loggers too) at DEBUG"
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=None,
        help="level of the plexus.* loggers (default $PLEXUS_LOG_LEVEL or INFO; others log at WARNING)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help="text, or json: one JSON object a line (default $PLEXUS_LOG_FORMAT or text)",
    )
    parser.add_argument(
        "--version", action="version", version=f"plexus {installed_version() or '(source tree, no metadata)'}"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser(
        "worker",
        help="serve an App's agent types",
        epilog=env_help(WorkerSettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("app", help="module:attribute of a plexus.runtime.App")
    worker.add_argument(
        "--concurrency", type=positive_int, default=None, help="handlers running at once (default 64)"
    )
    _nats_option(worker)
    worker.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="create/reconcile Plexus streams and buckets with this many replicas (3 on a 3-node cluster); "
        "default: create R1, leave existing ones as they are",
    )
    worker.add_argument(
        "--ack-wait", type=positive_seconds, default=None, help="seconds before JetStream redelivers"
    )
    worker.add_argument(
        "--lease-ttl", type=positive_seconds, default=None, help="partition lease TTL in seconds"
    )
    worker.add_argument(
        "--heartbeat-ttl",
        type=positive_seconds,
        default=None,
        help="seconds without heartbeats before a worker is dead",
    )
    worker.add_argument(
        "--worker-id", default=None, help="this worker's id (default: host name, pid and a unique part)"
    )
    worker.add_argument(
        "--health-port",
        type=port_number,
        default=None,
        help="serve /healthz and /readyz on this port (0: any)",
    )
    worker.add_argument(
        "--allocator",
        choices=ALLOCATORS,
        default=None,
        help="jemalloc: restart on jemalloc, which gives memory back after a burst of activations is "
        "passivated (CPython's allocator keeps most of it); default: as started",
    )

    topology = sub.add_parser(
        "topology", help="create or reconcile Plexus's streams and buckets (an operator's one-off job)"
    )
    _nats_option(topology)
    topology.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="stream and bucket replicas (3 on a 3-node cluster); default: what the topology has (1 if new)",
    )
    topology.add_argument(
        "--lease-ttl",
        type=positive_seconds,
        default=None,
        help="partition lease TTL in seconds (workers adopt it); default: the bucket's (10 if new)",
    )
    topology.add_argument(
        "--heartbeat-ttl",
        type=positive_seconds,
        default=None,
        help="seconds without heartbeats before a worker is dead; default: the bucket's (10 if new)",
    )

    probe = sub.add_parser("probe", help="GET a health URL; exit 0 on 2xx (container health checks)")
    probe.add_argument("url", help="e.g. http://localhost:8480/readyz")
    probe.add_argument("--timeout", type=positive_seconds, default=3.0)

    dev = sub.add_parser(
        "dev",
        help="everything on this machine: an embedded nats-server, worker(s) and the installed services "
        "(the orchestrator, the gateway with its dashboard); an optional script; Ctrl-C stops all",
    )
    dev.add_argument("app", help="module:attribute of a plexus.runtime.App")
    dev.add_argument(
        "--run",
        default=None,
        help="module:attribute of `async def main(rt: Runtime)` to run; then keeps serving (see --once)",
    )
    dev.add_argument(
        "--once", action="store_true", help="with --run: stop everything when the script ends (CI, demos)"
    )
    dev.add_argument("--workers", type=positive_int, default=1, help="worker processes (default 1)")
    dev.add_argument(
        "--concurrency", type=positive_int, default=64, help="handlers at once per worker (default 64)"
    )
    dev.add_argument(
        "--gateway-port",
        type=port_number,
        default=None,
        help="the dashboard's port (default $PLEXUS_GATEWAY_PORT or 8470; if taken, a free one: URL printed)",
    )
    dev.add_argument(
        "--keep", action="store_true", help="keep the JetStream store on exit (default: removed)"
    )

    types = sub.add_parser("types", help="list agent types, capabilities and live workers")
    _nats_option(types)

    add_security_command(sub)

    for ep in entry_points(group="plexus.commands"):
        with contextlib.suppress(Exception):  # a broken plugin must not break the core commands
            ep.load()(sub)
    return parser


async def _serve(app: App, args: argparse.Namespace) -> None:
    telemetry = configure_telemetry("plexus-worker")
    try:
        await _serve_worker(app, args)
    finally:
        telemetry.shutdown()


async def _serve_worker(app: App, args: argparse.Namespace) -> None:
    connecting = Runtime.connect(
        _servers(args),
        namespace=app.namespace,
        lease_ttl_s=args.lease_ttl,
        heartbeat_ttl_s=args.heartbeat_ttl,
        replicas=args.replicas,
        connect_wait_s=None,  # a worker may start before its server (a container); Ctrl-C still stops it
    )
    rt = await _topology_refusal_is_one_line(connecting, args.replicas)
    worker = Worker(
        app,
        rt,
        WorkerConfig(
            concurrency=args.concurrency,
            ack_wait_s=args.ack_wait,
            lease_ttl_s=args.lease_ttl,
            # Beat at least three times per TTL so one lost beat does not make a live worker look dead.
            heartbeat_s=min(2.0, args.heartbeat_ttl / 3),
            worker_id=args.worker_id,
        ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lost = ConnectionLostError(
        "the NATS connection was closed for good; exiting so a supervisor can restart us"
    )
    try:
        await worker.start()
    except PermissionDeniedError:
        raise  # the identity's permissions, not the connection: nothing to wait for
    except Exception:
        # nats-py closes a connection in a task of its own after the error that dooms it, so a request
        # that failed meanwhile may be seen first: give the close time to show before deciding (the close
        # drains the socket first; on a loaded host that took over 2 s once, and the worker then died with
        # a bare traceback instead of saying why).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rt.connection_closed.wait(), 10.0)
        if rt.nc.is_closed or rt.connection_closed.is_set():
            raise lost from None
        raise
    stopping = False
    health = None
    if args.health_port is not None:
        health = HealthServer(
            lambda: {"nats": rt.nc.is_connected, "serving": not stopping},
            alive=lambda: not rt.nc.is_closed,
            host=load_settings(WorkerSettings).health_host,
            port=args.health_port,
        )
        await health.start()
    print(
        f"plexus worker {worker.worker_id} serving {', '.join(app.types)} on {', '.join(_servers(args))}"
        + (f"; health on port {health.port}" if health else "")
        + ("; allocator jemalloc" if allocator_in_use() == "jemalloc" else ""),
        flush=True,
    )
    try:
        if not await until_stopped(stop, rt):
            # Nothing can be finished or released without a connection; unacked work goes to the next owner.
            raise lost
        stopping = True  # not ready: a load balancer or probe stops counting on us while we drain
        print("plexus worker: stopping (finishing in-flight work)", flush=True)
        await worker.stop()
        await rt.close()
    finally:
        if health is not None:
            await health.stop()


class ConnectionLostError(CliError):
    """The process's NATS connection is gone for good (exit status 1)."""


async def until_stopped(stop: asyncio.Event, rt: Runtime) -> bool:
    """Wait for `stop` (True) or for the runtime's connection to close for good (False).

    nats-py gives up a connection for good after some server errors even with unlimited reconnects; a
    process that went on would linger unregistered, serving nothing. Long-lived processes exit instead."""
    waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(rt.connection_closed.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
    return stop.is_set() or not rt.connection_closed.is_set()


async def _types(args: argparse.Namespace) -> None:
    rt = await Runtime.connect(_servers(args))
    try:
        for info in await rt.agent_types():
            workers = await rt.workers(info.type, info.namespace)
            caps = ", ".join(info.capabilities) or "-"
            mode = "durable" if info.durable else "ephemeral"
            print(f"{info.namespace}/{info.type}\t{mode}\tcapabilities: {caps}\tworkers: {len(workers)}")
    finally:
        await rt.close()


async def _topology_refusal_is_one_line(connecting: Awaitable[Runtime], replicas: int | None) -> Runtime:
    """`connecting`'s runtime; the server's refusal of the topology (more replicas than nodes, a conflicting
    setting) as a `CliError` rather than a traceback. Connection, credential and permission errors pass."""
    try:
        return await connecting
    except (OSError, TimeoutError, NatsAuthError, PermissionDeniedError):
        raise
    except Exception as exc:
        at = f" with {replicas} replica(s)" if replicas is not None else ""
        raise CliError(f"cannot create the topology{at}: {exc}") from None


async def _operator_connect(args: argparse.Namespace) -> tuple[Runtime, int]:
    """Connect as the operator, reconciling the topology; returns the runtime and the replicas it asked for.

    What the flags leave out is what the topology has: a bare ``plexus topology`` (the upgrade step the docs
    give) must not scale an R3 cluster down to R1 or reset its TTLs. So a first connection adopts what
    exists (creating what is missing), and the second reconciles everything to the replicas found (the
    most any stream has, so objects an upgrade adds are raised to it) and the TTLs the buckets have."""
    servers = _servers(args)
    replicas, lease_ttl, heartbeat_ttl = args.replicas, args.lease_ttl, args.heartbeat_ttl
    if None in (replicas, lease_ttl, heartbeat_ttl):
        found = await _topology_refusal_is_one_line(Runtime.connect(servers), None)
        try:
            topology = found.topology
            most = max((info.config.num_replicas or 1 for info in topology.streams.values()), default=1)
        finally:
            await found.close()
        replicas = most if replicas is None else replicas
        lease_ttl = topology.leases_ttl_s if lease_ttl is None else lease_ttl
        heartbeat_ttl = topology.workers_ttl_s if heartbeat_ttl is None else heartbeat_ttl
    connecting = Runtime.connect(
        servers, replicas=replicas, lease_ttl_s=lease_ttl, heartbeat_ttl_s=heartbeat_ttl
    )
    return await _topology_refusal_is_one_line(connecting, replicas), replicas


async def _topology(args: argparse.Namespace) -> None:
    rt, replicas = await _operator_connect(args)
    try:
        # Partition consumers no record names (made before `plexus_consumers` existed: an upgrade) would
        # keep every new owner of their partition from creating its own; only the operator may list them.
        inbox = rt.topology.names.inbox_stream
        for name in await delete_unrecorded(rt.nc, rt.js, rt.topology.consumers, inbox, rt.prefix):
            print(f"deleted {name} on {inbox}: no record in {rt.topology.names.consumers_bucket} names it")
        for name, info in sorted(rt.topology.streams.items()):
            print(f"{name}\treplicas {info.config.num_replicas}\tmessages {info.state.messages}")
        print(
            f"topology ready on {', '.join(_servers(args))} with {replicas} replica(s), lease TTL"
            f" {rt.topology.leases_ttl_s:g}s, heartbeat TTL {rt.topology.workers_ttl_s:g}s"
        )
    finally:
        await rt.close()


def _probe(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(args.url, timeout=args.timeout) as resp:
            print(resp.read().decode(errors="replace"))
            return 0
    except urllib.error.HTTPError as exc:
        print(exc.read().decode(errors="replace"))
    except (OSError, ValueError) as exc:
        print(f"plexus probe: {args.url}: {exc}", file=sys.stderr)
    return 1


async def _dev(args: argparse.Namespace) -> int:
    if args.once and not args.run:
        raise CliError("--once stops plexus dev when its --run script ends: give --run too")
    app = load_object(args.app)
    if not isinstance(app, App):
        raise CliError(f"{args.app} is a {type(app).__name__}, not a plexus.runtime.App")
    script: Callable[[Runtime], Awaitable[Any]] | None = load_object(args.run) if args.run else None
    return await run_dev(
        app,
        args.app,
        script,
        workers=args.workers,
        concurrency=args.concurrency,
        once=args.once,
        gateway_port=args.gateway_port,
        keep=args.keep,
    )


def _choose_allocator(name: str, library: str | None, *, own_command_line: bool) -> None:
    if name != "jemalloc" or allocator_in_use() == "jemalloc":
        return
    if not own_command_line:
        # main() called with an argv from a program: re-executing would replace that program.
        raise CliError(
            "--allocator jemalloc restarts the process, so it is only for the `plexus` command itself"
        )
    use_allocator("jemalloc", library=library)


#: Subcommands other distributions register (entry points ``plexus.commands``), by the one providing them.
_PROVIDED_BY = {"orchestrator": "orchestrator"} | dict.fromkeys(
    ("gateway", "runs", "agents", "sessions", "schedules", "tokens", "mcp"), "gateway"
)


def _not_installed(argv: Sequence[str]) -> str | None:
    """The distribution to install when `argv` names a subcommand of one that is not (argparse would only
    say "invalid choice")."""
    words = [word for word in argv if not word.startswith("-")]
    provider = _PROVIDED_BY.get(words[0]) if words else None
    if provider is None or words[0] in {ep.name for ep in entry_points(group="plexus.commands")}:
        return None
    return f"plexus-kernel-{provider}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if missing := _not_installed(sys.argv[1:] if argv is None else argv):
        print(f"plexus: error: this command comes with {missing} (pip install {missing})", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        logs = load_settings(LogSettings)
    except SettingsError as exc:
        print(f"plexus: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level or logs.log_level, args.log_format or logs.log_format, args.verbose)
    try:
        if args.command == "worker":
            settings = load_settings(WorkerSettings)
            _apply_settings(args, settings)
            # First: a re-exec onto jemalloc repeats everything before it (the app's import included).
            _choose_allocator(args.allocator, settings.allocator_library, own_command_line=argv is None)
            app = load_object(args.app)
            if not isinstance(app, App):
                raise CliError(f"{args.app} is a {type(app).__name__}, not a plexus.runtime.App")
            asyncio.run(_serve(app, args))
        elif args.command == "dev":
            return asyncio.run(_dev(args))
        elif args.command == "types":
            asyncio.run(_types(args))
        elif args.command == "topology":
            asyncio.run(_topology(args))
        elif args.command == "probe":
            return _probe(args)
        else:
            handler = getattr(args, "handler", None)
            if handler is None:
                parser.error(f"unknown command {args.command!r}")
            return int(handler(args) or 0)
    except (ConnectionLostError, NatsUnreachableError) as exc:
        print(f"plexus: error: {exc}", file=sys.stderr)
        return 1
    except PermissionDeniedError as exc:
        print(f"plexus: error: PermissionDeniedError: {exc}", file=sys.stderr)
        return 1
    except (AllocatorError, CliError, NatsAuthError, SettingsError) as exc:
        print(f"plexus: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
