"""The local cluster's processes by identity: a PID with the start time the kernel gave it.

A PID alone names whatever process holds it now: after a process exits its PID may be reused, so `down` and
`restart` signal a recorded PID only while ``/proc/<pid>/stat`` still shows the start time recorded with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["alive", "same_process", "start_time", "stop"]


def _fields(pid: int) -> list[str] | None:
    """The stat fields after the command name (which may hold spaces and parentheses): state first."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, field 22 of its stat); None when no such process."""
    fields = _fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by the process that started it, is not)."""
    fields = _fields(pid)
    return fields is not None and fields[0] != "Z"


def same_process(pid: int, started: int | None) -> bool:
    """``pid`` is still the process recorded with start time ``started`` (None: not recorded, so unknown:
    a state file written before start times were recorded is trusted as it was)."""
    if not alive(pid):
        return False
    return started is None or start_time(pid) == started


def stop(processes: dict[str, tuple[int, int | None]], grace_s: float = 10.0) -> list[str]:
    """SIGTERM each (name -> (pid, start time)) still the recorded process, SIGKILL those left after
    ``grace_s``; returns the names that were no longer theirs (exited, restarted or PID reused)."""
    gone = [name for name, (pid, started) in processes.items() if not same_process(pid, started)]
    ours = {name: p for name, p in processes.items() if name not in gone}
    for pid, _ in ours.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid, started in ours.values():
        while same_process(pid, started) and time.monotonic() < deadline:
            time.sleep(0.1)
        if same_process(pid, started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return gone
