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

``--sides`` picks other sides, among them the floor's **variants** (`bench.floor_variants`), each the floor
with one property of Plexus's durable send added: ``floor-bytes`` (Plexus's envelope, append and reply
sizes), ``floor-parts`` (16 partitions by subject transform, a filtered pull consumer each plus 16 idle
ones, pulls of ≤ 8 over 256 shared slots), ``floor-ckpt`` (a checkpoint KV write every 16th message of a
key) and ``floor-all``; ``floor-parts4``, ``floor-parts1`` and ``floor-all4`` with 4 or 1 partitions per
type (pulls of ≤ 32 or ≤ 64); ``floor-parts-1type`` and ``floor-parts1-b8`` that separate the number of
consumers from the pull size; ``floor-all-busy`` (``floor-all`` burning 90 µs of CPU per message, what
Plexus's worker spends beyond it); and Plexus itself with 16, 4 or 1 partitions (``plexus.p16``,
``plexus.p4``, ``plexus.p1``, each on a nats-server of its own). E.g. ``run --rounds 5 --sides all --count
10000``. With other sides than the three it also prints the spread over the rounds at 100 in flight,
nats-server's messages and kilobytes in per message (``/varz``), and each variant's difference from the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from bench import floor_variants as fv
from bench.common import PAYLOAD, READY, closed_loop, ready
from bench.floor_variants import VARIANTS, Variant
from plexus.core import AgentId, TextBlock
from plexus.runtime import NatsServer, Runtime, Worker, WorkerConfig

STREAM = "BENCH_FLOOR"
SUBJECT = "benchfloor.in"
CONSUMER = "bench_floor"
LOG_STREAM = "BENCH_FLOOR_LOG"
LOG_SUBJECT = "benchfloor.log"
#: Messages the floor's server handles at once (Plexus's worker: 4 × its concurrency of 64).
SLOTS = 256
LEVELS = ((1, 200), (100, 2_000))  # (in flight, messages per measurement)
WIDTHS = (12, 10, 9, 13, 9, 8, 7)
#: Lanes of the closed loops at most (one key each).
MAX_LANES = 100
DEFAULT_SIDES = ["raw.js", "floor", "plexus.dur"]
#: Plexus with 16 (a control), 4 or 1 partitions per durable type (pulls ≤ 8, 32, 64), each on its own server.
PLEXUS_PARTITIONED = {"plexus.p16": 16, "plexus.p4": 4, "plexus.p1": 1}
ALL_SIDES = ["raw.js", *VARIANTS, "plexus.dur", *PLEXUS_PARTITIONED]


# -- the floor's serving side ----------------------------------------------------------------------------
def _names(variant: Variant) -> tuple[str, str, str, str, str]:
    """(inbox stream, inbox subject root, consumer, log stream, log subject root) of a serving side; the
    plain floor keeps the names it always had."""
    if variant.name == "floor":
        return STREAM, SUBJECT, CONSUMER, LOG_STREAM, LOG_SUBJECT
    root = f"bf{variant.tag.lower()}"
    return (
        f"{STREAM}_{variant.tag}",
        f"{root}.in",
        f"{CONSUMER}_{variant.tag.lower()}",
        f"{LOG_STREAM}_{variant.tag}",
        f"{root}.log",
    )


def _inbox_subject(variant: Variant, lane: int) -> str:
    """Where the client publishes lane `lane`'s messages (one key per lane)."""
    subject = _names(variant)[1]
    if variant.name == "floor":
        return f"{subject}.{lane}"
    return f"{subject}.echo.lane{lane}" if variant.parts else f"{subject}.lane{lane}"


