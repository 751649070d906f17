"""``python -m deploy.local up|down|status|restart NAME`` (``make cluster-up`` / ``-down``): cluster.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .cluster import APP, ClusterError, LocalCluster

DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".cluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status", "restart"))
    parser.add_argument("process", nargs="?", help="restart: the service to restart (e.g. worker-w1)")
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="state: stores, logs, PIDs (default .cluster/)"
    )
    parser.add_argument("--app", default=None, help="the workers' App as module:attribute")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir) if args.app is None else LocalCluster(args.dir, app=args.app)
    if args.command == "restart":
        if not args.process:
            parser.error("restart needs the name of a process (see `status`)")
        try:
            pid = cluster.restart(args.process)
        except ClusterError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{args.process} restarted: pid {pid}")
        return 0
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
    print("\n".join(summary(state, args.dir, cluster.app)))
    return 0


def summary(state: dict[str, object], state_dir: Path, app: str) -> list[str]:
    """What `up` prints: where things are, and commands that fit this cluster's ``--dir`` and ``--app``."""
    seeds = state["nats"]
    assert isinstance(seeds, list)
    health = state.get("health") or {}
    assert isinstance(health, dict)
    same_dir = state_dir.resolve() == DEFAULT_DIR.resolve()
    stop = "make cluster-down" if same_dir else f"python -m deploy.local down --dir {state_dir}"
    if app == APP:
        run = f"start a run: plexus runs start planner/demo 'Why durable?' --nats {seeds[0]} --watch"
    else:
        run = (
            f"agent types of {app}: plexus agents --nats {seeds[0]}; start a run: "
            f"plexus runs start TYPE/KEY 'text' --nats {seeds[0]} --watch"
        )
    return [
        f"local cluster up: hosts {state['hosts']}",
        f"NATS seeds: {' '.join(seeds)}",
        f"dashboard: {state['dashboard']}",
        run,
        f"health: {' '.join(str(url) for url in health.values())}",
        f"logs: {state_dir}/*.log; restart one with `python -m deploy.local restart NAME"
        + ("" if same_dir else f" --dir {state_dir}")
        + f"`; stop with `{stop}`",
    ]


if __name__ == "__main__":
    sys.exit(main())
