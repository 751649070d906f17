"""Issue 43: one version for the five distributions (VERSION), exact internal pins, and the installed
version reported by `plexus --version` and by each worker's registry entry."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from plexus.runtime.store._registry import WorkerInfo

REPO = Path(__file__).resolve().parents[2]
VERSION = (REPO / "VERSION").read_text().strip()
MEMBERS = (
    "libs/plexus-core",
    "libs/plexus-runtime",
    "libs/plexus-llm",
    "services/orchestrator",
    "services/gateway",
)


def _versions(*args: str, repo: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(repo / "scripts" / "versions.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_members_agree_with_version_file() -> None:
    out = _versions("check")
    assert out.returncode == 0, out.stderr
    names = {tomllib.loads((REPO / m / "pyproject.toml").read_text())["project"]["name"] for m in MEMBERS}
    assert names == {f"plexus-kernel-{n}" for n in ("core", "runtime", "llm", "orchestrator", "gateway")}


def test_set_bumps_every_member_and_pin(tmp_path: Path) -> None:
    for rel in ("scripts/versions.py", "VERSION", "LICENSE"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    for member in MEMBERS:
        shutil.copytree(REPO / member, tmp_path / member, ignore=shutil.ignore_patterns("src"))
    out = _versions("set", "7.8.9", repo=tmp_path)
    assert out.returncode == 0, out.stderr
    llm = tomllib.loads((tmp_path / "libs/plexus-llm/pyproject.toml").read_text())["project"]
    assert llm["version"] == "7.8.9"
    assert "plexus-kernel-runtime==7.8.9" in llm["dependencies"]
    assert (tmp_path / "VERSION").read_text().strip() == "7.8.9"
    # A member left behind is reported, with its name.
    gateway = tmp_path / "services/gateway/pyproject.toml"
    gateway.write_text(gateway.read_text().replace('"plexus-kernel-core==7.8.9"', '"plexus-kernel-core"'))
    out = _versions("check", repo=tmp_path)
    assert out.returncode == 1
    assert "plexus-kernel-gateway: depends on 'plexus-kernel-core'" in out.stderr
    assert _versions("set", "not a version", repo=tmp_path).returncode == 2


def test_plexus_version_is_the_installed_distribution_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"plexus {VERSION}"


def test_worker_registry_entry_carries_the_installed_version() -> None:
    # Before the rename was followed through, this looked up a distribution name that no longer existed
    # and every worker reported an empty version.
    assert WorkerInfo.local("w1").version == VERSION
