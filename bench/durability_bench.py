"""What the production durability settings cost: durable sends on R1 and R3, with nats-server's default
lazy fsync and with ``sync_interval: always`` (every write fsynced before it is acknowledged).

``uv run --no-sync python -m bench.durability_bench [--mode quick|full]`` (``bench.run`` calls it). It
starts its own servers (a single node for R1, a 3-node cluster on loopback for R3, each store on the same
disk), one in-process worker with a durable echo type and a client, and measures durable `send_message`
round trips with 1 and 16 in flight. Reports ``durability.<replicas>.<sync>.<inflight>`` in msg/s and
``durability.ratio.<replicas>.<inflight>`` = always / default (the cost of fsync on every write).
Prints one ``RESULT <json>`` line (bench/common.py protocol). Not asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
from pathlib import Path

from bench.common import Results, closed_loop

TYPE = "durable-echo"


async def _measure(urls: list[str], replicas: int, total: int, inflight: int) -> float:
    from plexus.core import AgentId, BaseBlock, TextBlock
    from plexus.runtime import Agent, App, Context, Runtime, Worker, WorkerConfig

    class Echo(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            return blocks

    app = App()
    app.register(TYPE, lambda _id: Echo(), description="durable echo")
    server_rt = await Runtime.connect(urls, replicas=replicas)
    worker = Worker(app, server_rt, WorkerConfig(concurrency=64))
    await worker.start()
    client = await Runtime.connect(urls)
    try:
        body = [TextBlock(text="x")]

        async def call(lane: int, i: int) -> None:
            await client.send_message(body, AgentId(TYPE, f"k{lane}"), timeout=60)

        await closed_loop(max(20, total // 10), inflight, call)  # warm: activations, consumers, leaders
        rate, _ = await closed_loop(total, inflight, call)
        return rate
    finally:
        await client.close()
        await worker.stop()
        await server_rt.close()


async def _run(mode: str) -> Results:
    from plexus.runtime import NatsServer
    from plexus.runtime.kernel import NatsCluster

    total = 200 if mode == "quick" else 1000
    results = Results(info={"total_per_point": total, "store": "one disk, loopback network"})
    for replicas in (1, 3):
        for sync in ("default", "always"):
            sync_interval = "always" if sync == "always" else None
            with tempfile.TemporaryDirectory(prefix="plexus-durability-") as tmp:
                server: NatsServer | NatsCluster
                if replicas == 1:
                    server = NatsServer(store_dir=Path(tmp) / "n", sync_interval=sync_interval).start()
                    urls = [server.url]
                else:
                    server = NatsCluster(3, base_dir=Path(tmp), sync_interval=sync_interval).start()
                    urls = server.urls
                try:
                    for inflight in (1, 16):
                        rate = await _measure(urls, replicas, total, inflight)
                        results.add(f"durability.r{replicas}.{sync}.{inflight}", "msg/s", rate)
                finally:
                    with contextlib.suppress(Exception):
                        server.cleanup()
    for replicas in (1, 3):
        for inflight in (1, 16):
            always = results.metrics[f"durability.r{replicas}.always.{inflight}"]["values"][0]
            default = results.metrics[f"durability.r{replicas}.default.{inflight}"]["values"][0]
            results.add(f"durability.ratio.r{replicas}.{inflight}", "x", always / default)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.durability_bench", description=__doc__)
    parser.add_argument("--mode", choices=("quick", "full"), default="quick")
    args = parser.parse_args()
    results = asyncio.run(_run(args.mode))
    print("RESULT " + json.dumps({"metrics": results.metrics, "info": results.info}), flush=True)


if __name__ == "__main__":
    main()
