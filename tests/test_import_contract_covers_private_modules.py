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
    private: set[str] = set()
    for package in ("core", "runtime"):
        root = REPO / "libs" / f"plexus-{package}" / "src" / "plexus" / package
        for path in root.rglob("_*.py"):
            if path.stem == "__init__":
                continue
            parts = path.relative_to(root).with_suffix("").parts
            private.add(".".join(("plexus", package, *parts)))
    assert private, "no private modules found: the layout changed"

    def covered(module: str) -> bool:
        # A forbidden package forbids its submodules (import-linter's default).
        parts = module.split(".")
        return any(".".join(parts[:i]) in forbidden for i in range(2, len(parts) + 1))

    assert sorted(m for m in private if not covered(m)) == []
