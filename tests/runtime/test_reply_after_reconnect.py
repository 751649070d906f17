"""Connections that drop or go silent. A reply is a core message: one published while its caller's
connection was down is lost. The caller used to wait for its whole deadline (ReplyTimeoutError, then a retry
with the same message id); seen in `make chaos` as 30 s recoveries after a NATS node that served clients was
killed. Now a reconnected client probes for every durable send it still awaits and gets the stored reply at
once. And a server that goes silent (its host died: no TCP reset) is left for another within seconds.

Connections are cut, or silenced, by TCP proxies between one side and a real nats-server (the server, the
other side and its connection stay up), so what is lost is not a matter of timing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context, NatsServer, Runtime
from plexus.runtime.wire._envelope import decode_reply, encode_envelope
from tests.security.seeds import identity_auth

from .apps_misc import envelope, good_headers
from .conftest import StartWorker


class CuttableProxy:
    """A loopback TCP proxy to `upstream` whose connections can be cut and refused for a while, or go silent
    (kept open, nothing forwarded: a host that died or dropped off the network sends no TCP reset)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.open = True
        self.silent = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    if not self.silent:
                        dst.write(data)
                        await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def cut(self) -> None:
        """Close every connection (both sides: the server drops the client's subscriptions) and refuse new
        ones until `heal`."""
        self.open = False
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    def heal(self) -> None:
        self.open = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def proxy(nats_server: NatsServer) -> AsyncIterator[CuttableProxy]:
    """Requested before `start_worker`, so a worker connected through it stops before it does."""
    host, port = nats_server.url.rsplit("//", 1)[1].rsplit(":", 1)
    p = CuttableProxy(host, int(port))
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def test_a_reply_published_while_the_caller_was_disconnected_reaches_it_after_the_reconnect(
    nats_server: NatsServer, proxy: CuttableProxy, start_worker: StartWorker
) -> None:
    entered = asyncio.Event()
    runs: list[str] = []
    app = App()

    @app.agent("slow")
    class Slow(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            runs.append(ctx.message_id)
            entered.set()
            await asyncio.sleep(0.5)  # the caller's connection is cut meanwhile: this reply is lost
            return [TextBlock(text=f"done #{len(runs)}")]

    await start_worker(app)
    scheme = nats_server.url.split("//", 1)[0]
    client = await Runtime.connect(
        f"{scheme}//127.0.0.1:{proxy.port}", auth=identity_auth(nats_server, "client")
    )
    try:
        agent = AgentId("slow", "k")
        assert await client.send_message([TextBlock(text="warm")], agent, timeout=10) == [
            TextBlock(text="done #1")
        ]
        entered.clear()
        started = time.monotonic()
        send = asyncio.ensure_future(client.send_message([TextBlock(text="a")], agent, timeout=30))
        await asyncio.wait_for(entered.wait(), 10)
        proxy.cut()
        await asyncio.sleep(1.5)  # the handler has answered into the void
        proxy.heal()
        reply = await asyncio.wait_for(send, 25)
        waited = time.monotonic() - started
    finally:
        await client.close()
    assert reply == [TextBlock(text="done #2")]
    assert len(runs) == 2  # answered from the checkpoint, not run again
    # nats-py retries a refused server every 2 s: the reply comes with the reconnect, not the 30 s deadline.
    assert waited < 10, waited


async def test_a_worker_publishes_its_last_second_of_replies_again_after_a_reconnect(
    runtime: Runtime, nats_server: NatsServer, proxy: CuttableProxy, start_worker: StartWorker
) -> None:
    """The worker's side: a reply written to a server that then died may be lost although its message was
    acked (no redelivery answers it). The replies of the last second before a disconnect are published again
    once the worker is reconnected; a caller that has its answer ignores the copy (here a raw subscription on
    the reply subject counts both)."""
    app = App()

    @app.agent("echo")
    class Echo(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            return blocks

    scheme = nats_server.url.split("//", 1)[0]
    await start_worker(app, url=f"{scheme}//127.0.0.1:{proxy.port}")
    rt = runtime
    agent = AgentId("echo", "k")
    assert await rt.send_message([TextBlock(text="warm")], agent, timeout=10) == [TextBlock(text="warm")]
    env = envelope("echo/k", reply_to=rt.nc.new_inbox())
    assert env.reply_to is not None
    sub = await rt.nc.subscribe(env.reply_to)
    try:
        await rt.js.publish(rt.subjects.inbox("echo", "k"), encode_envelope(env), headers=good_headers(env))
        first = await sub.next_msg(timeout=10)
        proxy.cut()
        await asyncio.sleep(0.5)
        proxy.heal()
        again = await sub.next_msg(timeout=10)  # nats-py retries a refused server every 2 s
    finally:
        await sub.unsubscribe()
    assert again.data == first.data
    assert decode_reply(first.data).ok


async def test_a_client_leaves_a_silent_server_for_another_within_seconds(
    nats_server: NatsServer, start_worker: StartWorker
) -> None:
    """A server whose host died or dropped off the network sends no TCP reset: the connection goes quiet and
    writes vanish. nats-py noticed only by its pings, every 120 s by default: a client sent into the void for
    minutes. Plexus connections ping every 5 s and leave a silent server after 2-3 intervals. Here the client
    reaches the one nats-server through two proxies; the one it is connected to goes silent."""
    host, port = nats_server.url.rsplit("//", 1)[1].rsplit(":", 1)
    proxies = [CuttableProxy(host, int(port)), CuttableProxy(host, int(port))]
    for p in proxies:
        await p.start()
    app = App()

    @app.agent("echo")
    class Echo(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            return blocks

    await start_worker(app)
    scheme = nats_server.url.split("//", 1)[0]
    client = await Runtime.connect(
        [f"{scheme}//127.0.0.1:{p.port}" for p in proxies], auth=identity_auth(nats_server, "client")
    )
    try:
        agent = AgentId("echo", "k")
        assert await client.send_message([TextBlock(text="warm")], agent, timeout=10) == [
            TextBlock(text="warm")
        ]
        connected = client.nc.connected_url
        assert connected is not None
        silent = next(p for p in proxies if p.port == connected.port)
        silent.silent = True
        started = time.monotonic()
        reply = await client.send_message([TextBlock(text="after")], agent, timeout=60)
        waited = time.monotonic() - started
        now = client.nc.connected_url
    finally:
        await client.close()
        for p in proxies:
            await p.stop()
    assert reply == [TextBlock(text="after")]
    assert now is not None
    assert now.port != connected.port
    assert waited < 30, waited  # 2-3 pings of 5 s, then the other server
