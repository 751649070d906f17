"""Durable timers (docs/schedules.md): how late a burst of one-shot timers fires; what pending ones cost.

``uv run --no-sync python -m bench.timers_bench [--mode quick|full] [--fire N] [--spread S] [--pending M]``
(``bench.run`` calls it with the mode only; the flags override the mode's sizes). It starts its
own nats-server (monitoring port on) and one in-process worker serving two durable types: ``setter``, whose
handler schedules a batch of timers with ``ctx.schedule_message(..., at=...)`` (written by its commit), and
``sink``, whose handler notes how late each fired message arrived.

- **Fire delay**: N one-shot timers due within S seconds (full: 10,000 within one minute, issue 40's
  size; quick: 500 within one second), their due times spread evenly over it, set ahead of time; the delay
  is the fired message's arrival in the sink's handler minus its due time, so it holds the server's fire,
  the sourcing into ``PLEXUS_INBOX``, the worker's intake and the queue behind the burst (64 sink keys).
  ``timers.fire.*`` in ms, p50 and p99.
- **Pending cost**: M timers (full: 100,000; quick: 5,000) due in a day: ``PLEXUS_SCHEDULES``'s bytes, the
  server's memory (``/varz`` ``mem``, its RSS) and this process's RSS (the worker's), before and after.
  ``timers.pending.*``.

Prints one ``RESULT <json>`` line (bench/common.py protocol). Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import resource
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import Results, percentile

SINKS = 64
PER_SETTER = 100  # timers one setter message schedules (one commit)
SETTERS_IN_FLIGHT = 8


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _monitor(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=10) as answer:
        loaded: dict[str, Any] = json.loads(answer.read())
        return loaded


#: mode -> (timers in the burst, the burst's spread in seconds, pending timers)
SIZES = {"quick": (500, 1.0, 5_000), "full": (10_000, 60.0, 100_000)}


async def _run(fire_n: int, spread: float, pending_n: int) -> Results:
    from plexus.core import AgentId, BaseBlock, TextBlock
    from plexus.runtime import Agent, App, Context, NatsServer, Runtime, Worker, WorkerConfig

    arrivals: list[float] = []  # delay (s) of each fired message at the sink
    all_in = asyncio.Event()
    expected = [fire_n]

    class Setter(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            job = json.loads(getattr(blocks[0], "text", "{}"))
            for i in range(job["first"], job["first"] + job["count"]):
                due = job["base"] + job["spread"] * i / job["total"]
                await ctx.schedule_message(
                    AgentId("sink", f"s{i % SINKS}"),
                    [TextBlock(text=repr(due))],
                    at=datetime.datetime.fromtimestamp(due, datetime.UTC),
                )
            return []

    class Sink(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            arrivals.append(time.time() - float(getattr(blocks[0], "text", "0")))
            if len(arrivals) >= expected[0]:
                all_in.set()
            return []

    app = App()
    app.register("setter", lambda _id: Setter(), description="schedules a batch of timers")
    app.register("sink", lambda _id: Sink(), description="notes how late each timer fired")
    results = Results(
        info={"fire_timers": fire_n, "fire_spread_s": spread, "pending_timers": pending_n, "sink_keys": SINKS}
    )

    async def set_timers(client: Runtime, total: int, base: float, spread: float, tag: str) -> float:
        gate = asyncio.Semaphore(SETTERS_IN_FLIGHT)

        async def one(first: int) -> None:
            job: dict[str, float] = {"first": first, "count": min(PER_SETTER, total - first), "total": total}
            job.update(base=base, spread=spread)
            async with gate:
                await client.send_message(
                    [TextBlock(text=json.dumps(job))], AgentId("setter", f"{tag}{first}"), timeout=120
                )

        t0 = time.perf_counter()
        await asyncio.gather(*(one(first) for first in range(0, total, PER_SETTER)))
        return time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="plexus-timers-") as tmp:
        server = NatsServer(store_dir=Path(tmp) / "n").start()
        try:
            assert server.monitor_port is not None
            server_rt = await Runtime.connect(server.url)
            worker = Worker(app, server_rt, WorkerConfig(concurrency=SINKS))
            await worker.start()
            client = await Runtime.connect(server.url)
            try:
                # Warm-up: activations of the setters' and sinks' paths, one timer fired per sink key.
                expected[0] = SINKS
                await set_timers(client, SINKS, time.time() + 1.0, 0.0, "w")
                await asyncio.wait_for(all_in.wait(), 120)

                # Fire delay: fire_n timers due within `spread` seconds, set well before the first is due
                # (handlers set ~10,000 timers/s on one node: the lead leaves a wide margin).
                arrivals.clear()
                all_in.clear()
                expected[0] = fire_n
                lead = max(5.0, fire_n / 500)
                base = time.time() + lead
                set_s = await set_timers(client, fire_n, base, spread, "f")
                results.info["fire_set_s"] = round(set_s, 2)
                results.info["fire_set_before_due"] = time.time() < base
                await asyncio.wait_for(all_in.wait(), lead + spread + 300)
                delays_ms = [d * 1000 for d in arrivals]
                results.add("timers.fire.p50", "ms", percentile(delays_ms, 50))
                results.add("timers.fire.p99", "ms", percentile(delays_ms, 99))
                results.add("timers.fire.set_rate", "timers/s", fire_n / set_s)
                await asyncio.sleep(3)  # the fired copies settle (acks, inbox)

                # Pending cost: pending_n timers due in a day.
                stream = "PLEXUS_SCHEDULES"
                bytes_before = (await client.js.stream_info(stream)).state.bytes
                mem_before = _monitor(server.monitor_port, "varz")["mem"]
                rss_before = _rss_mb()
                set_s = await set_timers(client, pending_n, time.time() + 86_400, 3600.0, "p")
                await asyncio.sleep(3)
                info = await client.js.stream_info(stream)
                mem_after = _monitor(server.monitor_port, "varz")["mem"]
                jsz = _monitor(server.monitor_port, "jsz")
                grown = info.state.bytes - bytes_before
                results.info["pending_set_s"] = round(set_s, 2)
                results.info["jsz_storage_mb"] = round(jsz.get("storage", 0) / 1e6, 2)
                results.add("timers.pending.stream_mb", "MB", grown / 1e6)
                results.add("timers.pending.stream_per_timer", "B", grown / pending_n)
                results.add("timers.pending.server_mem_mb", "MB", (mem_after - mem_before) / 1e6)
                results.add("timers.pending.server_mem_per_timer", "B", (mem_after - mem_before) / pending_n)
                results.add("timers.pending.worker_rss_mb", "MB", _rss_mb() - rss_before)
            finally:
                await client.close()
                await worker.stop()
                await server_rt.close()
        finally:
            server.cleanup()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.timers_bench", description=__doc__)
    parser.add_argument("--mode", choices=("quick", "full"), default="quick")
    parser.add_argument("--fire", type=int, help="timers in the burst (default: the mode's)")
    parser.add_argument("--spread", type=float, help="seconds the burst's due times spread over")
    parser.add_argument("--pending", type=int, help="pending timers (default: the mode's)")
    args = parser.parse_args()
    fire_n, spread, pending_n = SIZES[args.mode]
    results = asyncio.run(
        _run(
            args.fire or fire_n,
            spread if args.spread is None else args.spread,
            args.pending or pending_n,
        )
    )
    for name, entry in results.metrics.items():
        print(f"{name:<40} {entry['values'][0]:12.3f} {entry['unit']}")
    results.emit()


if __name__ == "__main__":
    main()
