"""plexus.runtime's two public doors: `plexus.runtime` for agents and clients, `plexus.runtime.kernel` for
services and extensions (docs/architecture.md, "Public modules")."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import plexus.runtime
import plexus.runtime.kernel

ROOT = Path(__file__).resolve().parents[2]
DOORS = [plexus.runtime, plexus.runtime.kernel]


def _python_sources() -> list[tuple[str, str]]:
    """The README's and docs' python code blocks and the examples, as (where, source)."""
    sources = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "examples").rglob("*.py"))]
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = md.read_text()
        for i, block in enumerate(text.split("```python\n")[1:]):
            sources.append((f"{md.relative_to(ROOT)} block {i + 1}", block.split("```", 1)[0]))
    return sources


def _names_from(module: str, source: str) -> set[str]:
    return {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module == module and node.level == 0
        for alias in node.names
    }


def test_the_user_door_stays_small() -> None:
    assert len(plexus.runtime.__all__) <= 30, sorted(plexus.runtime.__all__)


@pytest.mark.parametrize("door", DOORS, ids=lambda m: m.__name__)
def test_every_exported_name_resolves(door: object) -> None:
    names: list[str] = door.__all__  # type: ignore[attr-defined]
    assert len(names) == len(set(names))
    missing = [name for name in names if not hasattr(door, name)]
    assert missing == []


def test_the_doors_export_disjoint_names() -> None:
    assert set(plexus.runtime.__all__) & set(plexus.runtime.kernel.__all__) == set()


def test_what_readme_docs_and_examples_import_is_exported() -> None:
    sources = _python_sources()
    assert any("examples" in where for where, _ in sources)
    assert any(where.startswith("README.md") for where, _ in sources)
    for module in ("plexus.runtime", "plexus.runtime.kernel"):
        exported = set(importlib.import_module(module).__all__)
        strays = {
            where: sorted(names - exported)
            for where, source in sources
            if (names := _names_from(module, source)) - exported
        }
        assert strays == {}, module
