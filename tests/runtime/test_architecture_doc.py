"""docs/architecture.md's diagram of a message's path names modules that exist, in the path's order, and the
pipeline's docstring (the one place its order is written) says what the worker builds."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import plexus.runtime.worker.pipeline
from plexus.runtime.worker.pipeline._chains import HandleChains

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
STAGES = ["client", "inbox", "partition", "intake", "mailbox", "pipeline", "commit", "reply/ack"]
MODULE = re.compile(r"\bplexus(?:\.\w+)+")
BOX = re.compile(r'^\s*(\w+)\["([^"]+)"\]\s*$', re.MULTILINE)


def _diagram() -> str:
    section = DOC.read_text().split("### A message's path", 1)[1]
    return section.split("```mermaid\n", 1)[1].split("```", 1)[0]


def _boxes() -> list[tuple[str, str]]:
    """(stage, module) per box, in the diagram's order: a box's label starts with its stage."""
    boxes = []
    for _, label in BOX.findall(_diagram()):
        modules = MODULE.findall(label)
        assert len(modules) == 1, f"box {label!r} names {len(modules)} modules, not one"
        boxes.append((label.split(":", 1)[0], modules[0]))
    return boxes


def test_every_box_of_a_messages_path_names_a_module_that_exists() -> None:
    boxes = _boxes()
    assert [stage for stage, _ in boxes] == STAGES
    missing = []
    for stage, module in boxes:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            missing.append(f"{stage}: {module}")
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_boxes_are_linked_in_the_paths_order() -> None:
    ids = [box_id for box_id, _ in BOX.findall(_diagram())]
    assert " --> ".join(ids) in _diagram()


def test_the_pipelines_docstring_states_the_handle_chains_order() -> None:
    doc = " ".join((plexus.runtime.worker.pipeline.__doc__ or "").split())
    chain = doc.split("fencing → commit retry → handle → ", 1)[1]
    order = chain.split(" → app interceptors → the handler", 1)[0]
    unused: Any = None  # the chain's collaborators: building it calls none of them
    chains = HandleChains(unused, unused, unused, [], unused)
    built = [type(i).__name__.removesuffix("Interceptor") for i in chains._all]
    assert [name.replace(" ", "").lower() for name in order.split(" → ")] == [b.lower() for b in built]


def test_the_layer_table_names_every_module_of_plexus_runtime() -> None:
    """Each row of the layer table names its subpackage's modules (``_x`` or ``pipeline/``'s); a module added
    without a mention there is a table that no longer shows the architecture."""
    package = Path(plexus.runtime.worker.pipeline.__file__).resolve().parents[2]
    table = DOC.read_text().split("| layer (bottom up) |", 1)[1].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    for line in table.splitlines()[2:]:  # a first cell may name siblings: `client/` \| `_app`
        for name in line.split(" | ")[0].removeprefix("| ").split("\\|"):
            rows[name.strip().strip("`")] = line
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if path.name == "__init__.py" or len(relative.parts) == 1:
            continue  # the top-level modules are rows of their own
        row = rows.get(f"{relative.parts[0]}/", "")
        if f"`{path.stem}`" not in row:
            missing.append(str(relative))
    assert not missing, f"docs/architecture.md's layer table does not name: {missing}"
