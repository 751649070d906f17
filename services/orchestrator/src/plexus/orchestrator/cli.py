"""``plexus orchestrator``: run one orchestrator replica (registered through the ``plexus.commands``
entry-point group, so the core CLI never imports this package)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from plexus.runtime import configure_telemetry

from ._orchestrator import Orchestrator, OrchestratorConfig
from ._sweeper import SweeperConfig

__all__ = ["dev_command", "register", "run"]

log = logging.getLogger("plexus.orchestrator")


def _nats_url(value: str) -> str:
    if not value.startswith(("nats://", "tls://", "ws://", "wss://")):
        raise argparse.ArgumentTypeError(f"expected a nats:// URL, got {value!r}")
    return value


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def dev_command(nats_url: str) -> list[str]:
    """`plexus dev`'s argv for one local orchestrator replica (entry point group ``plexus.dev``)."""
    return ["orchestrator", "--nats", nats_url]


def register(sub: Any) -> None:
    """Add the ``orchestrator`` subcommand to the ``plexus`` parser's subparsers."""
    parser = sub.add_parser(
        "orchestrator", help="run an orchestrator replica (run trees, budgets, spawn slots)"
    )
    parser.add_argument(
        "--nats",
        type=_nats_url,
        action="append",
        default=None,
        help="server URL (repeat for a cluster); default $PLEXUS_NATS or nats://127.0.0.1:4222",
    )
    parser.add_argument("--prefix", default="px", help="subject prefix (default px)")
    parser.add_argument("--namespace", default=None, help="serve only this namespace (default: all)")
    parser.add_argument(
        "--partitions", type=int, default=16, help="inbox partitions, used only if the topology is missing"
    )
    parser.add_argument("--tick", type=_positive_float, default=0.1, help="sweeper period in seconds")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    urls = args.nats or [os.environ.get("PLEXUS_NATS", "nats://127.0.0.1:4222")]
    config = OrchestratorConfig(
        prefix=args.prefix,
        namespace=args.namespace,
        partitions=args.partitions,
        sweeper=SweeperConfig(tick_s=args.tick),
    )
    return asyncio.run(_serve(urls, config))


async def _serve(urls: list[str], config: OrchestratorConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    telemetry = configure_telemetry("plexus-orchestrator")
    orch = await Orchestrator.connect(urls, config)
    await orch.start()
    scope = config.namespace if config.namespace is not None else "all namespaces"
    print(f"plexus orchestrator {orch.id} serving {scope} on {', '.join(urls)}", flush=True)
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
    print("plexus orchestrator: stopping", flush=True)
    await orch.stop()
    telemetry.shutdown()
    return 0
