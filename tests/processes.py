"""`plexus` commands as real processes for tests: output to a log file, killed by PID at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def plexus_process(argv: list[str], log: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m plexus.runtime.cli *argv`` from the repository root, stdout and stderr to ``log``, with
    exactly the environment ``env`` plus the repository on ``PYTHONPATH``; SIGKILLed if still running."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plexus.runtime.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONPATH": str(REPO)},
            cwd=REPO,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
