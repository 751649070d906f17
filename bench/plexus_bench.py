"""Plexus under the same load as the raw baselines, client and worker in separate processes.

``python -m bench.plexus_bench serve --app main|keys --url URL`` runs a `Worker` exactly as
``plexus worker`` does (same `Runtime.connect` + `Worker` + `WorkerConfig`), plus a core-NATS control subject
``bench.ctl.<app>`` that reports RSS and the activation count and can force passivation. The ``keys`` app
runs alone so its memory is not mixed with other scenarios. For a memory diagnosis, send ``diag-start`` (or
``diag-start-trace``: tracemalloc too, ≈ 25× slower) to the control subject before a burst and ``diag`` after
it: the worker writes what survived to its stderr (`_Diagnosis`).

``python -m bench.plexus_bench client --url URL --mode quick`` measures and prints one RESULT line. The
``main`` app's budget scenario needs an orchestrator on the same server (`bench.run` starts one).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import gc
import json
import os
import reprlib
import signal
import sys
import time
import tracemalloc
from typing import Any

from nats.aio.msg import Msg

from bench.common import (
    PAYLOAD,
    Results,
    Sizes,
    client_args,
    closed_loop,
    measure_rr,
    percentile,
    ready,
    rss_bytes,
    run,
    sizes_for,
)
from plexus.core import (
    AgentId,
    BaseBlock,
    ExecutionBudget,
    TextBlock,
    TextDelta,
    TopicId,
    stream_event_from_json,
)
from plexus.runtime import Agent, App, Context, Runtime, Worker, WorkerConfig, new_root_run
from plexus.runtime.kernel import TypeSubscription, allocator_in_use, use_allocator

FAN_TOPIC = "bench-fan"
#: Seconds the keys worker idles after passivating all before its RSS is read again.
SETTLE_S = 5.0
FAN_SINKS = 10
CTL = "bench.ctl"


# -- agents --------------------------------------------------------------------------------------------
class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        return blocks


class Sink(Agent):
    """Counts publications; on ``end`` streams the count (the publisher's completion signal) and resets."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        if _text(blocks) == "end":
            await ctx.stream(str(self.count))
            self.count = 0
        else:
            self.count += 1
        return None


class Consumer(Agent):
    """Times `ctx.usage()`, the budget `consume` seam: `ClusterSupervisor` increments the run tree's
    JetStream counter when the run is orchestrated, and defers to `LocalSupervisor` when it is not."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        timings: list[float] = []
        clock = time.perf_counter
        for _ in range(int(_text(blocks))):
            t0 = clock()
            await ctx.usage(tokens=1)
            timings.append(clock() - t0)
        summary = {"p50_us": percentile(timings, 50) * 1e6, "p99_us": percentile(timings, 99) * 1e6}
        return [TextBlock(text=json.dumps(summary))]


class Progress(Agent):
    """Emits N progress events back to back; the subscriber measures `ts` → receipt."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        for i in range(int(_text(blocks))):
            await ctx.emit_progress("thinking", metadata={"i": i})
        return []


def _text(blocks: list[BaseBlock]) -> str:
    block = blocks[0] if blocks else None
    return block.text if isinstance(block, TextBlock) else ""


def build_app(name: str) -> App:
    app = App()
    if name == "keys":
        app.register("keyed", lambda _id: Echo(), description="durable echo for key scaling")
        return app
    app.register("echo-eph", lambda _id: Echo(), durable=False)
    app.register("echo", lambda _id: Echo())
    app.register("budget", lambda _id: Consumer(), durable=False)
    # The orchestrator dispatches a run's root message to the durable inbox, so the cluster case needs a
    # durable type (the handler's work is the same).
    app.register("budget-run", lambda _id: Consumer())
    app.register("progress", lambda _id: Progress(), durable=False)
    for i in range(FAN_SINKS):
        app.register(f"sink{i}", lambda _id: Sink(), durable=False)
    return app


# -- worker process ------------------------------------------------------------------------------------
class _CollectorClock:
    """Time the worker process spends in the cyclic garbage collector (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._started = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._started


class _Diagnosis:
    """What survives a burst (``diag-start`` before it, ``diag`` after passivating), written to stderr:
    tracemalloc's allocation sites of the blocks still alive, the collector's objects by type (with a
    referrer of a few), and pymalloc's arenas and blocks (`sys._debugmallocstats`)."""

    def __init__(self) -> None:
        self._ids: set[int] = set()

    def start(self, trace: bool) -> None:
        gc.collect()
        self._ids = {id(o) for o in gc.get_objects()}
        sys._debugmallocstats()
        if trace:
            tracemalloc.start(25)

    def report(self) -> None:
        gc.collect()
        out = sys.stderr
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            tracemalloc.stop()
            stats = snapshot.statistics("traceback")
            total = sum(s.count for s in stats)
            print(f"DIAG traced blocks alive: {total}, {sum(s.size for s in stats)} B", file=out)
            for stat in stats[:25]:
                print(f"DIAG site: {stat.count} blocks, {stat.size} B", file=out)
                for line in stat.traceback.format(limit=12):
                    print(f"DIAG   {line}", file=out)
            del snapshot, stats
        new = [o for o in gc.get_objects() if id(o) not in self._ids]
        by_type = collections.Counter(type(o).__qualname__ for o in new)
        print(f"DIAG new tracked objects: {len(new)}: {by_type.most_common(25)}", file=out)
        for name, _ in by_type.most_common(8):
            sample = next(o for o in new if type(o).__qualname__ == name)
            holders = [type(r).__qualname__ for r in gc.get_referrers(sample) if r is not new]
            print(f"DIAG   a {name} is held by {holders[:6]}: {reprlib.repr(sample)}", file=out)
        del new
        sys._debugmallocstats()


async def serve(url: str, app_name: str) -> None:
    app = build_app(app_name)
    rt = await Runtime.connect(url, namespace=app.namespace)
    # Keys: keep every activation (no idle passivation, no cap) so memory per idle activation is measurable.
    config = (
        WorkerConfig(idle_passivate_s=3600.0, max_activations=10_000_000)
        if app_name == "keys"
        else WorkerConfig()
    )
    worker = Worker(app, rt, config)
    await worker.start()
    collecting = _CollectorClock()
    gc.callbacks.append(collecting.on_gc)

    diag = _Diagnosis()

    async def control(msg: Msg) -> None:
        if msg.data.startswith(b"diag-start"):
            diag.start(trace=msg.data == b"diag-start-trace")
        elif msg.data == b"diag":
            diag.report()
        if msg.data == b"passivate":
            # No public hook forces passivation; make every activation idle and run one round now.
            worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=0.0)
            await worker._upkeep.passivate()
        gc_s = collecting.total_s  # before the collection below, which is the bench's, not the worker's
        gc.collect()
        stats = {
            "rss": rss_bytes(),
            "activations": len(worker._activations),
            # Objects the collector tracks: what is kept alive, apart from what the allocator keeps.
            "objects": len(gc.get_objects()),
            "pid": os.getpid(),
            "gc_s": gc_s,
            "allocator": allocator_in_use(),
        }
        await msg.respond(json.dumps(stats).encode())

    await rt.nc.subscribe(f"{CTL}.{app_name}", cb=control)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready()
    await stop.wait()
    await worker.stop(drain_timeout=5)
    await rt.close()


