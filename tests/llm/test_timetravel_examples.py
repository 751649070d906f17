"""Time travel (issue 38, item 2): every app in examples/ replays its own export without divergence: a real
run of the app under the orchestrator, exported to a file, replayed offline against the same app."""

from __future__ import annotations

import asyncio
import importlib
import json
from pathlib import Path
from typing import Any

from examples import pipeline

from plexus.core import AgentId, ExecutionBudget, SpawnBudget, TextBlock
from plexus.runtime import App, Runtime
from plexus.runtime.timetravel import Recording, RunNotEndedError, assert_replays, recording_lines

REPO = Path(__file__).resolve().parents[2]


def test_every_example_app_has_its_round_trip() -> None:
    """A new app in examples/ gets its export -> replay round trip here or in test_timetravel.py."""
    apps = sorted(
        path.stem
        for path in (REPO / "examples").glob("*.py")
        if isinstance(getattr(importlib.import_module(f"examples.{path.stem}"), "app", None), App)
    )
    assert apps == ["pipeline", "research_team"]  # research_team: tests/llm/test_timetravel.py


async def test_the_pipeline_example_replays_its_export_without_divergence(
    runtime: Runtime, start_worker: Any, orchestrator: Any, tmp_path: Path
) -> None:
    await start_worker(pipeline.app)
    run_id = await runtime.start_run(
        AgentId("coordinator", "demo"),
        [TextBlock(text="Why did the bridge sway?")],
        budget=ExecutionBudget(max_tokens=20_000),
        spawn_budget=SpawnBudget(max_agents=10),
    )
    record = await runtime.wait_run(run_id, timeout=120)
    assert record.status.value == "completed", record
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"".join(recording_lines(await runtime.export_run(run_id))))
    report = await assert_replays(path, pipeline.app)
    assert len(report.replayed) == 5
    assert report.notes == []


async def _pipeline_run(runtime: Runtime, key: str, question: str, max_tokens: int) -> str:
    run_id = await runtime.start_run(
        AgentId("coordinator", key),
        [TextBlock(text=question)],
        budget=ExecutionBudget(max_tokens=max_tokens),
        spawn_budget=SpawnBudget(max_agents=10),
    )
    await runtime.wait_run(run_id, timeout=120)
    return run_id


async def test_a_later_pipeline_run_replays_from_the_state_its_agents_had(
    runtime: Runtime, start_worker: Any, orchestrator: Any, tmp_path: Path
) -> None:
    """The researchers count their answers in their state: the second run's replay starts from the first's."""
    await start_worker(pipeline.app)
    # A worker's very first commits may be checkpoints (before it sees its own registration, which says it
    # logs state deltas): a state the log then cannot say. The warm-up tree gives it that time.
    await _pipeline_run(runtime, "warm-up", "Why?", 20_000)
    await _pipeline_run(runtime, "demo", "Why did the bridge sway?", 20_000)
    second = await _pipeline_run(runtime, "demo", "Why is the sky blue?", 20_000)
    recording = await runtime.export_run(second)
    states = {line.agent_id: line.state for line in recording.states}
    assert states["researcher/physics"] == {"answered": 2}  # the warm-up and the first run
    report = await assert_replays(recording, pipeline.app)
    assert len(report.replayed) == 5
    assert report.notes == []


async def _export_when_settled(runtime: Runtime, run_id: str) -> Recording:
    """The orchestrator fails the tree when its budget is crossed: the root's record ends before the other
    children's and before the coordinator's handler has ended and logged its message."""
    for _ in range(300):
        try:
            recording = await runtime.export_run(run_id)
        except RunNotEndedError:
            recording = None
        if recording is not None and any(
            json.loads(bytes(line.entry)).get("type") == "msg.received"
            for line in recording.logs
            if line.agent_id == "coordinator/budgeted" and not line.log
        ):
            return recording
        await asyncio.sleep(0.1)
    raise AssertionError("the coordinator's message was not logged within 30 s")


async def test_the_pipeline_budgeted_run_replays_its_failure(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    """`pipeline.budgeted`: the tree fails cluster-wide when its 200-token budget is crossed."""
    await start_worker(pipeline.app)
    run_id = await _pipeline_run(runtime, "budgeted", "Why is the sky blue?", 200)
    record = await runtime.wait_run(run_id, timeout=60)
    assert record.status.value == "failed", record
    report = await assert_replays(await _export_when_settled(runtime, run_id), pipeline.app)
    assert report.replayed[:1] == [run_id], report.notes
