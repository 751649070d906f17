"""``plexus mcp serve``: agent types as MCP tools over stdio or streamable HTTP (see `_mcp_tools`).

stdio is local by construction (the client spawned this process). Streamable HTTP checks the gateway's
bearer tokens (``--token-hash`` and the tenant's ``plexus tokens``); ``--dev`` turns that off and is refused
unless the address is a loopback one. Registered through the ``plexus.commands`` entry-point group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from plexus.core import RunId
from plexus.runtime import Runtime
from plexus.runtime.kernel import (
    NatsSettings,
    configure_telemetry,
    load_settings,
    port_number,
    positive_seconds,
)

from ._access import TokenRegistry
from ._config import GatewayConfig

__all__ = ["McpHttp", "register_mcp"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


def register_mcp(sub: Any) -> None:
    parser = sub.add_parser("mcp", help="serve agent types as MCP tools")
    verbs = parser.add_subparsers(dest="mcp_command", required=True)
    serve = verbs.add_parser(
        "serve",
        help="each exposed agent type is an MCP tool (stdio for a local client, or streamable HTTP)",
    )
    serve.add_argument(
        "--types",
        action="append",
        default=None,
        help="agent types to expose, comma-separated (repeatable); required: none is exposed by default",
    )
    how = serve.add_mutually_exclusive_group(required=True)
    how.add_argument("--stdio", action="store_true", help="speak MCP on stdin/stdout (a local client)")
    how.add_argument(
        "--http", type=port_number, metavar="PORT", help="streamable HTTP on PORT (0: a free one), at /mcp"
    )
    serve.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    serve.add_argument(
        "--token-hash",
        action="append",
        default=None,
        help="an accepted bearer token as sha256:<hex> (repeatable); `plexus tokens` tokens are accepted too",
    )
    serve.add_argument(
        "--dev", action="store_true", help="HTTP without authentication (only on a loopback address)"
    )
    serve.add_argument(
        "--timeout", type=positive_seconds, default=600.0, help="seconds one call may take (then cancelled)"
    )
    serve.add_argument(
        "--nats",
        action="append",
        default=None,
        help="server URL (repeat for a cluster); default $PLEXUS_NATS or nats://127.0.0.1:4222",
    )
    serve.set_defaults(handler=_run)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run(args: argparse.Namespace) -> int:
    exposed = sorted({t.strip() for item in args.types or [] for t in item.split(",") if t.strip()})
    if not exposed:
        print(
            "plexus mcp serve: error: no agent type is exposed: name them with --types T1,T2",
            file=sys.stderr,
        )
        return 2
    if args.timeout <= 0:
        print("plexus mcp serve: error: --timeout must be > 0", file=sys.stderr)
        return 2
    if args.http is not None and args.dev and not _loopback(args.host):
        print(
            f"plexus mcp serve: error: --dev (no authentication) only on a loopback address, not {args.host}",
            file=sys.stderr,
        )
        return 2
    try:
        config = GatewayConfig(token_hashes=frozenset(args.token_hash or ()), dev=args.dev)
    except ValueError as exc:
        print(f"plexus mcp serve: error: {exc}", file=sys.stderr)
        return 2
    urls = list(args.nats or load_settings(NatsSettings).nats)
    return asyncio.run(_serve(urls, exposed, args, config))


async def _serve(urls: list[str], exposed: list[str], args: argparse.Namespace, config: GatewayConfig) -> int:
    from mcp.server.stdio import stdio_server

    from ._mcp_tools import AgentTools, mcp_server

    configure_telemetry("plexus-mcp")
    rt = await Runtime.connect(urls, name="plexus-mcp")
    # stdio: this process serves exactly one client, so one key is that client's session.
    tools = AgentTools(
        rt, exposed, session_key=f"mcp-{RunId.new()}" if args.stdio else None, timeout_s=args.timeout
    )
    server = mcp_server(tools)
    try:
        if args.stdio:
            # stdout is the protocol: everything said to a person goes to stderr.
            print(f"plexus mcp serving stdio (tools {', '.join(exposed)})", file=sys.stderr, flush=True)
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            return 0
        http = McpHttp(rt, server, config, host=args.host, port=args.http)
        try:
            await http.start()
        except OSError as exc:
            print(
                f"plexus mcp serve: error: cannot listen on {args.host}:{args.http}: {exc}", file=sys.stderr
            )
            return 1
        if not config.dev and not config.token_hashes:
            # Closed, not open, like `plexus gateway`: the tenant's bucket may hold no token yet.
            print(
                "plexus mcp serve: no --token-hash given: accepting only `plexus tokens create` tokens",
                file=sys.stderr,
                flush=True,
            )
        if config.dev:
            print(
                f"plexus mcp serve: WARNING: --dev: anyone who can reach {http.url} can start runs",
                file=sys.stderr,
                flush=True,
            )
        print(f"plexus mcp serving {http.url} (tools {', '.join(exposed)})", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await http.stop()
        return 0
    finally:
        await tools.aclose()
        await rt.close()


class McpHttp:
    """The MCP server on streamable HTTP at ``/mcp`` behind the gateway's bearer tokens, under uvicorn in
    the caller's event loop; ``await McpHttp(...).start()`` binds (port 0 picks a free one)."""

    def __init__(
        self, rt: Runtime, server: Any, config: GatewayConfig, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.rt = rt
        self.config = config
        self.host = host
        self.port = port
        self.tokens = TokenRegistry(rt.js)
        self.app = server.streamable_http_app(host=host)
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    async def _guard(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.config.dev and not self._allowed(scope):
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"www-authenticate", b"Bearer"), (b"content-type", b"application/json")],
                }
            )
            await send(
                {"type": "http.response.body", "body": b'{"error":"a valid bearer token is required"}'}
            )
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        return self.config.static_caller(token) is not None or self.tokens.identify(token) is not None

    async def start(self) -> None:
        import uvicorn

        if not self.config.dev:
            await self.tokens.start()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._socket = sock
        config = uvicorn.Config(
            self._guard, interface="asgi3", log_level="warning", lifespan="on", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the MCP server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._socket is not None:
            self._socket.close()
        await self.tokens.stop()