async def serve(url: str, variant: Variant = VARIANTS["floor"]) -> None:
    nc = await nats.connect(url, name=f"bench-{variant.name}-serve")
    js = nc.jetstream()
    stream, subject, consumer, log_stream, log_subject = _names(variant)
    inbox = js_api.StreamConfig(
        name=stream,
        subjects=[f"{subject}.>"],
        retention=js_api.RetentionPolicy.WORK_QUEUE,
        storage=js_api.StorageType.FILE,
        duplicate_window=120.0,
    )
    if variant.parts:
        # Plexus's inbox: `<root>.in.<type>.<key>` stored as `<root>.inp.<type>.<partition>.<key>`.
        root = subject.rsplit(".", 1)[0]
        inbox.subjects = [f"{subject}.*.*"]
        inbox.subject_transform = js_api.SubjectTransform(
            src=f"{subject}.*.*",
            dest=f"{root}.inp.{{{{wildcard(1)}}}}.{{{{partition({variant.partitions},2)}}}}.{{{{wildcard(2)}}}}",
        )
    for config in (
        inbox,
        js_api.StreamConfig(name=log_stream, subjects=[f"{log_subject}.>"], storage=js_api.StorageType.FILE),
    ):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(config.name or "")
        await js.add_stream(config)
    bucket = f"bench_floor_ckpt_{variant.tag.lower()}"
    if variant.ckpt:
        with contextlib.suppress(NotFoundError):
            await js.delete_key_value(bucket)
        await js.create_key_value(
            js_api.KeyValueConfig(bucket=bucket, history=1, storage=js_api.StorageType.FILE)
        )
    last_seq: dict[str, int] = {}  # per key: the fence of its next append
    revisions: dict[str, int] = {}  # per key: its checkpoint's revision (the fence of the next write)
    handled: dict[str, fv.Handled] = {}
    append_ids = itertools.count()
    append_prefix = os.urandom(6).hex()
    slots = asyncio.Semaphore(SLOTS)
    tasks: set[asyncio.Task[None]] = set()

    async def commit_then_answer(msg: Msg) -> None:
        try:
            key = msg.subject.rsplit(".", 1)[-1]
            headers = msg.headers or {}
            if variant.bytes:
                msg_id, reply = fv.envelope_fields(msg.data)
            else:
                msg_id, reply = headers.get("Nats-Msg-Id", ""), headers.get("Bench-Reply", "")
            checkpoint = False
            if variant.ckpt:
                memory = handled.get(key) or handled.setdefault(key, fv.Handled())
                checkpoint = memory.add(msg_id)
            if variant.busy_us:
                fv.busy(variant.busy_us)
            expected = last_seq.get(key, 0)
            if variant.bytes:
                answer = fv.reply(msg_id)
                data = fv.append(msg_id, key, answer, marker=not checkpoint)
                fence = fv.append_headers(expected, log_stream, f"{append_prefix}-{next(append_ids)}")
                body = answer.encode()
            else:
                data = body = msg.data
                fence = {"Nats-Expected-Last-Subject-Sequence": str(expected)}
            ack = await js.publish(f"{log_subject}.{key}", data, headers=fence, timeout=10)
            last_seq[key] = ack.seq
            if checkpoint:
                # What `KeyValue.update` sends: a compare-and-swap on the key's last revision.
                saved = await js.publish(
                    f"$KV.{bucket}.default.echo.{key}",
                    memory.checkpoint(),
                    headers={"Nats-Expected-Last-Subject-Sequence": str(revisions.get(key, 0))},
                    timeout=10,
                )
                revisions[key] = saved.seq
            await msg.ack()
            if reply:
                await nc.publish(reply, body)
        finally:
            slots.release()

    async def start(msg: Msg) -> None:
        task = asyncio.create_task(commit_then_answer(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    if variant.parts:
        await _serve_partitions(nc, js, variant, stream, subject, consumer, slots, start)
        return
    await js.add_consumer(
        stream,
        js_api.ConsumerConfig(
            durable_name=consumer, ack_policy=js_api.AckPolicy.EXPLICIT, ack_wait=30.0, max_ack_pending=1024
        ),
    )
    sub = await js.pull_subscribe_bind(consumer, stream=stream)
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
            await start(msg)


async def _serve_partitions(
    nc: Client,
    js: JetStreamContext,
    variant: Variant,
    stream: str,
    subject: str,
    consumer: str,
    slots: asyncio.Semaphore,
    start: Callable[[Msg], Awaitable[None]],
) -> None:
    """Plexus's topology: a filtered consumer per partition of the echo type and of an idle second type
    (a worker's other durable type), each pulled by its own loop, all sharing the handler slots."""
    root = subject.rsplit(".", 1)[0]
    pullers = []
    for agent_type in ("echo", "idle")[: variant.types]:
        for p in range(variant.partitions):
            durable = f"{consumer}_{agent_type}_{p}"
            await js.add_consumer(
                stream,
                js_api.ConsumerConfig(
                    durable_name=durable,
                    filter_subject=f"{root}.inp.{agent_type}.{p}.>",
                    ack_policy=js_api.AckPolicy.EXPLICIT,
                    deliver_policy=js_api.DeliverPolicy.ALL,
                    ack_wait=30.0,
                    max_ack_pending=512,
                    max_deliver=-1,
                ),
            )
            pullers.append(fv.pull_partition(nc, stream, durable, slots, start, variant.max_batch))
    ready()
    await asyncio.gather(*pullers)


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


def _js_caller(
    nc: Client, subject: str, variant: Variant | None = None
) -> Callable[[int, int], Awaitable[None]]:
    """raw.js's call: an acked JetStream publish with a dedup id, then the reply on our inbox. With a
    `variant`, to that floor's inbox (lane n as key ``lane<n>``), as a Plexus envelope if it adds bytes."""
    js = nc.jetstream()
    pending: dict[str, asyncio.Future[bytes]] = {}
    inbox = nc.new_inbox()
    ids = itertools.count()
    data = PAYLOAD.encode()
    subscribed: list[bool] = []
    subjects = [f"{subject}.{n}" if variant is None else _inbox_subject(variant, n) for n in range(MAX_LANES)]
    envelopes = variant is not None and variant.bytes

    async def on_reply(msg: Msg) -> None:
        future = pending.pop(msg.subject.rsplit(".", 1)[-1], None)
        if future is not None and not future.done():
            future.set_result(msg.data)

    async def call(lane: int, i: int) -> None:
        if not subscribed:
            subscribed.append(True)
            await nc.subscribe(f"{inbox}.*", cb=on_reply)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if envelopes:
            msg_id = f"msg_{fv.ulid()}"
            pending[msg_id] = future
            body = fv.envelope(msg_id, f"lane{lane}", f"{inbox}.{msg_id}")
            await js.publish(
                subjects[lane], body, headers={"Nats-Msg-Id": msg_id, "Plexus-V": "1"}, timeout=10
            )
        else:
            msg_id = f"m{next(ids)}-{time.time_ns()}"
            pending[msg_id] = future
            headers = {"Nats-Msg-Id": msg_id, "Bench-Reply": f"{inbox}.{msg_id}"}
            await js.publish(subjects[lane], data, headers=headers, timeout=10)
        await asyncio.wait_for(future, 10)

    return call


def _varz(port: int | None) -> tuple[int, int, int, int]:
    """nats-server's (messages in, out, bytes in, out) so far, from its monitoring port."""
    if port is None:
        return (0, 0, 0, 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as answer:
        varz = json.load(answer)
    return (varz["in_msgs"], varz["out_msgs"], varz["in_bytes"], varz["out_bytes"])


Row = tuple[float, float, float, float, float, float, float]  # msg/s, 3 × CPU µs, msgs in, out, KB in


async def drive(rounds: int, sides: list[str], count: int) -> None:
    from bench import raw

    py = sys.executable
    levels = tuple((inflight, count if inflight > 1 else n) for inflight, n in LEVELS)
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="durable-floor-")))
        server = NatsServer(store_dir=logs / "nats")
        server.start()
        stack.callback(server.stop)
        # Plexus with fewer partitions needs an inbox stream of its own: one nats-server for each.
        servers = dict.fromkeys(sides, server)
        for name in sides:
            if name in PLEXUS_PARTITIONED:
                servers[name] = NatsServer(store_dir=logs / f"nats-{name}")
                servers[name].start()
                stack.callback(servers[name].stop)
        procs: list[subprocess.Popen[str]] = []
        try:
            serving = {
                "raw.js": ["-m", "bench.raw", "serve", "--url", server.url],
                **{
                    name: ["-m", "bench.durable_floor", "serve", "--url", server.url, "--variant", name]
                    for name in VARIANTS
                },
                "plexus.dur": ["-m", "bench.plexus_bench", "serve", "--app", "main", "--url", server.url],
                **{
                    name: [
                        "-m",
                        "bench.durable_floor",
                        "serve",
                        "--url",
                        servers[name].url,
                        "--partitions",
                        str(p),
                    ]
                    for name, p in PLEXUS_PARTITIONED.items()
                    if name in sides
                },
            }
            pids = {}
            for name in sides:
                procs.append(_start([py, *serving[name]], logs / f"{name}.log"))
                pids[name] = procs[-1].pid
            nc = await nats.connect(server.url, name="bench-floor-client")
            await raw.ensure_js(nc)
            runtimes = {"plexus.dur": await Runtime.connect(server.url)}
            for name, p in PLEXUS_PARTITIONED.items():
                if name in sides:
                    runtimes[name] = await Runtime.connect(servers[name].url, partitions=p)
            every: dict[str, Callable[[int, int], Awaitable[None]]] = {
                "raw.js": _js_caller(nc, raw.JS_SUBJECT),
                "floor": _js_caller(nc, SUBJECT),
                **{name: _js_caller(nc, "", v) for name, v in VARIANTS.items() if name != "floor"},
            }
            for name, rt in runtimes.items():
                if name in sides:
                    await rt.get("echo", lazy=False, timeout=30)
                every[name] = _plexus_caller(rt)
            calls = {name: every[name] for name in sides}
            for call in calls.values():  # warm-up: connections, activations, caches
                await closed_loop(300, 100, call)
            me = os.getpid()
            rows: dict[tuple[str, int], list[Row]] = {}
            for _ in range(rounds):
                for name, call in calls.items():
                    nats_pid, port = servers[name].pid, servers[name].monitor_port
                    assert nats_pid is not None
                    for inflight, n in levels:
                        before = [_cpu_s(p) for p in (nats_pid, pids[name], me)]
                        traffic = _varz(port)
                        rate, _ = await closed_loop(n, inflight, call)
                        after = [_cpu_s(p) for p in (nats_pid, pids[name], me)]
                        moved = [(b - a) / n for a, b in zip(traffic, _varz(port), strict=True)]
                        srv, own, client = ((b - a) / n * 1e6 for a, b in zip(before, after, strict=True))
                        row = (rate, srv, own, client, moved[0], moved[1], moved[2] / 1e3)
                        rows.setdefault((name, inflight), []).append(row)
            for rt in runtimes.values():
                await rt.close()
            await nc.drain()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(10)
    _report(rows, rounds, sides)


