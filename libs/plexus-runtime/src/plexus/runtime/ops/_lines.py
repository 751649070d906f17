"""A text stream that lets out whole lines only, so lines written by several threads never mix.

`plexus dev` copies its services' output into its own stdout from one thread per service while the user's
script prints from the main thread; ``print("answer:", text)`` is three writes, and a service's line could
land between them (seen in the quickstart: ``answer: <an orchestrator log line>From the model: ...``).
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import AsyncIterator
from typing import TextIO

__all__ = ["WholeLines", "whole_lines"]


@contextlib.asynccontextmanager
async def whole_lines() -> AsyncIterator[None]:
    """This process's stdout is a `WholeLines` stream while the block (or the decorated coroutine) runs."""
    stdout = sys.stdout
    sys.stdout = WholeLines(stdout)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = stdout


class WholeLines(io.TextIOBase):
    """Wraps ``out``: each thread's text is held until it ends a line (or the thread flushes), then written
    with the line's other pieces at once, under one lock."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._lock = threading.Lock()
        self._partial: dict[int, str] = {}

    def write(self, s: str) -> int:
        with self._lock:
            thread = threading.get_ident()
            head, newline, tail = (self._partial.pop(thread, "") + s).rpartition("\n")
            if newline:
                self.out.write(head + newline)
                self.out.flush()
            if tail:
                self._partial[thread] = tail
        return len(s)

    def flush(self) -> None:
        with self._lock:
            # An explicit flush lets a line out unfinished (a prompt written with end="").
            tail = self._partial.pop(threading.get_ident(), "")
            if tail:
                self.out.write(tail)
            self.out.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.out.isatty()

    def fileno(self) -> int:
        return self.out.fileno()
