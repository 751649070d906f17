"""Where a durable send's time goes: raw JetStream, the same plus the commit's write, and Plexus.

``raw.js`` (`bench.raw`) makes one JetStream write per message: publish (acked) → pull → ack → reply. A
Plexus durable send makes two: the inbox publish, and the commit's EventLog append (fenced, acked) before the
reply and the ack. So this runs a third serving side, the **floor**: raw.js plus that append — each message
appended to a per-key subject of a second file stream with ``Nats-Expected-Last-Subject-Sequence``, the ack
awaited, then acked and answered. The floor is what any implementation of the same guarantee pays here before
its framework does anything.

``python -m bench.durable_floor run [--rounds N]`` starts one nats-server and the three serving processes
(``bench.raw serve``, ``bench.durable_floor serve``, ``bench.plexus_bench serve --app main``), then drives
them in turn from this process, round after round (alternated, so a busy phase of the shared machine hits all
three), at 1 and 100 in flight. For each it prints the medians of msg/s and of the CPU time per message of the
nats-server, the serving process and the client (Linux ``/proc``), and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from bench.common import PAYLOAD, READY, closed_loop, ready
from plexus.core import AgentId, TextBlock
from plexus.runtime import NatsServer, Runtime

STREAM = "BENCH_FLOOR"
SUBJECT = "benchfloor.in"
CONSUMER = "bench_floor"
LOG_STREAM = "BENCH_FLOOR_LOG"
LOG_SUBJECT = "benchfloor.log"
#: Messages the floor's server handles at once (Plexus's worker: 4 × its concurrency of 64).
SLOTS = 256
LEVELS = ((1, 200), (100, 2_000))  # (in flight, messages per measurement)
WIDTHS = (12, 10, 9, 13, 9, 8, 7)


# -- the floor's serving side ----------------------------------------------------------------------------
async def serve(url: str) -> None:
    nc = await nats.connect(url, name="bench-floor-serve")
    js = nc.jetstream()
    for config in (
        js_api.StreamConfig(
            name=STREAM,
            subjects=[f"{SUBJECT}.>"],
            retention=js_api.RetentionPolicy.WORK_QUEUE,
            storage=js_api.StorageType.FILE,
            duplicate_window=120.0,
        ),
        js_api.StreamConfig(name=LOG_STREAM, subjects=[f"{LOG_SUBJECT}.>"], storage=js_api.StorageType.FILE),
    ):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(config.name or "")
        await js.add_stream(config)
    await js.add_consumer(
        STREAM,
        js_api.ConsumerConfig(
            durable_name=CONSUMER, ack_policy=js_api.AckPolicy.EXPLICIT, ack_wait=30.0, max_ack_pending=1024
        ),
    )
    sub = await js.pull_subscribe_bind(CONSUMER, stream=STREAM)
    last_seq: dict[str, int] = {}  # per key: the fence of its next append
    slots = asyncio.Semaphore(SLOTS)
    tasks: set[asyncio.Task[None]] = set()

    async def commit_then_answer(msg: Msg) -> None:
        try:
            key = msg.subject.rsplit(".", 1)[-1]
            headers = {"Nats-Expected-Last-Subject-Sequence": str(last_seq.get(key, 0))}
            ack = await js.publish(f"{LOG_SUBJECT}.{key}", msg.data, headers=headers, timeout=10)
            last_seq[key] = ack.seq
            await msg.ack()
            reply = (msg.headers or {}).get("Bench-Reply")
            if reply:
                await nc.publish(reply, msg.data)
        finally:
            slots.release()

    ready()
    while True:
        # One key has one message in flight (closed loops, a key per lane), so messages run concurrently.
        await slots.acquire()
        free = 1
        while free < 64 and not slots.locked():
            await slots.acquire()
            free += 1
        try:
            msgs = await sub.fetch(free, timeout=1.0)
        except TimeoutError:
            msgs = []
        for _ in range(free - len(msgs)):
            slots.release()
        for msg in msgs:
            task = asyncio.create_task(commit_then_answer(msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


# -- the driver ------------------------------------------------------------------------------------------
def _cpu_s(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(cmd: list[str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(READY):
        proc.kill()
        raise RuntimeError(f"{' '.join(cmd)} did not start; see {log}")
    return proc


def _js_caller(nc: Client, subject: str) -> Callable[[int, int], Awaitable[None]]:
    """raw.js's call: an acked JetStream publish with a dedup id, then the reply on our inbox."""
    js = nc.jetstream()
    pending: dict[str, asyncio.Future[bytes]] = {}
    inbox = nc.new_inbox()
    ids = itertools.count()
    data = PAYLOAD.encode()
    subscribed: list[bool] = []

    async def on_reply(msg: Msg) -> None:
        future = pending.pop(msg.subject.rsplit(".", 1)[-1], None)
        if future is not None and not future.done():
            future.set_result(msg.data)

    async def call(lane: int, i: int) -> None:
        if not subscribed:
            subscribed.append(True)
            await nc.subscribe(f"{inbox}.*", cb=on_reply)
        msg_id = f"m{next(ids)}-{time.time_ns()}"
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        pending[msg_id] = future
        headers = {"Nats-Msg-Id": msg_id, "Bench-Reply": f"{inbox}.{msg_id}"}
        await js.publish(f"{subject}.{lane}", data, headers=headers, timeout=10)
        await asyncio.wait_for(future, 10)

    return call


