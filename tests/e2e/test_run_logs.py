"""Workers log each failed handler, orchestrators each ended run, as text or JSON lines (issue 44, item 4).

Real `plexus worker` and `plexus orchestrator` processes; their output goes to files the fixtures keep.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plexus.core import AgentId, KernelError, RetryPolicy, TextBlock
from plexus.runtime import Runtime, ServiceUnavailableError
from tests.runtime.conftest import REPO, WorkerProcess

from .conftest import OrchestratorProcess
from .test_orchestrated_runs import until

pytest.importorskip("plexus.orchestrator")

APP = "tests.e2e.apps_logs:app"
PING = [TextBlock(text="ping")]


async def lines_of(path: Path, want: Any, timeout: float = 20.0) -> list[str]:
    """The lines of ``path`` once ``want(lines)`` holds (a log line arrives within `timeout` s)."""
    async with asyncio.timeout(timeout):
        while True:
            lines = await asyncio.to_thread(read_lines, path)
            if want(lines):
                return lines
            await asyncio.sleep(0.1)


def read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def hosted(rt: Runtime) -> Any:
    async def check() -> bool:
        return len(await rt.workers("caller")) >= 1

    return check


def orchestrator_up(rt: Runtime) -> Any:
    async def check() -> bool:
        try:
            await rt.get_run("run_probe")
        except ServiceUnavailableError:
            return False
        except KernelError:
            return True  # a typed "unknown run" answer: the service is up
        return True

    return check


def json_lines(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


async def test_failed_handlers_and_ended_runs_are_logged(
    runtime: Runtime,
    worker_process: WorkerProcess,
    orchestrator_process: OrchestratorProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLEXUS_LOG_FORMAT", "json")  # the orchestrator's; the worker logs text
    orchestrator_process()
    worker_process(APP, "--heartbeat-ttl", "3", env={"PLEXUS_LOG_FORMAT": "text"})
    await until(hosted(runtime), 30, "worker registered")
    await until(orchestrator_up(runtime), 30, "orchestrator answering")
    once = RetryPolicy.no_retries()
    fine = await runtime.start_run(AgentId("fine", "a"), PING)
    broken = await runtime.start_run(AgentId("broken", "b"), PING, retry=once)
    caller = await runtime.start_run(AgentId("caller", "c"), PING, retry=once)
    assert (await runtime.wait_run(fine, timeout=30)).status == "completed"
    assert (await runtime.wait_run(broken, timeout=30)).status == "failed"
    assert (await runtime.wait_run(caller, timeout=30)).status == "failed"

    # The worker: one WARNING line per failed handler, naming the agent, the run and the error.
    worker_log = tmp_path / "worker0.log"
    worker_lines = await lines_of(worker_log, lambda ls: sum("handler failed" in line for line in ls) >= 2)
    failed = [line for line in worker_lines if "handler failed" in line]
    assert any(
        "WARNING plexus.worker" in line
        and "broken/b" in line
        and broken in line
        and "ValueError: the widget is broken" in line
        for line in failed
    ), failed
    assert any("caller/c" in line and caller in line and "AgentNotFoundError" in line for line in failed)
    assert not any("fine/a" in line for line in failed)

    # The orchestrator: one JSON object per line, one line per ended run.
    orch_log = tmp_path / "orchestrator0.log"

    def ended(lines: list[str]) -> dict[str, dict[str, Any]]:
        return {
            str(obj["run_id"]): obj
            for obj in json_lines(lines)
            if obj.get("logger") == "plexus.orchestrator.runs"
        }

    orch_lines = await lines_of(orch_log, lambda ls: {fine, broken, caller} <= set(ended(ls)))
    runs = ended(orch_lines)
    assert set(runs[fine]) >= {"ts", "level", "logger", "message", "agent_id", "root_id", "status", "usage"}
    assert runs[fine]["level"] == "INFO"
    assert runs[fine]["status"] == "completed"
    assert runs[fine]["agent_id"] == "fine/a"
    assert runs[fine]["root_id"] == fine
    assert runs[fine]["usage"] == {"tokens": 0, "cost_micros": 0, "turns": 0}
    assert runs[broken]["level"] == "WARNING"
    assert runs[broken]["status"] == "failed"
    assert "the widget is broken" in runs[broken]["error"]
    assert runs[caller]["level"] == "WARNING"
    assert runs[caller]["error_type"] == "AgentNotFoundError"
    assert "nosuchtype" in runs[caller]["message"]
    assert sum(1 for obj in json_lines(orch_lines) if obj.get("run_id") == fine) == 1


def test_a_bad_log_setting_is_refused_naming_it() -> None:
    for env, argv in (({"PLEXUS_LOG_LEVEL": "loud"}, []), ({}, ["--log-format", "xml"])):
        done = subprocess.run(
            [sys.executable, "-m", "plexus.runtime.cli", *argv, "types"],
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert ("PLEXUS_LOG_LEVEL" if env else "--log-format") in done.stderr
