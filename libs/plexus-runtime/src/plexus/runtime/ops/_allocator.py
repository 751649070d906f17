"""The worker process's memory allocator: as started (CPython's own), or jemalloc
(``plexus worker --allocator``).

CPython's small-object allocator keeps 1 MiB arenas and gives one back to the system only when every block in
it is free. After a burst of many activations is passivated the objects are gone, but the few long-lived
blocks renewed meanwhile (nats-py's futures, asyncio's timer handles) sit in arenas the burst filled, so RSS
stays near its peak (docs/benchmarks.md, "RSS after passivating all"). jemalloc returns free pages inside its
extents on a timer, so RSS comes back. It must be in place before the interpreter allocates anything, hence a
re-exec of the same command line with ``LD_PRELOAD`` and ``PYTHONMALLOC=malloc`` (the process keeps its PID,
so a container's PID 1 and a supervisor's bookkeeping stay right).
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

__all__ = ["ALLOCATORS", "DEFAULT_JEMALLOC_CONF", "AllocatorError", "allocator_in_use", "use_allocator"]

Allocator = Literal["default", "jemalloc"]
#: "default" changes nothing: CPython's allocator, unless the environment preloads another by hand.
ALLOCATORS: tuple[Allocator, ...] = ("default", "jemalloc")

#: Dirty pages go back after 1 s, via jemalloc's own background thread so an idle worker returns them too.
#: A ``MALLOC_CONF`` already in the environment wins.
DEFAULT_JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"

#: Set on the re-exec so a preload that did not take is reported instead of re-executed forever.
_REEXEC_MARK = "PLEXUS_ALLOCATOR_REEXEC"


class AllocatorError(Exception):
    """The allocator asked for cannot be had (not installed, not Linux, a preload that did not take)."""


def allocator_in_use(maps: Path = Path("/proc/self/maps")) -> Literal["python", "jemalloc"]:
    """ "jemalloc" when this process runs on it (preloaded, with CPython's small-object allocator off), else
    "python"."""
    if os.environ.get("PYTHONMALLOC") != "malloc":
        return "python"
    try:
        mapped = maps.read_text()
    except OSError:
        return "python"
    return "jemalloc" if "libjemalloc" in mapped else "python"


def _library(configured: str | None) -> str:
    if configured:
        if not Path(configured).is_file():
            raise AllocatorError(f"the jemalloc library {configured!r} does not exist")
        return configured
    # A bare soname is enough for LD_PRELOAD (the loader searches its usual paths), and find_library says
    # whether the loader's cache knows it.
    found = ctypes.util.find_library("jemalloc")
    if found is None:
        raise AllocatorError(
            "jemalloc is not installed (Debian/Ubuntu: apt-get install libjemalloc2; or name the library "
            "with PLEXUS_ALLOCATOR_LIBRARY)"
        )
    return found


def use_allocator(name: str, *, library: str | None = None, argv: list[str] | None = None) -> None:
    """Make this process run on allocator ``name``, re-executing its command line when that takes a restart.

    Returns when the process already runs on it; otherwise replaces the process (``os.execve``) and does not
    return. ``argv`` is the command line to re-run (default: this interpreter's own, ``sys.orig_argv``).
    Raises `AllocatorError` when the allocator cannot be had, including after a re-exec whose preload did not
    take (so a misconfigured host fails at start, not by growing).
    """
    if name not in ALLOCATORS:
        raise AllocatorError(f"unknown allocator {name!r} (expected one of {', '.join(ALLOCATORS)})")
    if name == "default" or allocator_in_use() == name:
        # Not inherited by what this process starts (a child asking for jemalloc re-executes as it should).
        os.environ.pop(_REEXEC_MARK, None)
        return
    if not sys.platform.startswith("linux"):
        raise AllocatorError(f"allocator 'jemalloc' is supported on Linux only, not {sys.platform}")
    if os.environ.get(_REEXEC_MARK):
        raise AllocatorError(
            f"restarted with LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r} but jemalloc is not loaded "
            "(a setuid binary, or a library that is not jemalloc?)"
        )
    env = _jemalloc_env(os.environ, _library(library))
    args = list(argv if argv is not None else sys.orig_argv)
    # Flushed now: whatever the streams hold is lost at exec.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *args[1:]], env)


def _jemalloc_env(environ: Mapping[str, str], library: str) -> dict[str, str]:
    env = dict(environ)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    env["PYTHONMALLOC"] = "malloc"
    env.setdefault("MALLOC_CONF", DEFAULT_JEMALLOC_CONF)
    env[_REEXEC_MARK] = "1"
    return env
