"""The cyclic garbage collector's thresholds while workers run in this process.

CPython collects its youngest generation every 700 net allocations of container objects. A worker
keeps ≈ 100 messages in flight for tens of milliseconds each, so their futures, tasks and envelopes
survive a few young collections and are promoted to the oldest generation before they die, and that
churn triggers a full collection — a pass over every live object, the activations included — many
times a second. A worker holding 25k activations spent ≈ 30 % of its CPU there (`bench.plexus_bench`,
distinct keys). With a young threshold of 20,000 transient objects are freed by reference counting
before a collection sees them, and full collections become rare.

The thresholds are the process's: the first worker whose start succeeds sets them, the last to stop puts
back what it found (`WorkerConfig.gc_threshold`; None leaves the collector alone).
"""

from __future__ import annotations

import gc

__all__ = ["DEFAULT_GC_THRESHOLD", "GcThresholds", "check_gc_threshold"]

#: Young, middle and old generation thresholds while a worker runs (see the module's docstring).
DEFAULT_GC_THRESHOLD = (20_000, 10, 10)


def check_gc_threshold(value: object) -> None:
    """Raise ValueError unless `value` is None or three non-negative ints (as `gc.set_threshold` takes)."""
    if value is None:
        return
    if (
        not isinstance(value, tuple)
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise ValueError(
            f"gc_threshold must be None or three non-negative ints (young, middle, old), not {value!r}"
        )


class GcThresholds:
    """Process-wide holder: `acquire` by each starting worker, `release` by each stopping one."""

    _users = 0
    _found: tuple[int, int, int] | None = None

    @classmethod
    def acquire(cls, threshold: tuple[int, int, int] | None) -> bool:
        """Apply `threshold` if no other worker of this process holds the collector; True if counted."""
        if threshold is None:
            return False
        if cls._users == 0:
            cls._found = gc.get_threshold()
            gc.set_threshold(*threshold)
        cls._users += 1
        return True

    @classmethod
    def release(cls) -> None:
        """One counted worker stopped; the last one restores the thresholds found by the first."""
        if cls._users == 0:
            return
        cls._users -= 1
        if cls._users == 0 and cls._found is not None:
            gc.set_threshold(*cls._found)
            cls._found = None
