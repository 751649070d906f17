"""Agents for the bad-input, odd-key and tracing end-to-end tests, a module-fixture helper, and helpers to
publish envelopes by hand and read the dead-letter stream.

`build_app()` makes a fresh App per worker (an App registers each type once); `app` is a module-level
instance for `plexus worker tests.runtime.apps_misc:app` subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from nats.aio.msg import Msg
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from plexus.core import AgentId, BaseBlock, BudgetExhaustedError, KernelError, MessageId, TextBlock
from plexus.runtime import Agent, App, Context, NatsServer, Runtime, Worker, WorkerConfig
from plexus.runtime.wire._envelope import Envelope, decode_reply, encode_envelope, payload_from_blocks
from plexus.runtime.wire._subjects import escape_token
from plexus.runtime.worker._activation import Activation


class Echo(Agent):
    """Returns exactly the blocks it received."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        return blocks


class KeyReporter(Agent):
    """Replies with the key of its own AgentId, as the worker decoded it from the wire."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        return [TextBlock(text=ctx.agent_id.key)]


class Counter(Agent):
    """Counts its messages in durable state: ``<key>#<n>``, so two keys sharing an activation would show."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        return [TextBlock(text=f"{ctx.agent_id.key}#{self.state['n']}")]


class Failing(Agent):
    """Raises what its input text names: ``value`` → ValueError, ``budget`` → BudgetExhaustedError."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        what = blocks[0].text if isinstance(blocks[0], TextBlock) else ""
        if what == "value":
            raise ValueError("bad value 42")
        if what == "budget":
            raise BudgetExhaustedError("tokens", 5, 4)
        return [TextBlock(text="fine")]


class Inflate(Agent):
    """Replies with a text of as many characters as its input text says (to overflow the reply size)."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        size = int(blocks[0].text) if isinstance(blocks[0], TextBlock) else 0
        return [TextBlock(text="i" * size)]


