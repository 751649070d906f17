"""``python -m deploy.local up|down|status`` (``make cluster-up`` / ``make cluster-down``): see cluster.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cluster import ClusterError, LocalCluster

DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".cluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="state: stores, logs, PIDs (default .cluster/)"
    )
    parser.add_argument("--app", default=None, help="the workers' App as module:attribute")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir) if args.app is None else LocalCluster(args.dir, app=args.app)
    if args.command == "down":
        cluster.down()
        print("local cluster stopped; hosts deleted")
        return 0
    if args.command == "status":
        state = cluster.status()
        print(json.dumps(state, indent=2) if state else "no local cluster is up")
        return 0 if state else 1
    try:
        state = cluster.up()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    seeds = state["nats"]
    assert isinstance(seeds, list)
    print(f"local cluster up: hosts {state['hosts']}")
    print(f"NATS seeds: {' '.join(seeds)}")
    print(f"dashboard: {state['dashboard']}")
    print(f"start a run: plexus runs start planner/demo 'Why durable?' --nats {seeds[0]} --watch")
    print(f"health: {' '.join(str(url) for url in dict(state['health']).values())}")  # type: ignore[call-overload]
    print(f"logs: {args.dir}/*.log; stop with `make cluster-down`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