async def drive(rounds: int) -> None:
    from bench import raw

    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="durable-floor-") as tmp:
        logs = Path(tmp)
        server = NatsServer(store_dir=logs / "nats")
        server.start()
        procs: list[subprocess.Popen[str]] = []
        try:
            serving = {
                "raw.js": ["-m", "bench.raw", "serve", "--url", server.url],
                "floor": ["-m", "bench.durable_floor", "serve", "--url", server.url],
                "plexus.dur": ["-m", "bench.plexus_bench", "serve", "--app", "main", "--url", server.url],
            }
            pids = {}
            for name, args in serving.items():
                procs.append(_start([py, *args], logs / f"{name}.log"))
                pids[name] = procs[-1].pid
            nc = await nats.connect(server.url, name="bench-floor-client")
            await raw.ensure_js(nc)
            rt = await Runtime.connect(server.url)
            await rt.get("echo", lazy=False, timeout=30)
            blocks = [TextBlock(text=PAYLOAD)]
            agents = [AgentId("echo", f"lane{n}") for n in range(100)]

            async def plexus_call(lane: int, i: int) -> None:
                await rt.send_message(blocks, agents[lane], timeout=30)

            calls = {
                "raw.js": _js_caller(nc, raw.JS_SUBJECT),
                "floor": _js_caller(nc, SUBJECT),
                "plexus.dur": plexus_call,
            }
            for call in calls.values():  # warm-up: connections, activations, caches
                await closed_loop(300, 100, call)
            assert server.process is not None
            me, nats_pid = os.getpid(), server.process.pid
            rows: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
            for _ in range(rounds):
                for name, call in calls.items():
                    for inflight, count in LEVELS:
                        before = [_cpu_s(p) for p in (nats_pid, pids[name], me)]
                        rate, _ = await closed_loop(count, inflight, call)
                        after = [_cpu_s(p) for p in (nats_pid, pids[name], me)]
                        srv, own, client = ((b - a) / count * 1e6 for a, b in zip(before, after, strict=True))
                        rows.setdefault((name, inflight), []).append((rate, srv, own, client))
            await rt.close()
            await nc.drain()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)
            server.stop()
    _report(rows, rounds)


def _report(rows: dict[tuple[str, int], list[tuple[float, float, float, float]]], rounds: int) -> None:
    med = {k: [statistics.median(col) for col in zip(*v, strict=True)] for k, v in rows.items()}
    print(f"medians of {rounds} alternated rounds; CPU in µs per message")
    header = ("system", "in flight", "msg/s", "nats-server", "serving", "client", "total")
    print("".join(f"{h:>{w}}" for h, w in zip(header, WIDTHS, strict=True)))
    for (name, inflight), (rate, srv, serving, client) in med.items():
        total = srv + serving + client
        cells = (name, inflight, f"{rate:,.0f}", *(f"{v:.0f}" for v in (srv, serving, client, total)))
        print("".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS, strict=True)))
    for inflight, _ in LEVELS:
        plexus, raw_js, floor = (med[(n, inflight)][0] for n in ("plexus.dur", "raw.js", "floor"))
        print(
            f"{inflight} in flight: plexus/raw.js {plexus / raw_js:.2f}×, "
            f"floor/raw.js {floor / raw_js:.2f}×, plexus/floor {plexus / floor:.2f}×"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["run", "serve"])
    parser.add_argument("--url", help="the nats-server (serve)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.role == "serve":
        if not args.url:
            parser.error("serve needs --url")
        asyncio.run(serve(args.url))
    else:
        asyncio.run(drive(args.rounds))


if __name__ == "__main__":
    main()
