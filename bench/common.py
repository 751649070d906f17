"""What every bench process shares: sizes, the result protocol, timing and statistics helpers.

Standard library only: `autogen_bench.py` imports this module inside the isolated AutoGen venv, where
neither Plexus nor nats-py is installed.

Protocol: a server-side process prints ``READY`` on stdout once it serves; a client process prints one line
``RESULT <json>`` holding ``{"metrics": {name: {"unit": str, "values": [one per repeat]}}, "info": {...}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

#: The text every system sends and echoes back (same size everywhere; ~100 bytes like the anchors).
PAYLOAD = "x" * 100

READY = "READY"
RESULT = "RESULT "


@dataclass(frozen=True)
class Sizes:
    """Message counts for one mode (quick keeps the whole bench under two minutes on 2 cores)."""

    repeats: int
    keys_repeats: int  #: repeats of the key-scaling scenario (each adds keys_many live activations)
    seq: int  #: messages for 1 in flight
    conc: int  #: messages for 10 / 100 in flight
    durable_seq: int
    durable_conc: int
    fanout: int  #: publications (each to 10 subscribers)
    keys_small: int  #: messages over 10 keys
    keys_many: int  #: distinct keys (one message each)
    consume: int  #: ctx.usage() calls per repeat, process-local budget
    consume_cluster: int  #: ctx.usage() calls per repeat (one orchestrated run), JetStream counters
    progress: int  #: progress events per repeat


QUICK = Sizes(
    repeats=3,
    keys_repeats=3,
    seq=300,
    conc=2_000,
    durable_seq=200,
    durable_conc=1_000,
    fanout=1_000,
    keys_small=2_000,
    keys_many=5_000,
    consume=5_000,
    consume_cluster=2_000,
    progress=300,
)
FULL = Sizes(
    repeats=5,
    keys_repeats=3,
    seq=2_000,
    conc=20_000,
    durable_seq=1_000,
    durable_conc=5_000,
    fanout=5_000,
    keys_small=10_000,
    keys_many=100_000,
    consume=50_000,
    consume_cluster=20_000,
    progress=2_000,
)


def sizes_for(mode: str) -> Sizes:
    return QUICK if mode == "quick" else FULL


@dataclass
class Results:
    """Per-repeat values of each metric, printed as one RESULT line at the end of a client."""

    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, unit: str, value: float) -> None:
        entry = self.metrics.setdefault(name, {"unit": unit, "values": []})
        entry["values"].append(value)

    def emit(self) -> None:
        print(RESULT + json.dumps({"metrics": self.metrics, "info": self.info}), flush=True)


def emit_once(metrics: dict[str, float], info: dict[str, Any]) -> None:
    """The RESULT line of a client that measured each metric once: ``×`` for a name ending in ``ratio``,
    milliseconds otherwise."""
    results = Results(info=dict(info))
    for name, value in metrics.items():
        results.add(name, "×" if name.endswith("ratio") else "ms", value)
    results.emit()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; enough for latency summaries."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def summarise(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def closed_loop(
    total: int, inflight: int, call: Callable[[int, int], Awaitable[None]]
) -> tuple[float, list[float]]:
    """Run `total` calls with `inflight` lanes, each lane sequential; returns (msgs/s, latencies in s).

    `call(lane, i)` gets its lane (so a lane can use its own agent key) and a global message index.
    """
    latencies: list[float] = []
    counter = iter(range(total))

    async def lane(n: int) -> None:
        for i in counter:
            t0 = time.perf_counter()
            await call(n, i)
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(lane(n) for n in range(inflight)))
    elapsed = time.perf_counter() - start
    return total / elapsed, latencies


async def measure_rr(
    results: Results,
    prefix: str,
    sizes: Sizes,
    call: Callable[[int, int], Awaitable[None]],
    levels: tuple[int, ...] = (1, 10, 100),
    seq: int | None = None,
    conc: int | None = None,
) -> None:
    """Warm-up, then `repeats` closed loops per in-flight level; records msg/s and the 1-in-flight p50."""
    await closed_loop(min(200, sizes.seq), 10, call)  # warm-up: connections, caches, activations
    for _ in range(sizes.repeats):
        for level in levels:
            count = (seq or sizes.seq) if level == 1 else (conc or sizes.conc)
            rate, lat = await closed_loop(count, level, call)
            results.add(f"{prefix}.{level}", "msg/s", rate)
            if level == 1:
                results.add(f"{prefix}.1.p50", "ms", percentile(lat, 50) * 1e3)


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (Linux /proc), in bytes."""
    path = f"/proc/{pid or os.getpid()}/status"
    with open(path) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def client_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("role", help="which side of the benchmark this process is")
    parser.add_argument("--url", required=True, help="nats:// URL or host:port of the system under test")
    parser.add_argument("--mode", choices=["quick", "full"], default="quick")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--app", default="main", help="which app a Plexus worker serves")
    return parser.parse_args()


def run(main: Callable[[], Coroutine[Any, Any, None]], loop: str) -> None:
    """Run `main` on the requested event loop (uvloop only when asked and importable)."""
    if loop == "uvloop":
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        uvloop.run(main())
    else:
        asyncio.run(main())


def ready() -> None:
    print(READY, flush=True)


def fail(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    sys.exit(1)