# -- client --------------------------------------------------------------------------------------------
async def client(url: str, sizes: Sizes, apps: list[str]) -> Results:
    rt = await Runtime.connect(url)
    results = Results(info={"payload_bytes": len(PAYLOAD)})
    try:
        if "main" in apps:
            for agent_type in (
                "echo-eph",
                "echo",
                "budget",
                "budget-run",
                "progress",
                *(f"sink{i}" for i in range(FAN_SINKS)),
            ):
                await rt.get(agent_type, lazy=False, timeout=30)
            await rpc(rt, sizes, results)
            await fanout(rt, sizes, results)
            await consume(rt, sizes, results)
            await consume_cluster(rt, sizes, results)
            await progress(rt, sizes, results)
        if "keys" in apps:
            await rt.get("keyed", lazy=False, timeout=30)
            await keys(rt, sizes, results)
    finally:
        await rt.close()
    return results


async def rpc(rt: Runtime, sizes: Sizes, results: Results) -> None:
    blocks = [TextBlock(text=PAYLOAD)]

    def caller(agent_type: str) -> Any:
        ids = [AgentId(agent_type, f"lane{n}") for n in range(100)]

        async def call(lane: int, i: int) -> None:
            await rt.send_message(blocks, ids[lane], timeout=30)

        return call

    await measure_rr(results, "plexus.eph", sizes, caller("echo-eph"))
    await measure_rr(
        results,
        "plexus.dur",
        sizes,
        caller("echo"),
        levels=(1, 100),
        seq=sizes.durable_seq,
        conc=sizes.durable_conc,
    )


