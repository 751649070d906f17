"""``plexus gateway`` and ``plexus runs`` (registered through the ``plexus.commands`` entry-point group)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

from pydantic import Field, ValidationError

from plexus.core import KernelError
from plexus.runtime import Runtime
from plexus.runtime.kernel import (
    NatsAuthError,
    NatsSettings,
    SettingsError,
    configure_telemetry,
    env_help,
    load_settings,
    nats_url,
    port_number,
    positive_int,
    raise_on_denial,
)
from plexus.runtime.orchestration import RunStatus

from . import _cli_more as more
from . import _cli_timetravel as timetravel_cli
from ._cli_fork import add_fork
from ._cli_fork import fork as fork_run
from ._cli_schedules import register_schedules as _register_schedules
from ._cli_tokens import register_tokens as _register_tokens
from ._config import GatewayConfig, hash_token
from ._runs import RunFilter, RunsView
from ._terminal import render_tree, watch_tree

__all__ = [
    "dev_command",
    "register_agents",
    "register_gateway",
    "register_runs",
    "register_schedules",
    "register_sessions",
    "register_tokens",
]


def _nats_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats",
        type=nats_url,
        action="append",
        default=None,
        help="server URL (repeat for a cluster); default $PLEXUS_NATS or nats://127.0.0.1:4222",
    )


class GatewaySettings(NatsSettings):
    """``plexus gateway``'s environment (flags of the same name win)."""

    gateway_port: int = Field(default=8470, ge=0, le=65535, description="HTTP port (0: any free port)")
    gateway_host: str = Field(default="127.0.0.1", description="HTTP address (0.0.0.0 in a container)")
    gateway_token_hashes: str = Field(
        default="", description="accepted bearer tokens as sha256:<hex>, comma-separated"
    )
    gateway_a2a_types: str = Field(
        default="", description="agent types served over A2A at /a2a/<type>, comma-separated (default none)"
    )


def _urls(args: argparse.Namespace) -> list[str]:
    return list(args.nats or load_settings(NatsSettings).nats)


# -- plexus gateway ---------------------------------------------------------------------------------------
def dev_command(nats_url: str) -> list[str]:
    """`plexus dev`'s argv for a local, open gateway (entry point group ``plexus.dev``); the port is
    $PLEXUS_GATEWAY_PORT (default 8470; 0 picks a free one). It prints its dashboard URL itself."""
    port = os.environ.get("PLEXUS_GATEWAY_PORT", "8470")
    return ["gateway", "--dev", "--nats", nats_url, "--port", port]


