"""The gateway's SSE path (issue 11 item 6), a `make bench` phase; reported, never asserted.

``uv run --no-sync python -m bench.sse_bench [--mode quick|full]`` starts its own nats-server, an
orchestrator and a worker (in this process) and ``plexus gateway --dev`` as a process of its own, then:

1. latency: the worker's agent emits progress events a few ms apart; one SSE client follows the run tree
   through the gateway; latency = receive time - the event's ``ts`` (same host clock), p50/p99;
2. fan-out: N SSE clients follow one tree; events/s delivered in total, and the gateway process's CPU time
   per delivered event (from /proc).

Prints one ``RESULT <json>`` line (bench/common.py protocol).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import Results, percentile
from plexus.core import BaseBlock, TextBlock
from plexus.orchestrator import Orchestrator, OrchestratorConfig
from plexus.runtime import Agent, App, Context, NatsServer, Runtime, Worker, WorkerConfig

app = App()


@app.agent("ticker", description="emits `n` progress events `gap` seconds apart")
class Ticker(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = json.loads("".join(getattr(b, "text", "") for b in blocks))
        for i in range(int(cmd["n"])):
            await ctx.emit_progress("thinking", [TextBlock(text=str(i))])
            await asyncio.sleep(float(cmd["gap"]))
        return [TextBlock(text="ticked")]


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


async def measure(events: int, clients: int) -> Results:
    results = Results(info={"events": events, "clients": clients})
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(store_dir=Path(tmp) / "nats").start()
        orch = await Orchestrator.connect(server.url, OrchestratorConfig())
        await orch.start()
        worker_rt = await Runtime.connect(server.url)
        worker = Worker(app, worker_rt, WorkerConfig())
        await worker.start()
        port = _free_port()
        gateway = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "plexus.runtime.cli", "gateway", "--dev", "--port", str(port)],
            *["--nats", server.url, "--rate-limit", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert gateway.stdout is not None
            await asyncio.wait_for(gateway.stdout.readline(), 60)  # "plexus gateway serving ..."
            limits = httpx.Limits(max_connections=clients + 10)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits
            ) as client:
                await _follow(client, await _start(client, "warm", 20, 0.005), None)
                latencies: list[float] = []
                await _follow(client, await _start(client, "latency", events, 0.005), latencies)
                results.add("sse.latency.p50", "ms", percentile(latencies, 50) * 1000)
                results.add("sse.latency.p99", "ms", percentile(latencies, 99) * 1000)
                run_id = await _start(client, "fanout", events, 0.002)
                cpu0, t0 = _cpu_s(gateway.pid), time.perf_counter()
                counts = await asyncio.gather(*(_follow(client, run_id, None) for _ in range(clients)))
                cpu, wall = _cpu_s(gateway.pid) - cpu0, time.perf_counter() - t0
                delivered = sum(counts)
                results.add("sse.fanout.events_per_s", "events/s", delivered / wall)
                results.add("sse.fanout.cpu_per_event", "µs", cpu / max(1, delivered) * 1e6)
                results.info["delivered"] = delivered
        finally:
            gateway.terminate()
            await asyncio.wait_for(gateway.wait(), timeout=30)
            await worker.stop(drain_timeout=2)
            await worker_rt.close()
            await orch.stop()
            server.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sse_bench")
    parser.add_argument("--mode", choices=("quick", "full"), default="quick")
    args = parser.parse_args()
    events, clients = (200, 50) if args.mode == "quick" else (500, 100)
    asyncio.run(measure(events, clients)).emit()


if __name__ == "__main__":
    main()
