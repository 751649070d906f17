"""The run tree in a terminal: a plain-text tree with budget bars, redrawn as SSE-equivalent events arrive."""

from __future__ import annotations

import json
import sys
from typing import Any

from plexus.runtime import Runtime

from ._events import tree_events
from ._runs import RunsView, budget_view, stored_tokens

__all__ = ["final_answer", "render_tree", "watch_tree"]


def _bar(used: float, limit: float | None, width: int = 20) -> str:
    if not limit:
        return f"{used:g} (no limit)"
    filled = min(width, int(width * used / limit))
    return f"[{'#' * filled}{'.' * (width - filled)}] {used:g}/{limit:g}"


def render_tree(runs: list[dict[str, Any]], usage: dict[str, int], root: dict[str, Any]) -> str:
    by_id = {r["run_id"]: r for r in runs}
    lines: list[str] = []

    def walk(run_id: str, depth: int) -> None:
        r = by_id.get(run_id)
        if r is None:
            return
        # Labelled: a root's record holds its tree's total, a child's its own (issue 44).
        figures = stored_tokens(r)
        tokens = f"own={figures['own']}"
        if r["run_id"] == root["run_id"]:
            tokens += f" tree={usage.get('tokens', figures['tree'])}"
        reason = f" ({r['reason']})" if r.get("reason") else ""
        lines.append(f"{'  ' * depth}{r['agent_id']}  {r.get('status', 'pending')}{reason}  tokens {tokens}")
        for child in r.get("children", []):
            walk(child, depth + 1)

    walk(str(root["run_id"]), 0)
    budget = budget_view(root, usage)
    lines.append(f"tree tokens {_bar(budget['tokens']['used'], budget['tokens']['limit'])}")
    lines.append(f"tree turns  {_bar(budget['turns']['used'], budget['turns']['limit'])}")
    return "\n".join(lines)


def final_answer(run: dict[str, Any]) -> str:
    """The run's last word for a terminal: its output's text (other blocks by type), or its error."""
    error = run.get("error")
    if error:
        return f"error: {error.get('error_type', 'KernelError')}: {error.get('message', '')}"
    parts: list[str] = []
    for block in run.get("output") or []:
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(f"[{block.get('type', 'block')}] {json.dumps(block, default=str)}")
    return "answer: " + "\n".join(parts) if parts else f"({run.get('status', 'pending')}, no output)"


async def watch_tree(rt: Runtime, root: dict[str, Any], *, as_json: bool) -> int:
    """Print every event (``--json``: one JSON object per line) until the root ends, then the root's final
    answer or error; exit 0 when it completed, 1 otherwise.

    On a terminal the tree is redrawn in place; into a pipe or file (no TTY) every status change is one
    plain line, with no escape codes, and the whole tree once at the end."""
    runs: dict[str, dict[str, Any]] = {}
    usage: dict[str, int] = {}
    redraw = not as_json and sys.stdout.isatty()
    async for event in tree_events(rt, root, None):
        if event.get("data") == "[DONE]":
            break
        data = json.loads(event["data"])
        if as_json:
            print(json.dumps({"id": event["id"], "event": event["event"], "data": data}), flush=True)
        if event["event"] == "snapshot":
            fresh = {r["run_id"]: r for r in data["runs"]}
            if not as_json and not redraw:
                # Into a pipe the snapshot is the first status of each run (a run that ended before the
                # watch began gets its line too), then each change after it.
                for run_id, run in fresh.items():
                    if runs.get(run_id, {}).get("status") != run.get("status"):
                        print(f"{run['agent_id']}  {run.get('status', 'pending')}", flush=True)
            runs = fresh
        elif "run" in data:
            run = data["run"]
            if not as_json and not redraw and runs.get(run["run_id"], {}).get("status") != run.get("status"):
                print(f"{run['agent_id']}  {run.get('status', 'pending')}", flush=True)
            runs[run["run_id"]] = run
            root = runs.get(str(root["run_id"]), root)
        usage = data.get("usage", usage)
        if redraw:
            sys.stdout.write("\x1b[2J\x1b[H" + render_tree(list(runs.values()), usage, root) + "\n")
            sys.stdout.flush()
    final = runs.get(str(root["run_id"]), root)
    if not as_json:
        # The record as stored now: the last status event may have been read before its output was.
        final = await RunsView(rt).record(str(root["run_id"])) or final
        if not redraw:
            print(render_tree(list(runs.values()), usage, root))
        print(final_answer(final), flush=True)
    return 0 if final.get("status") == "completed" else 1
