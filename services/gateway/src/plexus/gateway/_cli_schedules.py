"""``plexus schedules ls|create|pause|resume|trigger|rm``: scheduled runs, through the orchestrator
(docs/schedules.md, "Scheduled runs")."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

import msgspec

from plexus.core import AgentId, ExecutionBudget, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.orchestration import ScheduleInfo

__all__ = ["register_schedules", "schedule_row"]


def register_schedules(sub: Any, nats_arg: Any, guarded: Any, urls: Any) -> None:
    parser = sub.add_parser("schedules", help="scheduled runs: list, create, pause, resume, trigger, delete")
    verbs = parser.add_subparsers(dest="schedules_command", required=True)
    ls = verbs.add_parser("ls", help="the scheduled runs, their next fires and last runs")
    create = verbs.add_parser("create", help="create (or replace) a scheduled run")
    create.add_argument("id", help="the schedule's id (letters, digits, '-', '_'; the same id replaces it)")
    create.add_argument("agent", help="the run's root agent, type/key (or namespace/type/key)")
    create.add_argument("text", help="the run's input text")
    when = create.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="a cron expression: 5 fields, 6 (seconds first) or @daily…")
    when.add_argument("--every", type=float, metavar="SECONDS", help="an interval (at least 1 s)")
    create.add_argument("--tz", help="the cron's IANA time zone (default UTC)")
    create.add_argument("--overlap", default="skip", choices=("skip", "buffer_one", "allow"))
    create.add_argument("--max-tokens", type=int, help="each run's token budget")
    create.add_argument("--deadline", type=float, metavar="SECONDS", help="each run's deadline")
    one = {
        name: verbs.add_parser(name, help=text)
        for name, text in (
            ("pause", "stop firing until resumed"),
            ("resume", "fire again"),
            ("trigger", "fire now (also while paused), under the overlap policy"),
            ("rm", "delete a scheduled run (its running runs go on)"),
        )
    }
    for parser_ in one.values():
        parser_.add_argument("id")
    for verb in (ls, create, *one.values()):
        nats_arg(verb)
        verb.add_argument("--namespace", default=None, help="default: the connection's")
        verb.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=lambda args: guarded("schedules", _schedules(args, urls(args))))


def schedule_row(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule as JSON (the CLI's ``--json`` and the gateway's answers)."""
    row: dict[str, Any] = json.loads(msgspec.json.encode(info))
    return row


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds")


def _print(info: ScheduleInfo) -> None:
    s = info.schedule
    spec = f"cron {s.cron!r}" + (f" {s.tz}" if s.tz else "") if s.cron else f"every {s.every_s:g}s"
    state = "paused" if s.paused else f"next {_when(info.next_fires[0])}" if info.next_fires else "-"
    print(
        f"{s.id}  {s.agent_id}  {spec}  overlap={s.overlap}  {state}  fires={info.state.fires}"
        f" skipped={info.state.skipped}"
    )
    for run in info.state.last_runs[:3]:
        print(f"    {_when(run.fired_at)}  {run.run_id}  {run.outcome}  {run.status or run.error or ''}")


async def _schedules(args: argparse.Namespace, servers: list[str]) -> int:
    rt = await Runtime.connect(servers, name="plexus-schedules")
    try:
        ns = args.namespace
        command = args.schedules_command
        if command == "ls":
            listed = await rt.list_schedules(namespace=ns)
            if args.json:
                print(json.dumps([schedule_row(i) for i in listed.schedules]))
            else:
                for info in listed.schedules:
                    _print(info)
                print(f"{len(listed.schedules)} scheduled run(s); this tenant's limit is {listed.limit}")
            return 0
        if command == "trigger":
            run_id = await rt.trigger_schedule(args.id, namespace=ns)
            print(json.dumps({"run_id": run_id}) if args.json else run_id)
            return 0
        if command == "rm":
            await rt.delete_schedule(args.id, namespace=ns)
            print(json.dumps({"deleted": args.id}) if args.json else f"deleted {args.id}")
            return 0
        if command == "create":
            agent = AgentId.parse(
                args.agent if args.agent.count("/") == 2 else f"{ns or rt.namespace}/{args.agent}"
            )
            budget = None
            if args.max_tokens is not None or args.deadline is not None:
                budget = ExecutionBudget(max_tokens=args.max_tokens, deadline_s=args.deadline)
            info = await rt.schedule_run(
                agent,
                [TextBlock(text=args.text)],
                cron=args.cron,
                every=datetime.timedelta(seconds=args.every) if args.every is not None else None,
                tz=args.tz,
                overlap=args.overlap,
                budget=budget,
                schedule_id=args.id,
            )
        elif command == "pause":
            info = await rt.pause_schedule(args.id, namespace=ns)
        else:
            info = await rt.resume_schedule(args.id, namespace=ns)
        if args.json:
            print(json.dumps(schedule_row(info)))
        else:
            _print(info)
        return 0
    finally:
        await rt.close()
