"""Freezing a child process (SIGSTOP) for outage tests, returning only once it has really stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import time

__all__ = ["freeze"]


async def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` (a child of this process) and return once every thread of it has stopped.

    ``kill`` only queues the signal: one thread of the server stops when it next runs, and only then are the
    others told to stop. Under load that takes tens of milliseconds, in which the server still answers
    requests sent after the ``kill``. The kernel reports the stop to the parent (``waitpid`` with
    ``WUNTRACED``) once the whole process has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        stopped, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)  # noqa: ASYNC222 - WNOHANG never blocks
        if stopped == pid and os.WIFSTOPPED(status):
            return
        assert stopped == 0, f"nats-server {pid} changed state unexpectedly: {status:#x}"
        assert time.monotonic() < deadline, f"nats-server {pid} did not stop within {timeout}s"
        await asyncio.sleep(0.001)
