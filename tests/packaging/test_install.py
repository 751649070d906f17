"""Issue 43: Plexus installs outside this repository. The five wheels are built, installed with uv into a
fresh virtual environment in a temp dir (registry dependencies, no workspace sources), and used there as a new
user would: `plexus --version`, `plexus --help`, the README's taste under `plexus dev`, and every import.
Every file installed under the `plexus` namespace must come from one of our distributions (RECORD says)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MEMBERS = (
    "libs/plexus-core",
    "libs/plexus-runtime",
    "libs/plexus-llm",
    "services/orchestrator",
    "services/gateway",
)
#: distribution name -> version, as this checkout declares them.
OURS = {
    project["name"]: project["version"]
    for project in (tomllib.loads((REPO / m / "pyproject.toml").read_text())["project"] for m in MEMBERS)
}

# The README's "A taste", as a user would save it in their own project; `plexus dev` hands main the runtime.
TASTE = """
from plexus.core import AgentId, TextBlock
from plexus.runtime import Agent, App, Context, Runtime

app = App()


@app.agent("greeter", description="says hello", capabilities=["chat"])
class Greeter(Agent):
    async def on_message(self, blocks, ctx: Context):
        self.state["count"] = self.state.get("count", 0) + 1
        await ctx.emit_progress("thinking")
        return [TextBlock(text=f"hello #{self.state['count']} from {ctx.agent_id.key}")]


async def main(rt: Runtime):
    for _ in range(2):
        reply = await rt.send_message([TextBlock(text="hi")], AgentId("greeter", "alice"), timeout=30)
        print("taste:", reply[0].text, flush=True)
"""

# Run inside the installed environment: which distribution owns each file under plexus/ (from RECORD).
OWNERS = """
import json
from importlib.metadata import distributions
owners = {}
for dist in distributions():
    for f in dist.files or ():
        if f.parts and f.parts[0] == "plexus":
            entry = owners.setdefault(dist.metadata["Name"], {"version": dist.version, "files": []})
            entry["files"].append(str(f))
print(json.dumps(owners))
"""


def _uv() -> str:
    """The uv running this suite (`uv run` exports UV), else the one on PATH or the Makefile's own copy."""
    for candidate in (os.environ.get("UV"), shutil.which("uv"), str(REPO / ".tools" / "bin" / "uv")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("uv not found (make setup installs it into .tools/)")


def _clean_env() -> dict[str, str]:
    """The environment minus everything that points at this workspace or its virtualenv."""
    drop = (
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "UV_PROJECT_ENVIRONMENT",
        "PYTHONHOME",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env["PLEXUS_GATEWAY_PORT"] = "0"  # a free port: tests may run beside a developer's `make run`
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv outside the workspace: the four top-level distributions from our wheels."""
    uv = _uv()
    root = tmp_path_factory.mktemp("user-project")
    wheels = root / "wheels"
    _run([uv, "build", "--all-packages", "--wheel", "--out-dir", str(wheels)], cwd=REPO, timeout=300)
    assert len(list(wheels.glob("*.whl"))) == len(MEMBERS)
    _run([uv, "venv", "--quiet", "--python", sys.executable, str(root / "venv")], cwd=root)
    python = root / "venv" / "bin" / "python"
    top = [name for name in OURS if not name.endswith("-core")]  # what a user asks for; core comes as a pin
    _run(
        [uv, "pip", "install", "--quiet", "--python", str(python), "--find-links", str(wheels), *top],
        cwd=root,
    )
    return root


def test_only_our_distributions_install_under_the_plexus_namespace(installed: Path) -> None:
    python = installed / "venv" / "bin" / "python"
    owners = json.loads(_run([str(python), "-c", OWNERS], cwd=installed).stdout)
    assert {name: info["version"] for name, info in owners.items()} == OURS
    files = [f for info in owners.values() for f in info["files"]]
    # A regular plexus/__init__.py (the registry's unrelated plexus-core ships one) ends the namespace.
    assert "plexus/__init__.py" not in files
    listed = _run([_uv(), "pip", "list", "--python", str(python)], cwd=installed).stdout
    print(listed)  # the report quotes it (pytest -s)


def test_plexus_command_and_imports_work_outside_the_workspace(installed: Path) -> None:
    bin_dir = installed / "venv" / "bin"
    assert _run([str(bin_dir / "plexus"), "--version"], cwd=installed).stdout.strip() == (
        f"plexus {OURS['plexus-kernel-runtime']}"
    )
    help_text = _run([str(bin_dir / "plexus"), "--help"], cwd=installed).stdout
    for command in ("worker", "dev", "orchestrator", "gateway", "runs"):  # the services' commands are found
        assert command in help_text
    code = "import plexus.llm, plexus.orchestrator, plexus.gateway, plexus.runtime as r; print(r.__file__)"
    where = Path(_run([str(bin_dir / "python"), "-c", code], cwd=installed).stdout.strip())
    assert where.is_relative_to(installed / "venv"), where  # not the workspace's sources


def test_readme_taste_runs_under_plexus_dev(installed: Path) -> None:
    app_dir = installed / "myproject"
    app_dir.mkdir()
    (app_dir / "taste.py").write_text(textwrap.dedent(TASTE))
    plexus = str(installed / "venv" / "bin" / "plexus")
    out = _run([plexus, "dev", "taste:app", "--run", "taste:main", "--once"], cwd=app_dir, timeout=180)
    lines = out.stdout.splitlines()
    assert "taste: hello #1 from alice" in lines, out.stdout[-3000:]
    assert "taste: hello #2 from alice" in lines  # the agent's state was committed between messages
    assert "plexus dev: stopped" in lines


@pytest.mark.parametrize("member", MEMBERS)
def test_each_distribution_imports_with_its_own_dependencies_alone(installed: Path, member: str) -> None:
    # A dependency that only a sibling declares (plexus.core used msgspec, which only plexus-runtime listed)
    # works in the workspace and in the full install, and breaks a user who installs that one package.
    name = tomllib.loads((REPO / member / "pyproject.toml").read_text())["project"]["name"]
    venv = installed / f"alone-{name}"
    _run([_uv(), "venv", "--quiet", "--python", sys.executable, str(venv)], cwd=installed)
    python = str(venv / "bin" / "python")
    wheels = str(installed / "wheels")
    _run(
        [_uv(), "pip", "install", "--quiet", "--python", python, "--find-links", wheels, name], cwd=installed
    )
    module = "plexus." + Path(member).name.removeprefix("plexus-")
    # Every module of the package, private ones included: an undeclared import anywhere fails here.
    code = (
        f"import importlib, pkgutil, {module} as m\n"
        f"for info in pkgutil.walk_packages(m.__path__, '{module}.'):\n"
        "    if not info.name.endswith('.testing'):\n"  # the pytest plugin needs pytest (extra `testing`)
        "        importlib.import_module(info.name)\n"
    )
    _run([python, "-c", code], cwd=installed)
