"""``plexus runs fork``: a new run tree at a point of one agent's history (`Runtime.fork_run`,
docs/timetravel.md), straight over NATS; prints the new run's id (``--json``: with its lineage)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from plexus.runtime import ForkEdit, ForkPoint, Runtime
from plexus.runtime.kernel import non_negative_int

__all__ = ["add_fork", "fork"]


def _settings(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}: {exc}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


def add_fork(verbs: Any) -> argparse.ArgumentParser:
    fork_: argparse.ArgumentParser = verbs.add_parser(
        "fork", help="start a new run tree at a turn or message of a run, optionally edited"
    )
    fork_.add_argument("run_id", help="the source run (only read)")
    fork_.add_argument(
        "--turn", type=non_negative_int, default=None, help="after this turn (1-based); 0: the message"
    )
    fork_.add_argument(
        "--message", type=non_negative_int, default=0, help="the agent's handled message in the run"
    )
    fork_.add_argument("--agent", default=None, help="TYPE/KEY of an agent of the tree (default: the run's)")
    fork_.add_argument("--text", default=None, help="the edited user message")
    fork_.add_argument("--system", default=None, help="the edited system prompt")
    fork_.add_argument(
        "--settings", type=_settings, default=None, help="model settings, e.g. '{\"temperature\": 0}'"
    )
    return fork_


async def fork(rt: Runtime, args: argparse.Namespace) -> int:
    point = ForkPoint(agent=args.agent, message=args.message, turn=args.turn)
    edit = ForkEdit(message=args.text, system=args.system, settings=args.settings)
    run_id = await rt.fork_run(args.run_id, point, edit)
    if args.json:
        record = await rt.get_run(run_id)
        print(json.dumps({"run_id": run_id, "forked_from": record.forked_from}), flush=True)
    else:
        print(run_id, flush=True)
    return 0
