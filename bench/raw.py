"""Raw nats-py baselines: what the same machine does with no framework at all.

``python -m bench.raw serve --url URL`` answers requests on ``bench.echo`` (one queue-group responder),
holds 10 subscriptions on ``bench.fan.*`` and runs a JetStream pull worker (publish → pull → ack → reply).
``python -m bench.raw client --url URL --mode quick`` measures them and prints one RESULT line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from bench.common import PAYLOAD, Results, Sizes, client_args, measure_rr, ready, run, sizes_for

ECHO = "bench.echo"
FAN = "bench.fan"
FAN_DONE = "bench.fandone"
FAN_SUBSCRIBERS = 10
JS_STREAM = "BENCH_JS"
JS_SUBJECT = "benchjs.in"
JS_CONSUMER = "bench_js"


async def ensure_js(nc: Client) -> None:
    """A work-queue file stream with a dedupe window, like Plexus's inbox (the durable limit)."""
    js = nc.jetstream()
    config = js_api.StreamConfig(
        name=JS_STREAM,
        subjects=[f"{JS_SUBJECT}.>"],
        retention=js_api.RetentionPolicy.WORK_QUEUE,
        storage=js_api.StorageType.FILE,
        duplicate_window=120.0,
    )
    try:
        await js.stream_info(JS_STREAM)
    except NotFoundError:
        await js.add_stream(config)


# -- server side ---------------------------------------------------------------------------------------
async def serve(url: str) -> None:
    nc = await nats.connect(url, name="bench-raw-serve")

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(ECHO, queue="bench", cb=echo)

    # Fan-out: each subscription counts a round's messages and reports the count on the end marker.
    def fan_handler() -> Callable[[Msg], Awaitable[None]]:
        counts: dict[str, int] = {}

        async def on_msg(msg: Msg) -> None:
            round_id = msg.subject.rsplit(".", 1)[-1]
            if msg.data == b"end":
                await nc.publish(f"{FAN_DONE}.{round_id}", str(counts.pop(round_id, 0)).encode())
            else:
                counts[round_id] = counts.get(round_id, 0) + 1

        return on_msg

    for _ in range(FAN_SUBSCRIBERS):
        await nc.subscribe(f"{FAN}.*", cb=fan_handler())

    js = nc.jetstream()
    await ensure_js(nc)
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(JS_STREAM, JS_CONSUMER)
    await js.add_consumer(
        JS_STREAM,
        js_api.ConsumerConfig(
            durable_name=JS_CONSUMER,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            ack_wait=30.0,
            max_ack_pending=1024,
        ),
    )
    sub = await js.pull_subscribe_bind(JS_CONSUMER, stream=JS_STREAM)
    ready()
    while True:
        try:
            msgs = await sub.fetch(64, timeout=1.0)
        except TimeoutError:
            continue
        for msg in msgs:
            # Ack (no confirmation, as Plexus does) and answer on the caller's inbox from the header.
            await msg.ack()
            reply = (msg.headers or {}).get("Bench-Reply")
            if reply:
                await nc.publish(reply, msg.data)


# -- client side ---------------------------------------------------------------------------------------
async def client(url: str, sizes: Sizes) -> Results:
    nc = await nats.connect(url, name="bench-raw-client")
    results = Results(info={"payload_bytes": len(PAYLOAD)})
    data = PAYLOAD.encode()

    async def request(lane: int, i: int) -> None:
        await nc.request(ECHO, data, timeout=10)

    await measure_rr(results, "raw.rr", sizes, request)
    await fanout(nc, sizes, results)
    await js_round_trip(nc, sizes, results)
    await nc.drain()
    return results


async def fanout(nc: Client, sizes: Sizes, results: Results) -> None:
    """Publish N messages + an end marker; done when all 10 subscribers counted them (end to end)."""
    data = PAYLOAD.encode()
    rounds = itertools.count()

    async def one_round(n: int) -> float:
        round_id = f"r{next(rounds)}"
        done: asyncio.Queue[int] = asyncio.Queue()

        async def on_done(msg: Msg) -> None:
            done.put_nowait(int(msg.data))

        sub = await nc.subscribe(f"{FAN_DONE}.{round_id}", cb=on_done)
        await nc.flush()
        subject = f"{FAN}.{round_id}"
        start = time.perf_counter()
        for _ in range(n):
            await nc.publish(subject, data)
        await nc.publish(subject, b"end")
        counts = [await asyncio.wait_for(done.get(), 60) for _ in range(FAN_SUBSCRIBERS)]
        elapsed = time.perf_counter() - start
        await sub.unsubscribe()
        if any(c != n for c in counts):
            raise RuntimeError(f"raw fan-out lost messages: {counts} of {n}")
        return n / elapsed

    await one_round(min(500, sizes.fanout))
    for _ in range(sizes.repeats):
        results.add("raw.fanout", "pub/s", await one_round(sizes.fanout))


async def js_round_trip(nc: Client, sizes: Sizes, results: Results) -> None:
    """JetStream publish (acked) → pull → ack → core reply, 1 and 100 in flight."""
    js = nc.jetstream()
    await ensure_js(nc)
    pending: dict[str, asyncio.Future[bytes]] = {}
    inbox = nc.new_inbox()

    async def on_reply(msg: Msg) -> None:
        future = pending.pop(msg.subject.rsplit(".", 1)[-1], None)
        if future is not None and not future.done():
            future.set_result(msg.data)

    await nc.subscribe(f"{inbox}.*", cb=on_reply)
    data = PAYLOAD.encode()
    ids = itertools.count()
    loop = asyncio.get_running_loop()

    async def call(lane: int, i: int) -> None:
        msg_id = f"m{next(ids)}-{time.time_ns()}"
        future: asyncio.Future[bytes] = loop.create_future()
        pending[msg_id] = future
        headers = {"Nats-Msg-Id": msg_id, "Bench-Reply": f"{inbox}.{msg_id}"}
        await js.publish(f"{JS_SUBJECT}.{lane}", data, headers=headers, timeout=10)
        await asyncio.wait_for(future, 10)

    await measure_rr(
        results, "raw.js", sizes, call, levels=(1, 100), seq=sizes.durable_seq, conc=sizes.durable_conc
    )


def main() -> None:
    args = client_args(__doc__ or "")
    if args.role == "serve":
        run(lambda: serve(args.url), args.loop)
    else:

        async def go() -> None:
            results = await client(args.url, sizes_for(args.mode))
            results.info["loop"] = args.loop
            results.emit()

        run(go, args.loop)


if __name__ == "__main__":
    main()
