"""Time travel (issue 38, items 1-2): a run tree of the research-team example exported to one file and
replayed offline against the app's agent code, with the first divergence per agent reported."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from examples import research_team

from plexus.core import AgentId, ExecutionBudget, SpawnBudget, TextBlock
from plexus.llm import LLMAgent, ScriptedModel, tool
from plexus.runtime import App, Runtime
from plexus.runtime.orchestration import RunNotFoundError
from plexus.runtime.timetravel import (
    RecordingVersionError,
    ReplayAppMismatchError,
    assert_replays,
    read_recording,
    recording_lines,
    replay,
    replay_file,
)

REPO = Path(__file__).resolve().parents[2]


async def _research_run(runtime: Runtime, start_worker: Any) -> str:
    await start_worker(research_team.app)
    run_id = await runtime.start_run(
        AgentId("planner", "demo"),
        [TextBlock(text="How does Plexus keep agents durable?")],
        budget=ExecutionBudget(max_tokens=20_000, max_turns=30),
        spawn_budget=SpawnBudget(max_agents=10),
    )
    record = await runtime.wait_run(run_id, timeout=120)
    assert record.status.value == "completed", record
    return run_id


async def test_export_holds_the_whole_tree(
    runtime: Runtime, start_worker: Any, orchestrator: Any, tmp_path: Path
) -> None:
    run_id = await _research_run(runtime, start_worker)
    recording = await runtime.export_run(run_id)
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"".join(recording_lines(recording)))
    back = read_recording(path.read_bytes().splitlines())
    assert back.header.root_run_id == run_id
    assert len(back.runs) == 4


async def test_an_unchanged_app_replays_its_export_without_divergence(
    runtime: Runtime, start_worker: Any, orchestrator: Any, tmp_path: Path
) -> None:
    run_id = await _research_run(runtime, start_worker)
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"".join(recording_lines(await runtime.export_run(run_id))))
    report = await assert_replays(path, research_team.app)
    assert len(report.replayed) == 4
    assert report.notes == []


def _swap_the_first_two_child_endings(lines: list[bytes], parent: str) -> list[bytes]:
    """The same export as if the parent's two concurrent children had ended the other way round live: the
    entries of their endings (and of the tool results journaled right after each) trade places."""
    rows = [json.loads(line) for line in lines]
    mine = [r for r in rows if r.get("kind") == "log" and r.get("agent_id") == parent and "entry" in r]
    ends = [i for i, r in enumerate(mine) if r["entry"]["type"] == "child.completed"][:2]
    assert len(ends) == 2, [r["entry"]["type"] for r in mine]
    first, second = ends
    assert mine[first + 1]["entry"]["type"] == mine[second + 1]["entry"]["type"] == "tool.result"
    for a, b in ((first, second), (first + 1, second + 1)):
        mine[a]["entry"], mine[b]["entry"] = mine[b]["entry"], mine[a]["entry"]
    return [json.dumps(r).encode() + b"\n" for r in rows]


async def test_concurrent_children_end_in_the_recorded_order_whatever_order_the_replay_runs_them(
    runtime: Runtime, start_worker: Any, orchestrator: Any, tmp_path: Path
) -> None:
    """The planner's two researchers run at once; the order their endings were journaled in is the live
    run's. Each order must replay: the replay ends the children in the recorded order (it once ended them
    in the order it ran them, and an unchanged app diverged from its own export in CI)."""
    run_id = await _research_run(runtime, start_worker)
    lines = list(recording_lines(await runtime.export_run(run_id)))
    for variant, edited in (
        ("as run", lines),
        ("swapped", _swap_the_first_two_child_endings(lines, "planner/demo")),
    ):
        path = tmp_path / f"{variant.replace(' ', '_')}.jsonl"
        path.write_bytes(b"".join(edited))
        report = await assert_replays(path, research_team.app)
        assert len(report.replayed) == 4, variant


@tool
def review(notes: str) -> str:
    """Review the notes (the changed planner's second tool, in place of `write`)."""
    return f"reviewed: {notes}"


def _changed_app() -> App:
    """The research team with a changed planner: at turn 2 it calls `review` where it called `write`."""
    app = App()
    for name, agent_type in research_team.app.types.items():
        if name != "planner":
            app.register(name, agent_type.factory)
    app.register(
        "planner",
        lambda _id: LLMAgent(
            ScriptedModel([research_team._planner_script] * 20),
            system="Plan, delegate with your tools, then answer.",
            tools=[research_team.research, review],
        ),
    )
    return app


CHANGED = _changed_app()


async def test_a_changed_agent_reports_its_first_divergence_with_both_sides(
    runtime: Runtime, start_worker: Any, orchestrator: Any, tmp_path: Path
) -> None:
    run_id = await _research_run(runtime, start_worker)
    recording = await runtime.export_run(run_id)
    report = await replay(recording, _changed_app())
    assert list(report.divergences) == ["planner/demo"]  # the researchers and the writer replay as recorded
    found = report.divergences["planner/demo"]
    assert found.what == ".llm-journal entry 1"  # turn 2's tool step (journal step 3)
    recorded = found.recorded["item"]["blocks"][0]
    replayed = found.replayed["item"]["blocks"][0]
    assert recorded["call_id"] == replayed["call_id"] == "w"
    assert recorded["is_error"] is False  # the writer answered `write`
    assert replayed["is_error"] is True  # the changed planner has no `write` tool any more
    assert replayed["content"][0]["error_type"] == "UnknownTool"
    with pytest.raises(AssertionError, match="planner/demo"):
        await assert_replays(recording, _changed_app())


async def test_plexus_runs_replay_reads_a_file_without_nats(
    runtime: Runtime, start_worker: Any, orchestrator: Any, tmp_path: Path
) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(
        b"".join(recording_lines(await runtime.export_run(await _research_run(runtime, start_worker))))
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PLEXUS_NATS": "nats://127.0.0.1:1",
    }  # nothing listens there
    cmd = [sys.executable, "-m", "plexus.runtime.cli", "runs", "replay", str(path), "--app"]
    same = await asyncio.to_thread(
        subprocess.run,
        [*cmd, "examples.research_team:app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no divergence" in same.stdout
    changed = await asyncio.to_thread(
        subprocess.run,
        [*cmd, "tests.llm.test_timetravel:CHANGED", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert list(json.loads(changed.stdout)["divergences"]) == ["planner/demo"]


async def test_bad_input_is_typed(runtime: Runtime, orchestrator: Any, tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError):
        await runtime.export_run("run_01M8J6T3GTZ6J31TH4VYHQGQVY")
    newer = tmp_path / "newer.jsonl"
    newer.write_text(
        json.dumps(
            {
                "format": "plexus-run-recording",
                "version": 99,
                "namespace": "default",
                "root_run_id": "r",
                "exported_at": 0.0,
                "partial": False,
            }
        )
        + "\n"
    )
    with pytest.raises(RecordingVersionError) as raised:
        await replay_file(newer, research_team.app)
    assert raised.value.version == 99


async def test_an_app_without_the_recorded_types_is_refused(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    recording = await runtime.export_run(await _research_run(runtime, start_worker))
    with pytest.raises(ReplayAppMismatchError) as raised:
        await replay(recording, App())
    assert raised.value.missing == ["planner", "researcher", "writer"]