class Forwarder(Agent):
    """Agent A of the tracing test: forwards its input to ``<target>/<same key>`` and returns B's reply."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock] | None:
        b = AgentId(self.target, ctx.agent_id.key, ctx.agent_id.namespace)
        reply = await ctx.send(blocks, b, timeout=10)
        return [TextBlock(text="a saw b"), *reply]


def build_app(namespace: str = "default") -> App:
    app = App(namespace=namespace)
    app.register("echo", lambda _id: Echo(), description="returns its input")
    app.register("echo-eph", lambda _id: Echo(), durable=False, description="stateless echo")
    app.register("keys", lambda _id: KeyReporter(), description="replies with its key")
    app.register("keys-eph", lambda _id: KeyReporter(), durable=False)
    app.register("counter", lambda _id: Counter())
    app.register("fail", lambda _id: Failing())
    app.register("fail-eph", lambda _id: Failing(), durable=False)
    app.register("inflate", lambda _id: Inflate())
    app.register("inflate-eph", lambda _id: Inflate(), durable=False)
    app.register("relay-a", lambda _id: Forwarder("relay-b"))
    app.register("relay-b", lambda _id: Echo())
    app.register("relay-a-eph", lambda _id: Forwarder("relay-b-eph"), durable=False)
    app.register("relay-b-eph", lambda _id: Echo(), durable=False)
    return app


app = build_app()


@dataclass
class Served:
    server: NatsServer
    rt: Runtime
    worker: Worker


@contextlib.asynccontextmanager
async def serving(store_dir: Path, app: App | None = None, **server_options: Any) -> AsyncIterator[Served]:
    """A private nats-server, a client Runtime and an in-process Worker serving `app` (module fixtures)."""
    server = NatsServer(store_dir=store_dir, **server_options)
    server.start()
    try:
        client = await Runtime.connect(server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
        worker_rt = await Runtime.connect(server.url, heartbeat_ttl_s=3.0, lease_ttl_s=3.0)
        worker = Worker(
            app or build_app(), worker_rt, WorkerConfig(lease_ttl_s=3.0, heartbeat_s=0.5, ack_wait_s=5.0)
        )
        await worker.start()
        try:
            yield Served(server, client, worker)
        finally:
            try:  # not suppressed: a worker that cannot stop cleanly is a bug the tests should show
                await worker.stop(drain_timeout=5)
            finally:
                await worker_rt.close()
                await client.close()
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------------------
# Helpers for publishing by hand and watching the dead-letter stream

DEADLINE = 10.0


@dataclass
class DeadLetters:
    """An ordered consumer on PLEXUS_DLQ from "now" on; `expect()` waits, with a deadline, for a match."""

    sub: Any

    async def expect(self, match: Callable[[Msg], bool], timeout: float = DEADLINE) -> Msg:
        deadline = time.monotonic() + timeout
        while True:
            msg: Msg = await self.sub.next_msg(timeout=max(deadline - time.monotonic(), 0.01))
            if match(msg):
                return msg


@contextlib.asynccontextmanager
async def dead_letters(rt: Runtime) -> AsyncIterator[DeadLetters]:
    sub = await rt.js.subscribe(
        f"{rt.subjects.base}.dlq.>",
        stream=rt.topology.names.dlq_stream,
        ordered_consumer=True,
        deliver_policy=js_api.DeliverPolicy.NEW,
    )
    try:
        yield DeadLetters(sub)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def arrived_on_key(key: str) -> Callable[[Msg], bool]:
    return lambda m: (m.headers or {}).get("Plexus-Dlq-Subject", "").endswith("." + escape_token(key))


def envelope(target: str, *, reply_to: str | None = None, blocks: list[BaseBlock] | None = None) -> Envelope:
    return Envelope(
        id=str(MessageId.new()),
        kind="send",
        target=target,
        reply_to=reply_to,
        payload=payload_from_blocks(blocks if blocks is not None else [TextBlock(text="ping")]),
        sent_at=time.time(),
    )


def good_headers(env: Envelope) -> dict[str, str]:
    return {"Nats-Msg-Id": env.id, "Plexus-V": "1"}


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = DEADLINE) -> None:
    """Poll state that has no change notification until it holds; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached within {timeout}s")
        await asyncio.sleep(0.05)


async def acked(rt: Runtime, seq: int) -> None:
    """The inbox message at `seq` was acknowledged: the work-queue stream deleted it."""

    async def gone() -> bool:
        try:
            await rt.js.get_msg(rt.topology.names.inbox_stream, seq)
        except NotFoundError:
            return True
        return False

    await wait_until(gone)


def reply_error(msg: Msg) -> KernelError:
    reply = decode_reply(msg.data)
    assert not reply.ok
    assert reply.error is not None
    return KernelError.from_wire(reply.error)


async def send_raw(
    rt: Runtime, env: Envelope, *, durable: bool, host: str, key: str
) -> tuple[Msg, int | None]:
    """Publish `env` the way a client would, but by hand; returns the reply and the inbox stream seq."""
    data = encode_envelope(env)
    if not durable:
        subject = rt.subjects.ephemeral(host, key)
        return await rt.nc.request(subject, data, timeout=DEADLINE, headers=good_headers(env)), None
    assert env.reply_to is not None
    sub = await rt.nc.subscribe(env.reply_to)
    try:
        ack = await rt.js.publish(rt.subjects.inbox(host, key), data, headers=good_headers(env))
        return await sub.next_msg(timeout=DEADLINE), ack.seq
    finally:
        await sub.unsubscribe()


def idle_activation(handled: OrderedDict[str, bytes | None]) -> Activation:
    """An activation of a plain `Agent` at key t/k that has handled `handled` (no store behind it)."""
    return Activation(
        agent_id=AgentId("t", "k"),
        agent=Agent(),
        agent_type=cast(Any, None),
        revision=None,
        log_seq=0,
        progress_seq=0,
        handled=handled,
        saved=b"",
    )
