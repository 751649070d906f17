"""The import-linter contract that keeps other packages off private modules lists them by hand: every
private module of plexus.core and plexus.runtime must be on it, or a new one is silently importable."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_private_module_of_core_and_runtime_is_forbidden_to_other_packages() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    forbidden: set[str] = set()
    for contract in config["tool"]["importlinter"]["contracts"]:
        forbidden.update(contract.get("forbidden_modules", []))
    private = {
        f"plexus.{package}.{path.stem}"
        for package in ("core", "runtime")
        for path in (REPO / "libs" / f"plexus-{package}" / "src" / "plexus" / package).glob("_*.py")
        if path.stem != "__init__"
    }
    assert private, "no private modules found: the layout changed"
    assert sorted(private - forbidden) == []