def _plexus_caller(rt: Runtime) -> Callable[[int, int], Awaitable[None]]:
    blocks = [TextBlock(text=PAYLOAD)]
    agents = [AgentId("echo", f"lane{n}") for n in range(MAX_LANES)]

    async def call(lane: int, i: int) -> None:
        await rt.send_message(blocks, agents[lane], timeout=30)

    return call


async def serve_plexus(url: str, partitions: int) -> None:
    """What ``bench.plexus_bench serve --app main`` runs, on an inbox of `partitions` partitions per type."""
    from bench.plexus_bench import build_app

    app = build_app("main")
    rt = await Runtime.connect(url, namespace=app.namespace, partitions=partitions)
    worker = Worker(app, rt, WorkerConfig())
    await worker.start()
    ready()
    await asyncio.Event().wait()


def _report(rows: dict[tuple[str, int], list[Row]], rounds: int, sides: list[str]) -> None:
    med = {k: [statistics.median(col) for col in zip(*v, strict=True)] for k, v in rows.items()}
    print(f"medians of {rounds} alternated rounds; CPU in µs per message")
    header = ("system", "in flight", "msg/s", "nats-server", "serving", "client", "total")
    # The name column as before unless a side's name is longer.
    first = max(WIDTHS[0], *(len(name) + 2 for name in sides))
    name_widths = (first, *WIDTHS[1:])
    print("".join(f"{h:>{w}}" for h, w in zip(header, name_widths, strict=True)))
    for (name, inflight), (rate, srv, serving, client, *_) in med.items():
        total = srv + serving + client
        cells = (name, inflight, f"{rate:,.0f}", *(f"{v:.0f}" for v in (srv, serving, client, total)))
        print("".join(f"{c:>{w}}" for c, w in zip(cells, name_widths, strict=True)))
    if all(n in sides for n in ("plexus.dur", "raw.js", "floor")):
        for inflight, _ in LEVELS:
            plexus, raw_js, floor = (med[(n, inflight)][0] for n in ("plexus.dur", "raw.js", "floor"))
            print(
                f"{inflight} in flight: plexus/raw.js {plexus / raw_js:.2f}×, "
                f"floor/raw.js {floor / raw_js:.2f}×, plexus/floor {plexus / floor:.2f}×"
            )
    if sides == DEFAULT_SIDES:
        return  # what this printed before it had variants
    inflight = LEVELS[-1][0]
    print(f"\n{inflight} in flight, min–max over the rounds; nats-server traffic per message (/varz)")
    spread = ("system", "msg/s", "nats-server", "serving", "client", "msgs in", "out", "KB in")
    widths = (first, 16, 13, 11, 9, 9, 6, 7)
    print("".join(f"{h:>{w}}" for h, w in zip(spread, widths, strict=True)))
    for name in sides:
        cols = list(zip(*rows[(name, inflight)], strict=True))
        spans = [f"{min(c):,.0f}–{max(c):,.0f}" for c in cols[:4]]
        traffic = [f"{statistics.median(c):.1f}" for c in cols[4:6]] + [f"{statistics.median(cols[6]):.2f}"]
        print("".join(f"{c:>{w}}" for c, w in zip((name, *spans, *traffic), widths, strict=True)))
    if "floor" in sides:
        base = med[("floor", inflight)]
        for name in (n for n in sides if n.startswith("floor-") or n in PLEXUS_PARTITIONED):
            m = med[(name, inflight)]
            deltas = ", ".join(
                f"{label} {m[i] - base[i]:+.0f}"
                for i, label in ((1, "nats-server"), (2, "serving"), (3, "client"))
            )
            total = sum(m[1:4]) - sum(base[1:4])
            print(f"{name} − floor: {deltas}, total {total:+.0f} µs/msg; msg/s {m[0] / base[0]:.2f}× floor")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("role", choices=["run", "serve"])
    parser.add_argument("--url", help="the nats-server (serve)")
    parser.add_argument(
        "--variant", choices=list(VARIANTS), default="floor", help="which floor to serve (serve)"
    )
    parser.add_argument(
        "--partitions", type=int, help="serve Plexus's bench app with these partitions (serve)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sides",
        default=",".join(DEFAULT_SIDES),
        help=f"comma-separated sides to drive (run), of {', '.join(ALL_SIDES)}; 'all' for every one",
    )
    parser.add_argument(
        "--count", type=int, default=LEVELS[-1][1], help="messages per measurement at 100 in flight"
    )
    args = parser.parse_args()
    if args.role == "serve":
        if not args.url:
            parser.error("serve needs --url")
        if args.partitions:
            asyncio.run(serve_plexus(args.url, args.partitions))
        else:
            asyncio.run(serve(args.url, VARIANTS[args.variant]))
    else:
        sides = ALL_SIDES if args.sides == "all" else args.sides.split(",")
        if unknown := [s for s in sides if s not in ALL_SIDES]:
            parser.error(f"unknown sides: {', '.join(unknown)}")
        asyncio.run(drive(args.rounds, sides, args.count))


if __name__ == "__main__":
    main()
