"""Measure the gateway's SSE path (issue 11 item 6; figures are reported, never asserted).

    python -m tests.gateway.measure_sse [--events 500] [--clients 100]

1. latency: a worker emits progress events; one SSE client receives them through a `plexus gateway` process;
   latency = receive time - the event's `ts` (same host clock), p50/p99.
2. fan-out: `--clients` SSE clients follow one tree whose root emits `--events` events; events/s delivered
   in total and the gateway process's CPU time per delivered event (from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from plexus.orchestrator import Orchestrator, OrchestratorConfig
from plexus.runtime import NatsServer, Runtime, Worker, WorkerConfig

from .apps import app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _follow(client: httpx.AsyncClient, run_id: str, latencies: list[float] | None) -> int:
    count = 0
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
                if data == "[DONE]":
                    return count
                if event == "progress":
                    count += 1
                    if latencies is not None:
                        latencies.append(time.time() - json.loads(data)["progress"]["ts"])
    return count


async def _start(client: httpx.AsyncClient, key: str, n: int, gap: float) -> str:
    body = {
        "agent_id": f"ticker/{key}",
        "input": [{"type": "text", "text": json.dumps({"n": n, "gap": gap})}],
    }
    response = await client.post("/v1/runs", json=body)
    response.raise_for_status()
    return str(response.json()["run_id"])


async def main(events: int, clients: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats")
        server.start()
        orch = await Orchestrator.connect(server.url, OrchestratorConfig())
        await orch.start()
        worker_rt = await Runtime.connect(server.url)
        worker = Worker(app, worker_rt, WorkerConfig())
        await worker.start()
        port = _free_port()
        gateway = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "plexus.runtime.cli", "gateway", "--dev", "--port", str(port)],
            *["--nats", server.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert gateway.stdout is not None
            await gateway.stdout.readline()  # "plexus gateway serving ..."
            limits = httpx.Limits(max_connections=clients + 10)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits
            ) as client:
                latencies: list[float] = []
                run_id = await _start(client, "latency", events, 0.005)
                await _follow(client, run_id, latencies)
                latencies.sort()
                p50 = statistics.median(latencies) * 1000
                p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
                print(f"latency worker -> SSE client: n={len(latencies)} p50={p50:.2f} ms p99={p99:.2f} ms")

                run_id = await _start(client, "fanout", events, 0.002)
                cpu0, t0 = _cpu_s(gateway.pid), time.perf_counter()
                counts = await asyncio.gather(*(_follow(client, run_id, None) for _ in range(clients)))
                cpu, wall = _cpu_s(gateway.pid) - cpu0, time.perf_counter() - t0
                delivered = sum(counts)
                print(
                    f"fan-out: {clients} clients x {events} events: {delivered} delivered in {wall:.2f} s ="
                    f" {delivered / wall:,.0f} events/s; gateway CPU {cpu:.2f} s ="
                    f" {cpu / delivered * 1e6:.0f} us/event"
                )
        finally:
            gateway.terminate()
            await asyncio.wait_for(gateway.wait(), timeout=30)
            await worker.stop(drain_timeout=2)
            await worker_rt.close()
            await orch.stop()
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--clients", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.clients))
