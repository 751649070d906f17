"""``plexus runs export`` and ``plexus runs replay`` (docs/timetravel.md).

Here, beside the other ``plexus runs`` verbs, so a user finds them where the run trees are; the work is
`Runtime.export_run` and `plexus.runtime.timetravel`, which any program can call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from plexus.runtime import App, Runtime
from plexus.runtime.kernel import CliError, ReplayReport, load_object, recording_lines, replay, replay_file

__all__ = ["add_verbs", "run"]


def add_verbs(verbs: Any) -> list[argparse.ArgumentParser]:
    export = verbs.add_parser("export", help="write a run tree as one recording (JSON Lines) to stdout")
    export.add_argument("run_id")
    export.add_argument(
        "--partial", action="store_true", help="export a tree that has not ended, marked partial"
    )
    again = verbs.add_parser("replay", help="replay a run tree (a recording file or a run id) against an app")
    again.add_argument("source", help="a recording file, or a run id (exported first: needs NATS)")
    again.add_argument("--app", required=True, help="module:attribute of the App to replay")
    again.add_argument("--json", action="store_true", help="machine-readable output")
    return [export, again]


async def run(args: argparse.Namespace, urls: list[str]) -> int:
    if args.runs_command == "export":
        rt = await Runtime.connect(urls, name="plexus-runs")
        try:
            recording = await rt.export_run(args.run_id, partial=args.partial)
        finally:
            await rt.close()
        for line in recording_lines(recording):
            sys.stdout.buffer.write(line)
        sys.stdout.flush()
        return 0
    try:
        app = load_object(args.app)
    except CliError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(app, App):
        raise ValueError(f"{args.app} is a {type(app).__name__}, not an App")
    if await asyncio.to_thread(Path(args.source).exists):
        report = await replay_file(args.source, app)
    else:
        rt = await Runtime.connect(urls, name="plexus-runs")
        try:
            recording = await rt.export_run(args.source)
        finally:
            await rt.close()
        report = await replay(recording, app)
    _print(report, args.json)
    return 0 if report.ok else 1


def _print(report: ReplayReport, as_json: bool) -> None:
    if as_json:
        found = {
            agent: {"run_id": d.run_id, "what": d.what, "recorded": d.recorded, "replayed": d.replayed}
            for agent, d in report.divergences.items()
        }
        print(
            json.dumps({"root_run_id": report.root_run_id, "replayed": report.replayed, "divergences": found})
        )
        return
    print(f"replayed {len(report.replayed)} runs of {report.root_run_id}")
    for note in report.notes:
        print(f"note: {note}")
    for divergence in report.divergences.values():
        print(divergence)
    if report.ok:
        print("no divergence")