def register_gateway(sub: Any) -> None:
    parser = sub.add_parser(
        "gateway",
        help="serve the HTTP + SSE API and the dashboard",
        epilog=env_help(GatewaySettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _nats_arg(parser)
    parser.add_argument("--host", default=None, help="HTTP address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=port_number, default=None, help="HTTP port (default 8470; 0: a free one)"
    )
    parser.add_argument(
        "--token-hash",
        action="append",
        default=None,
        help="an accepted bearer token as sha256:<hex> (repeatable; also $PLEXUS_GATEWAY_TOKEN_HASHES, comma-"
        "separated). `plexus gateway --hash-token TOKEN` prints the hash of a token.",
    )
    parser.add_argument("--hash-token", default=None, help="print the at-rest hash of TOKEN and exit")
    parser.add_argument(
        "--dev", action="store_true", help="no authentication (loudly announced; local use only)"
    )
    parser.add_argument("--max-body", type=positive_int, default=1 << 20, help="request body limit in bytes")
    parser.add_argument("--heartbeat", type=float, default=15.0, help="SSE heartbeat comment period, seconds")
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=50.0,
        help="requests per second per caller, bursts of twice that (0: no limit; default 50)",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        help="allow browser calls from this origin (repeatable); default: no CORS headers at all",
    )
    parser.add_argument(
        "--a2a-type",
        action="append",
        default=None,
        help="serve this agent type over A2A at /a2a/TYPE (repeatable; also $PLEXUS_GATEWAY_A2A_TYPES, "
        "comma-separated); default: none (docs/interop.md)",
    )
    parser.set_defaults(handler=_run_gateway)


def _run_gateway(args: argparse.Namespace) -> int:
    if args.hash_token is not None:
        print(hash_token(args.hash_token))
        return 0
    try:
        settings = load_settings(GatewaySettings)
    except SettingsError as exc:
        print(f"plexus gateway: error: {exc}", file=sys.stderr)
        return 2
    hashes = list(args.token_hash or [])
    hashes += [h.strip() for h in settings.gateway_token_hashes.split(",") if h.strip()]
    try:
        config = GatewayConfig(
            token_hashes=frozenset(hashes),
            dev=args.dev,
            max_body_bytes=args.max_body,
            heartbeat_s=args.heartbeat,
            rate_limit=args.rate_limit,
            cors_origins=tuple(args.cors_origin or ()),
            a2a_types=tuple(
                sorted(
                    {*(args.a2a_type or ()), *(t.strip() for t in settings.gateway_a2a_types.split(","))}
                    - {""}
                )
            ),
        )
    except ValueError as exc:
        print(f"plexus gateway: error: {exc}", file=sys.stderr)
        return 2
    if not config.dev and not config.token_hashes:
        # Closed, not open: only tokens of the tenant's bucket are accepted, and there may be none yet.
        print(
            "plexus gateway: no --token-hash given: accepting only tokens made with `plexus tokens create`"
            " (--dev for an open local gateway)",
            file=sys.stderr,
            flush=True,
        )
    host = args.host if args.host is not None else settings.gateway_host
    port = args.port if args.port is not None else settings.gateway_port
    return asyncio.run(_serve_gateway(list(args.nats or settings.nats), config, host, port))


async def _serve_gateway(urls: list[str], config: GatewayConfig, host: str, port: int) -> int:
    from ._server import Gateway  # the web stack, imported by the one command that serves (see __init__)

    configure_telemetry("plexus-gateway")
    # A service waits for its server as long as it takes (a container may start first); until it is up,
    # SIGTERM and Ctrl-C keep their default effect (the process ends) instead of setting `stop`.
    rt = await Runtime.connect(urls, name="plexus-gateway", connect_wait_s=None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gateway = Gateway(rt, config, host=host, port=port)
    try:
        await gateway.start()
    except OSError as exc:
        await rt.close()
        print(
            f"plexus gateway: error: cannot listen on {host}:{port}: {exc.strerror or exc}"
            " (--port or $PLEXUS_GATEWAY_PORT; 0 picks a free port)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if config.dev:
        print(
            "plexus gateway: WARNING: --dev: authentication is OFF; anyone who can reach"
            f" {gateway.url} can start and cancel runs",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"plexus gateway serving {gateway.url} (dashboard at {gateway.url}/) on {', '.join(urls)}", flush=True
    )
    waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(rt.connection_closed.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
    await gateway.stop()
    closed = rt.connection_closed.is_set() and not stop.is_set()
    await rt.close()
    if closed:
        print("plexus gateway: error: the NATS connection was closed for good", file=sys.stderr, flush=True)
        return 1
    return 0


# -- plexus runs ------------------------------------------------------------------------------------------
def register_runs(sub: Any) -> None:
    parser = sub.add_parser(
        "runs", help="start, list, show, watch, cancel, approve, fork, export and replay run trees"
    )
    verbs = parser.add_subparsers(dest="runs_command", required=True)
    ls = verbs.add_parser("ls", help="runs, newest first")
    ls.add_argument(
        "--status",
        action="append",
        default=None,
        choices=[str(s) for s in RunStatus],
        help="repeat for several",
    )
    ls.add_argument("--agent-type", default=None)
    ls.add_argument("--all", action="store_true", help="children too, not only roots")
    ls.add_argument("--limit", type=positive_int, default=20, help="at most this many (default 20)")
    show = verbs.add_parser("show", help="one run tree")
    show.add_argument("run_id")
    watch = verbs.add_parser("watch", help="follow a run tree live until it ends")
    watch.add_argument("run_id")
    cancel = verbs.add_parser("cancel", help="cancel a run tree")
    cancel.add_argument("run_id")
    cancel.add_argument("--reason", default="cancelled from the command line")
    start = more.add_start(verbs)
    approve = more.add_approve(verbs)
    fork = add_fork(verbs)
    for verb in (ls, show, watch, cancel, start, approve, fork):
        _nats_arg(verb)
        verb.add_argument("--json", action="store_true", help="machine-readable output")
    for verb in timetravel_cli.add_verbs(verbs):
        _nats_arg(verb)
    parser.set_defaults(handler=_run_runs)


def _run_runs(args: argparse.Namespace) -> int:
    if args.runs_command in ("export", "replay"):
        return _guarded("runs", timetravel_cli.run(args, _urls(args)))
    return _guarded("runs", _runs(args))


def _guarded(command: str, work: Any) -> int:
    """Run `work`; a typed kernel error or invalid input is a one-line error (status 1), not a traceback. A
    permission the identity lacks ends it at once (`PermissionDeniedError`), not after a request's timeout."""
    try:
        return int(asyncio.run(raise_on_denial(work)))
    except BrokenPipeError:
        # The reader went away (`plexus runs watch --json | head -1`): that ends the command, quietly. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (NatsAuthError, SettingsError):
        raise  # the process's configuration, as for every command: `plexus` says so and exits 2
    except (KernelError, ValidationError, ValueError) as exc:
        name = getattr(exc, "error_type", type(exc).__name__)
        print(f"plexus {command}: error: {name}: {exc}", file=sys.stderr)
        return 1


async def _runs(args: argparse.Namespace) -> int:
    rt = await Runtime.connect(_urls(args), name="plexus-runs")
    try:
        view = RunsView(rt)
        if args.runs_command == "start":
            run_id = await more.start(rt, args)
            print(json.dumps({"run_id": run_id}) if args.json else run_id, flush=True)
            if not args.watch:
                return 0
            return await watch_tree(rt, await view.record(run_id) or {"run_id": run_id}, as_json=args.json)
        if args.runs_command == "approve":
            return await more.approve(rt, args)
        if args.runs_command == "fork":
            return await fork_run(rt, args)
        if args.runs_command == "ls":
            flt = RunFilter(frozenset(args.status or []), args.agent_type, None, not args.all)
            page, _ = await view.page(flt, args.limit, None)
            if args.json:
                print(json.dumps(page))
            # Token figures labelled: own (the run's own agent), tree (a root's whole tree; "-" on a child).
            shown = [] if args.json else page
            figures = await asyncio.gather(*(view.tokens(r) for r in shown))
            for r, tokens in zip(shown, figures, strict=True):
                tree = "-" if tokens["tree"] is None else tokens["tree"]
                status = r.get("status", "pending")
                print(f"{r['run_id']}  {status:<10} {r['agent_id']}  own={tokens['own']} tree={tree}")
            return 0
        record = await view.record(args.run_id)
        if record is None:
            print(f"plexus runs: error: unknown run {args.run_id!r}", file=sys.stderr)
            return 1
        if args.runs_command == "cancel":
            ended = await rt.cancel_run(str(record.get("root_id") or record["run_id"]), args.reason)
            print(
                json.dumps({"run_id": ended.run_id, "status": str(ended.status)})
                if args.json
                else ended.status
            )
            return 0
        if record.get("root_id") and record["root_id"] != record["run_id"]:
            record = await view.record(str(record["root_id"])) or record
        if args.runs_command == "show":
            runs = await view.tree(record)
            usage = await view.usage(record)
            if args.json:
                print(json.dumps({"root_id": record["run_id"], "runs": runs, "usage": usage}))
            else:
                print(render_tree(runs, usage, record))
            return 0
        return await watch_tree(rt, record, as_json=args.json)
    finally:
        await rt.close()


# -- plexus agents / plexus sessions ------------------------------------------------------------------------
def register_agents(sub: Any) -> None:
    parser = sub.add_parser("agents", help="agent types, capabilities, live workers and their partitions")
    _nats_arg(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=lambda args: _guarded("agents", _with_runtime(args, more.agents, args.json)))


def register_schedules(sub: Any) -> None:
    """``plexus schedules``: scheduled runs (see _cli_schedules.py)."""
    _register_schedules(sub, _nats_arg, _guarded, _urls)


def register_tokens(sub: Any) -> None:
    """``plexus tokens``: the gateway's bearer tokens (see _cli_tokens.py)."""
    _register_tokens(sub, _nats_arg, _guarded, _urls)


def register_sessions(sub: Any) -> None:
    parser = sub.add_parser("sessions", help="list sessions, or show one with its transcript")
    verbs = parser.add_subparsers(dest="sessions_command", required=True)
    ls = verbs.add_parser("ls", help="sessions, newest first")
    show = verbs.add_parser("show", help="one session and its transcript")
    show.add_argument("session_id")
    for verb in (ls, show):
        _nats_arg(verb)
        verb.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=lambda args: _guarded("sessions", _with_runtime(args, more.sessions, args)))


async def _with_runtime(args: argparse.Namespace, command: Any, *extra: Any) -> int:
    rt = await Runtime.connect(_urls(args), name="plexus-cli")
    try:
        return int(await command(rt, *extra))
    finally:
        await rt.close()
