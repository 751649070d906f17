"""Which modules a fresh interpreter has imported after running some code (start-up cost guards)."""

from __future__ import annotations

import json
import subprocess
import sys


def modules_after(code: str, modules: tuple[str, ...]) -> dict[str, bool]:
    """Run ``code`` in a new interpreter; for each of ``modules``, whether it got imported."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {modules!r}}}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    result: dict[str, bool] = json.loads(out.stdout.splitlines()[-1])
    return result
