"""``plexus orchestrator``: run one orchestrator replica (registered through the ``plexus.commands``
entry-point group, so the core CLI never imports this package)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from pydantic import Field

from plexus.runtime.kernel import (
    HealthServer,
    NatsSettings,
    SettingsError,
    configure_telemetry,
    env_help,
    load_settings,
    nats_url,
    port_number,
    positive_seconds,
)

from ._orchestrator import Orchestrator, OrchestratorConfig
from ._sweeper import SweeperConfig

__all__ = ["dev_command", "register", "run"]

log = logging.getLogger("plexus.orchestrator")


class OrchestratorSettings(NatsSettings):
    """``plexus orchestrator``'s environment (flags of the same name win)."""

    namespace: str | None = Field(default=None, description="serve only this namespace (default: all)")


def dev_command(nats_url: str) -> list[str]:
    """`plexus dev`'s argv for one local orchestrator replica (entry point group ``plexus.dev``)."""
    return ["orchestrator", "--nats", nats_url]


def register(sub: Any) -> None:
    """Add the ``orchestrator`` subcommand to the ``plexus`` parser's subparsers."""
    parser = sub.add_parser(
        "orchestrator",
        help="run an orchestrator replica (run trees, budgets, spawn slots)",
        epilog=env_help(OrchestratorSettings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nats",
        type=nats_url,
        action="append",
        default=None,
        help="server URL (repeat for a cluster); default $PLEXUS_NATS or nats://127.0.0.1:4222",
    )
    parser.add_argument("--prefix", default="px", help="subject prefix (default px)")
    parser.add_argument("--namespace", default=None, help="serve only this namespace (default: all)")
    parser.add_argument(
        "--partitions", type=int, default=16, help="inbox partitions, used only if the topology is missing"
    )
    parser.add_argument("--tick", type=positive_seconds, default=0.1, help="sweeper period in seconds")
    parser.add_argument(
        "--health-port",
        type=port_number,
        default=None,
        help="serve /healthz and /readyz on this port (0: any)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(OrchestratorSettings)
    except SettingsError as exc:
        print(f"plexus orchestrator: error: {exc}", file=sys.stderr)
        return 2
    urls = args.nats or settings.nats
    health_port = args.health_port if args.health_port is not None else settings.health_port
    config = OrchestratorConfig(
        prefix=args.prefix,
        namespace=args.namespace if args.namespace is not None else settings.namespace,
        partitions=args.partitions,
        sweeper=SweeperConfig(tick_s=args.tick),
    )
    return asyncio.run(_serve(urls, config, health_port, settings.health_host))


async def _serve(
    urls: list[str], config: OrchestratorConfig, health_port: int | None, health_host: str
) -> int:
    telemetry = configure_telemetry("plexus-orchestrator")
    # The connect waits for a server as long as it takes (a container may start first): until it is up,
    # SIGTERM and Ctrl-C keep their default effect (the process ends) instead of setting `stop`.
    orch = await Orchestrator.connect(urls, config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await orch.start()
    stopping = False
    health = None
    if health_port is not None:
        health = HealthServer(
            lambda: {"nats": orch.nc.is_connected, "serving": not stopping},
            alive=lambda: not orch.nc.is_closed,
            host=health_host,
            port=health_port,
        )
        await health.start()
    scope = config.namespace if config.namespace is not None else "all namespaces"
    print(
        f"plexus orchestrator {orch.id} serving {scope} on {', '.join(urls)}"
        + (f"; health on port {health.port}" if health else ""),
        flush=True,
    )
    waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(orch.connection_closed.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
    if orch.connection_closed.is_set() and not stop.is_set():
        # Every decision lives in JetStream: another replica (or this one, restarted) carries on.
        print(
            "plexus orchestrator: error: the NATS connection was closed for good; exiting so a supervisor"
            " can restart us",
            file=sys.stderr,
            flush=True,
        )
        return 1
    stopping = True
    print("plexus orchestrator: stopping", flush=True)
    await orch.stop()
    if health is not None:
        await health.stop()
    telemetry.shutdown()
    return 0
