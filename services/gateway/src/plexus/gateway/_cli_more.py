"""``plexus runs start|approve``, ``plexus agents`` and ``plexus sessions ls|show``: the gateway's views of
a cluster from the terminal (straight over NATS: no gateway process needed), each with ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from plexus.core import ExecutionBudget, SpawnBudget, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.kernel import agent_id_argument, non_negative_number, positive_int, positive_seconds

from ._runs import partitions_by_worker
from ._session_tools import item_line
from ._sessions import SessionNotFound, SessionStore

__all__ = ["add_approve", "add_start", "agents", "approve", "sessions", "start"]


def add_start(verbs: Any) -> argparse.ArgumentParser:
    start: argparse.ArgumentParser = verbs.add_parser(
        "start", help="start an orchestrated run tree; prints its run id"
    )
    start.add_argument("agent_id", type=agent_id_argument, help="the root agent, TYPE/KEY")
    start.add_argument("text", nargs="?", default="", help="the input text (default: empty)")
    start.add_argument("--max-tokens", type=positive_int, default=None)
    start.add_argument("--max-cost", type=non_negative_number, default=None, help="USD")
    start.add_argument("--max-turns", type=positive_int, default=None)
    start.add_argument(
        "--max-agents", type=positive_int, default=None, help="spawn budget: agents alive at once"
    )
    start.add_argument("--timeout", type=non_negative_number, default=None, help="deadline, seconds from now")
    start.add_argument("--watch", action="store_true", help="then follow the tree until it ends")
    return start


def add_approve(verbs: Any) -> argparse.ArgumentParser:
    approve: argparse.ArgumentParser = verbs.add_parser(
        "approve", help="decide one thing an awaiting_approval run waits for"
    )
    approve.add_argument("run_id")
    approve.add_argument("decision_id", help="what it waits for (e.g. a tool call id: see `runs show`)")
    approve.add_argument("--deny", action="store_true", help="refuse instead of approving")
    approve.add_argument("--reason", default="")
    approve.add_argument(
        "--wait", action="store_true", help="return once the run has ended or awaits decisions again"
    )
    approve.add_argument(
        "--timeout", type=positive_seconds, default=60.0, help="seconds --wait waits (default: 60)"
    )
    return approve


async def start(rt: Runtime, args: argparse.Namespace) -> str:
    """Start the run the arguments describe; returns its id (ValueError for a budget that cannot be)."""
    limits = (args.max_tokens, args.max_cost, args.max_turns, args.timeout)
    budget = None
    if any(x is not None for x in limits):
        budget = ExecutionBudget(
            max_tokens=args.max_tokens,
            max_cost_usd=args.max_cost,
            max_turns=args.max_turns,
            deadline_s=args.timeout,
        )
    spawn = SpawnBudget(max_agents=args.max_agents) if args.max_agents is not None else None
    return await rt.start_run(args.agent_id, [TextBlock(text=args.text)], budget=budget, spawn_budget=spawn)


async def approve(rt: Runtime, args: argparse.Namespace) -> int:
    record = await rt.approve(
        args.run_id,
        args.decision_id,
        approved=not args.deny,
        reason=args.reason,
        wait=args.wait,
        timeout=args.timeout,
    )
    if args.json:
        print(json.dumps(msgspec.json.decode(msgspec.json.encode(record))))
    else:
        verdict = "denied" if args.deny else "approved"
        print(f"{args.decision_id} {verdict}; run {record.run_id} is {record.status}")
    return 0


# -- plexus agents ----------------------------------------------------------------------------------------
async def agents(rt: Runtime, as_json: bool) -> int:
    types = sorted(await rt.agent_types(None), key=lambda t: t.ref)
    workers = await rt.registry.live_workers()
    owned = await partitions_by_worker(rt)
    rows: list[dict[str, Any]] = [
        {
            "type": t.ref,
            "description": t.description,
            "capabilities": list(t.capabilities),
            "durable": t.durable,
            "workers": {
                w.worker_id: owned.get(w.worker_id, {}).get(t.ref, []) for w in workers if w.hosts(t.ref)
            },
        }
        for t in types
    ]
    if as_json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no agent types registered")
    for row in rows:
        caps = f" [{', '.join(row['capabilities'])}]" if row["capabilities"] else ""
        print(f"{row['type']}{caps}  {row['description']}")
        hosts = row["workers"]
        if not hosts:
            print("    no live worker")
        for worker_id, partitions in sorted(hosts.items()):
            print(f"    {worker_id}: {len(partitions)} partition(s) {_ranges(sorted(partitions))}")
    return 0


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out: list[str] = []
    for n in numbers:
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


# -- plexus sessions --------------------------------------------------------------------------------------
async def sessions(rt: Runtime, args: argparse.Namespace) -> int:
    store = await SessionStore.open(rt.js)
    if args.sessions_command == "ls":
        found = await store.all()
        if args.json:
            print(json.dumps(found))
        for s in [] if args.json else found:
            print(f"{s['session_id']}  {s.get('agent_type', '?'):<16} {s.get('title') or ''}")
        return 0
    try:
        meta = await store.get(args.session_id)
    except SessionNotFound as exc:
        print(f"plexus sessions: error: {exc}", file=sys.stderr)
        return 1
    items = await store.transcript(args.session_id)
    if args.json:
        print(json.dumps({"session": meta, "transcript": [i.model_dump(mode="json") for i in items]}))
        return 0
    print(f"session {meta['session_id']} with {meta.get('agent_type')} ({len(items)} items)")
    for item in items:
        print(f"  {item_line(item)}")
    return 0
