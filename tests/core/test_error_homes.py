"""Issue 36 item 10: every KernelError a Plexus package can raise is rebuilt as its class by any process,
whether or not it imported that package (`plexus.core._error_homes`)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import plexus
from plexus.core import KernelError
from plexus.core._error_homes import error_packages

REPO = Path(__file__).resolve().parents[2]


def _plexus_kernel_errors() -> dict[str, str]:
    """Every KernelError subclass defined by a Plexus package outside plexus.core: name -> its package."""
    for info in pkgutil.walk_packages(plexus.__path__, "plexus."):
        if ".tests" not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found: dict[str, str] = {}
    todo = [KernelError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        parts = cls.__module__.split(".")
        if parts[0] == "plexus" and parts[1] != "core":
            found[cls.__name__] = f"plexus.{parts[1]}"
    return found


def test_every_kernel_error_of_the_plexus_packages_lives_in_a_package_the_decoder_imports() -> None:
    found = _plexus_kernel_errors()
    assert found["RateLimitError"] == "plexus.llm"  # the walk reached plexus.llm
    assert found["RunNotFoundError"] == "plexus.runtime"
    declared = error_packages()
    assert {name: home for name, home in found.items() if home not in declared} == {}


_CLIENT = """
import json, sys
from plexus.core import KernelError, RemoteKernelError
wires = json.loads(sys.stdin.read())
before = sorted(m for m in ("plexus.llm", "plexus.runtime") if m in sys.modules)
out = []
for wire in wires:
    err = KernelError.from_wire(wire)
    out.append([type(err).__module__, type(err).__name__, isinstance(err, RemoteKernelError), repr(err)])
print(json.dumps({"before": before, "errors": out}))
"""


def test_a_fresh_interpreter_that_never_imported_them_rebuilds_their_classes() -> None:
    """A process that imported only plexus.core decodes a RateLimitError (plexus.llm) and a
    RunNotFoundError (plexus.runtime) as their classes, with their fields; an unknown type stays remote."""
    from plexus.llm import RateLimitError
    from plexus.runtime.orchestration import RunNotFoundError

    errors: list[KernelError] = [
        RateLimitError("slow down", "openai", 429, 2.5),
        RunNotFoundError("run_1"),
    ]
    wires = [e.to_wire() for e in errors]
    wires.append({"v": 1, "error_type": "FromANewerPeer", "message": "m", "fields": {"a": 1}})
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT],
        input=json.dumps(wires),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["before"] == []
    assert [row[:3] for row in result["errors"]] == [
        ["plexus.llm._errors", "RateLimitError", False],
        ["plexus.runtime.wire._orchestration", "RunNotFoundError", False],
        ["plexus.core._errors", "RemoteKernelError", True],
    ]
    assert [row[3] for row in result["errors"][:2]] == [repr(e) for e in errors]