async def fanout(rt: Runtime, sizes: Sizes, results: Results) -> None:
    """`publish_message` to 10 subscribed (stateless) agents; done when every sink counted every message."""
    for i in range(FAN_SINKS):
        await rt.add_subscription(TypeSubscription(topic_type=FAN_TOPIC, agent_type=f"sink{i}"))
    source = f"s{os.getpid()}"
    topic = TopicId(FAN_TOPIC, source)
    counts: asyncio.Queue[int] = asyncio.Queue()

    async def on_count(msg: Msg) -> None:
        event = stream_event_from_json(msg.data)
        counts.put_nowait(int(event.text) if isinstance(event, TextDelta) else -1)

    subs = [
        await rt.nc.subscribe(rt.subjects.stream(f"sink{i}", source), cb=on_count) for i in range(FAN_SINKS)
    ]
    await rt.nc.flush()
    blocks = [TextBlock(text=PAYLOAD)]
    end = [TextBlock(text="end")]

    async def one_round(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            await rt.publish_message(blocks, topic)
        await rt.publish_message(end, topic)
        got = [await asyncio.wait_for(counts.get(), 120) for _ in range(FAN_SINKS)]
        elapsed = time.perf_counter() - start
        if any(c != n for c in got):
            raise RuntimeError(f"plexus fan-out lost messages: {got} of {n}")
        return n / elapsed

    await one_round(min(200, sizes.fanout))
    for _ in range(sizes.repeats):
        results.add("plexus.fanout", "pub/s", await one_round(sizes.fanout))
    for sub in subs:
        await sub.unsubscribe()


async def consume(rt: Runtime, sizes: Sizes, results: Results) -> None:
    """`ctx.usage()` in a run the client started itself (not orchestrated): the process-local budget."""
    run_info = new_root_run(budget=ExecutionBudget(max_tokens=10**15))
    target = AgentId("budget", "b")
    await rt.send_message([TextBlock(text="100")], target, run=run_info, timeout=60)
    for _ in range(sizes.repeats):
        reply = await rt.send_message([TextBlock(text=str(sizes.consume))], target, run=run_info, timeout=120)
        summary = json.loads(_text(reply))
        results.add("plexus.consume.p50", "µs", summary["p50_us"])
        results.add("plexus.consume.p99", "µs", summary["p99_us"])


async def consume_cluster(rt: Runtime, sizes: Sizes, results: Results) -> None:
    """`ctx.usage()` in the root of an orchestrated run (`start_run`): one JetStream counter increment
    (`Nats-Incr`, a request to the server) per call, as every worker of a run tree reports."""
    budget = ExecutionBudget(max_tokens=10**15)
    target = AgentId("budget-run", "c")

    async def one_run(calls: int) -> dict[str, float]:
        run_id = await rt.start_run(target, [TextBlock(text=str(calls))], budget=budget)
        summary: dict[str, float] = json.loads(_text(await rt.run_result(run_id, timeout=120)))
        return summary

    await one_run(100)  # warm-up: activation, counter stream, run-status cache
    for _ in range(sizes.repeats):
        summary = await one_run(sizes.consume_cluster)
        results.add("plexus.consume.cluster.p50", "µs", summary["p50_us"])
        results.add("plexus.consume.cluster.p99", "µs", summary["p99_us"])


async def progress(rt: Runtime, sizes: Sizes, results: Results) -> None:
    """Latency from `emit_progress` in the worker (event `ts`) to receipt on `Runtime.progress(run_id)`."""
    run_info = new_root_run()
    latencies: list[float] = []
    arrived = asyncio.Event()
    expected = 0

    async def watch() -> None:
        async for event in rt.progress(run_info.run_id):
            latencies.append(time.time() - event.ts)
            if len(latencies) >= expected:
                arrived.set()

    async def burst(n: int) -> list[float]:
        nonlocal expected
        latencies.clear()
        arrived.clear()
        expected = n
        await rt.send_message([TextBlock(text=str(n))], AgentId("progress", "p"), run=run_info, timeout=120)
        await asyncio.wait_for(arrived.wait(), 60)
        return list(latencies)

    watcher = asyncio.create_task(watch())
    try:
        await burst(1)  # the subscription is live once the first event arrives (its replay covers the race)
        await burst(min(100, sizes.progress))
        for _ in range(sizes.repeats):
            lat = await burst(sizes.progress)
            results.add("plexus.progress.p50", "ms", percentile(lat, 50) * 1e3)
            results.add("plexus.progress.p99", "ms", percentile(lat, 99) * 1e3)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def keys(rt: Runtime, sizes: Sizes, results: Results) -> None:
    """Durable throughput over 10 keys vs over N distinct keys (each a new activation); RSS per activation."""
    blocks = [TextBlock(text=PAYLOAD)]
    lanes = 100

    async def stats(command: bytes = b"stats") -> dict[str, Any]:
        reply = await rt.nc.request(f"{CTL}.keys", command, timeout=60)
        data: dict[str, Any] = json.loads(reply.data)
        return data

    allocator = (await stats())["allocator"]
    # A worker on jemalloc (`plexus worker --allocator jemalloc`, as the image runs it) reports apart, on keys
    # of its own: the phases share a server, and an earlier phase's keys would be re-activations.
    on, tag = (".jemalloc", "je") if allocator == "jemalloc" else ("", "")
    few = [AgentId("keyed", f"few{tag}{k}") for k in range(10)]

    async def call_few(lane: int, i: int) -> None:
        await rt.send_message(blocks, few[i % 10], timeout=60)

    await closed_loop(min(500, sizes.keys_small), lanes, call_few)  # warm-up
    collector_us: list[float] = []
    baseline = await stats()
    for rep in range(sizes.keys_repeats):
        small, _ = await closed_loop(sizes.keys_small, lanes, call_few)
        before = await stats()

        async def call_many(lane: int, i: int, rep: int = rep) -> None:
            await rt.send_message(blocks, AgentId("keyed", f"r{tag}{rep}-{i}"), timeout=60)

        many, _ = await closed_loop(sizes.keys_many, lanes, call_many)
        after = await stats()
        results.add(f"plexus.keys{on}.10", "msg/s", small)
        results.add(f"plexus.keys{on}.many", "msg/s", many)
        results.add(f"plexus.keys{on}.ratio", "×", many / small)
        grown = after["activations"] - before["activations"]
        results.add(f"plexus.mem{on}.per_activation", "B", (after["rss"] - before["rss"]) / max(grown, 1))
        # The worker's collector time per distinct-key message (full collections grow with live activations).
        collector_us.append(round(1e6 * (after["gc_s"] - before["gc_s"]) / sizes.keys_many, 2))
    peak = await stats()
    dropped = await stats(b"passivate")
    # The worker then idles: its recent replies' window and deadline ticks lapse, jemalloc's decay runs.
    await asyncio.sleep(SETTLE_S)
    settled = await stats()
    results.add(f"plexus.mem{on}.peak", "MB", peak["rss"] / 1e6)
    results.add(f"plexus.mem{on}.after_passivation", "MB", dropped["rss"] / 1e6)
    results.add(f"plexus.mem{on}.after_passivation_ratio", "×", dropped["rss"] / baseline["rss"])
    results.add(f"plexus.mem{on}.idle_after_passivation", "MB", settled["rss"] / 1e6)
    results.add(f"plexus.mem{on}.idle_after_passivation_ratio", "×", settled["rss"] / baseline["rss"])
    results.info[f"keys{on}"] = {
        "distinct_keys_per_repeat": sizes.keys_many,
        "activations_at_peak": peak["activations"],
        "activations_after_passivation": dropped["activations"],
        "rss_baseline_mb": baseline["rss"] / 1e6,
        "objects_baseline": baseline["objects"],
        "objects_at_peak": peak["objects"],
        "objects_after_passivation": dropped["objects"],
        "worker_gc_us_per_distinct_key_message": collector_us,
    }


def main() -> None:
    args = client_args(__doc__ or "")
    if args.role == "serve":
        # As `plexus worker` does with PLEXUS_ALLOCATOR (re-executes this command line on jemalloc).
        use_allocator(os.environ.get("PLEXUS_ALLOCATOR", "default"))
        run(lambda: serve(args.url, args.app), args.loop)
        return

    async def go() -> None:
        results = await client(args.url, sizes_for(args.mode), args.app.split(","))
        results.info["loop"] = args.loop
        results.emit()

    run(go, args.loop)


if __name__ == "__main__":
    main()
