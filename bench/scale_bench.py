"""Horizontal scaling: an I/O-bound durable agent type served by 1, 2 and 4 worker processes.

``uv run --no-sync python -m bench.scale_bench [--url URL] [--mode quick|full]`` (``bench.run`` calls it;
without ``--url`` it starts its own nats-server). Each handler awaits 50 ms, as an agent waiting on a model
does, and each worker runs at most ``--concurrency`` handlers at once, so one worker serves at most
concurrency / 50 ms messages per second and throughput can only grow by adding workers. The client keeps
enough messages in flight for four workers, over a pool of keys spread across the partitions. It reports:

- ``scale.N`` (msg/s) for N = 1, 2, 4 workers and ``scale.ratio.N`` = throughput(N) / throughput(1)
  (goal >= 0.9 x N);
- rebalancing, from the leases in ``plexus_leases``: ``rebalance.join`` (a worker joins a running one:
  from its start until both hold their fair share), ``rebalance.leave`` (a worker stops gracefully:
  until the other holds every partition) and ``rebalance.crash`` (a worker is killed with SIGKILL: until
  the other holds every partition, which waits for the dead worker's leases to expire).

Workers run with the production defaults (16 partitions, lease TTL 10 s, heartbeat 2 s). Prints one
``RESULT <json>`` line (bench/common.py protocol). Not asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from bench.common import Results, closed_loop, ready

REPO = Path(__file__).resolve().parents[1]
TYPE = "io-bound"
HANDLER_S = 0.05
PARTITIONS = 16


# -- worker process ------------------------------------------------------------------------------------
async def _serve(url: str, concurrency: int) -> None:
    from plexus.core import BaseBlock
    from plexus.runtime import Agent, App, Context, Runtime, Worker, WorkerConfig

    class Waits(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            await asyncio.sleep(HANDLER_S)
            return blocks

    app = App()
    app.register(TYPE, lambda _id: Waits(), description="awaits 50 ms per message")
    rt = await Runtime.connect(url, partitions=PARTITIONS)
    worker = Worker(app, rt, WorkerConfig(concurrency=concurrency))
    await worker.start()
    print(f"WORKER {worker.worker_id}", flush=True)
    ready()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await worker.stop(drain_timeout=10)
    await rt.close()


class _Proc:
    def __init__(self, url: str, concurrency: int) -> None:
        cmd = [sys.executable, "-m", "bench.scale_bench", "--serve", "--url", url]
        cmd += ["--concurrency", str(concurrency)]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().split()
        if len(first) != 2 or first[0] != "WORKER" or self.proc.stdout.readline().strip() != "READY":
            self.kill()
            raise SystemExit(f"scale worker did not start: {first}")
        self.worker_id = first[1]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


# -- client --------------------------------------------------------------------------------------------
async def _owners(rt: object) -> dict[str, int]:
    """worker id -> partitions of the bench type it holds a lease on now (keys ``<ns>.<type>.<p>``)."""
    from plexus.runtime import Runtime
    from plexus.runtime.kernel import escape_token

    assert isinstance(rt, Runtime)
    prefix = f"{escape_token(rt.namespace)}.{escape_token(TYPE)}."
    counts: dict[str, int] = {}
    kv = rt.topology.leases
    try:
        keys = await kv.keys()
    except Exception:  # nats-py raises when the bucket holds no key yet
        return counts
    for key in keys:
        if not key.startswith(prefix):
            continue
        with contextlib.suppress(Exception):  # released between keys() and get()
            entry = await kv.get(key)
            owner = msgspec.json.decode(entry.value or b"{}").get("owner")
            if owner:
                counts[owner] = counts.get(owner, 0) + 1
    return counts


async def _wait_owners(rt: object, want: dict[str, int], timeout: float = 60.0) -> float:
    """Seconds until the lease holders are exactly `want`; raises at the deadline."""
    t0 = time.monotonic()
    while True:
        if await _owners(rt) == want:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"leases never reached {want}: {await _owners(rt)}")
        await asyncio.sleep(0.05)


async def _measure(url: str, quick: bool, concurrency: int) -> Results:
    from plexus.core import AgentId, TextBlock
    from plexus.runtime import Runtime

    results = Results(info={"handler_ms": HANDLER_S * 1e3, "worker_concurrency": concurrency})
    seconds = 6.0 if quick else 20.0
    inflight = concurrency * 4 * 2  # twice what four workers can run at once: never client-bound
    rt = await Runtime.connect(url, partitions=PARTITIONS)
    blocks = [TextBlock(text="x")]
    keys = 4096

    async def call(_lane: int, i: int) -> None:
        await rt.send_message(blocks, AgentId(TYPE, f"k{i % keys}"), timeout=60)

    workers: list[_Proc] = []
    try:
        for n in (1, 2, 4):
            while len(workers) < n:
                workers.append(_Proc(url, concurrency))
            share = PARTITIONS // n
            await _wait_owners(rt, {w.worker_id: share for w in workers})
            per_worker = concurrency / HANDLER_S
            await closed_loop(int(per_worker * n), inflight, call)  # warm-up: activations, caches
            total = int(per_worker * n * seconds)
            rate, _ = await closed_loop(total, inflight, call)
            results.add(f"scale.{n}", "msg/s", rate)
            print(f"scale: {n} worker(s) {rate:8.1f} msg/s", file=sys.stderr, flush=True)
        base = results.metrics["scale.1"]["values"][0]
        for n in (1, 2, 4):
            results.add(f"scale.ratio.{n}", "x", results.metrics[f"scale.{n}"]["values"][0] / base)
        # Rebalancing: back to one worker, then one joins, leaves gracefully, joins again and crashes.
        for w in workers[1:]:
            w.stop()
        workers = workers[:1]
        await _wait_owners(rt, {workers[0].worker_id: PARTITIONS})
        joiner = _Proc(url, concurrency)
        t_started = time.monotonic() - joiner.started
        half = PARTITIONS // 2
        waited = await _wait_owners(rt, {workers[0].worker_id: half, joiner.worker_id: half})
        results.add("rebalance.join", "s", waited + t_started)
        t0 = time.monotonic()
        joiner.stop()
        await _wait_owners(rt, {workers[0].worker_id: PARTITIONS})
        results.add("rebalance.leave", "s", time.monotonic() - t0)
        crasher = _Proc(url, concurrency)
        await _wait_owners(rt, {workers[0].worker_id: half, crasher.worker_id: half})
        t0 = time.monotonic()
        crasher.kill()
        await _wait_owners(rt, {workers[0].worker_id: PARTITIONS})
        results.add("rebalance.crash", "s", time.monotonic() - t0)
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                w.kill()
        await rt.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--url", help="an existing nats-server (default: start one)")
    parser.add_argument("--mode", choices=["quick", "full"], default="quick")
    parser.add_argument("--concurrency", type=int, default=4, help="handlers at once per worker")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.url, args.concurrency))
        return
    server = None
    if not args.url:
        from plexus.runtime import NatsServer

        server = NatsServer()
        server.start()
    try:
        results = asyncio.run(_measure(args.url or server.url, args.mode == "quick", args.concurrency))  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.stop()
    print("RESULT " + json.dumps({"metrics": results.metrics, "info": results.info}), flush=True)


if __name__ == "__main__":
    main()
