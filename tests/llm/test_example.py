"""examples/research_team.py runs offline end to end (`plexus dev` with an embedded nats-server,
orchestrator and worker) and reports a completed tree within its budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_research_team_runs_offline(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "plexus.runtime.cli", "dev", "examples.research_team:app"]
    cmd += ["--run", "examples.research_team:main"]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("run ") and "(offline (ScriptedModel))" in line for line in lines)
    assert any(line.startswith("run ") and ": completed" in line for line in lines), out.stdout[-3000:]
    assert "usage: 120 tokens of 20000, 8 turns of 30" in lines
    assert any("researcher/jetstream" in line for line in lines)
    assert any("writer/main" in line for line in lines)
    assert any("[planner streams]" in line for line in lines)
