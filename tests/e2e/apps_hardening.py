"""Agents for the hardening tests (issue 9), served by real `plexus worker` processes.

Handlers report what they do as progress events ("start"/"end" with the worker's pid and the message id),
so a test can see side effects of workers it stopped or killed.
"""

from __future__ import annotations

import asyncio
import json
import os

from plexus.core import AgentId, BaseBlock, KernelError, SpawnDenied, TextBlock
from plexus.runtime import Agent, App, Context, Interceptor
from plexus.runtime.store._connection import Connection

app = App()


def _text(blocks: list[BaseBlock]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)


@app.agent("seq-root", description="spawns its children one after another, waiting for each")
class SequentialRoot(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        results = []
        for i in range(int(_text(blocks) or "0")):
            try:
                reply = await ctx.spawn(AgentId("seq-leaf", f"{ctx.agent_id.key}-{i}"), blocks, timeout=30)
                results.append("ok:" + _text(reply))
            except SpawnDenied:
                results.append("denied")
            except KernelError as exc:
                results.append(f"error:{exc.error_type}")
        return [TextBlock(text=json.dumps(results))]


@app.agent("seq-leaf", description="answers at once")
class SequentialLeaf(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return [TextBlock(text=ctx.agent_id.key)]


@app.agent("echo", description="returns its input")
class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return blocks


@app.agent(
    "effect",
    description="reports the start (started) and end (done) of every handler run; sleeps as its input says",
)
class Effect(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        mark = f"{os.getpid()}:{ctx.message_id}"
        await ctx.emit_progress("started", [TextBlock(text=mark)])
        await asyncio.sleep(float(_text(blocks) or "0"))
        await ctx.emit_progress("done", [TextBlock(text=mark)])
        return [TextBlock(text=mark)]


@app.agent(
    "quiet-effect",
    description="reports its start (started), sleeps as its input says, then returns (no Context call)",
)
class QuietEffect(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        mark = f"{os.getpid()}:{ctx.message_id}"
        await ctx.emit_progress("started", [TextBlock(text=mark)])
        await asyncio.sleep(float(_text(blocks) or "0"))
        return [TextBlock(text=mark)]


@app.agent("conn-killer", description="makes nats-server close its own worker's connection for good")
class ConnectionKiller(Agent):
    """Publishes on the worker's own connection to a 5,000-character subject, exactly what the worker did
    with an unchecked reply address (issue 9 item 1): nats-server answers "maximum control line exceeded"
    and nats-py closes the connection for good. Reaching into the worker is for this test only."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        nc = ctx._backend.connection.nc  # type: ignore[attr-defined]
        await nc.publish("_INBOX." + "x" * 5000, b"")
        await nc.flush(timeout=5)
        return blocks


@app.agent("crash-root", description="spawns one effect child that sleeps as its input says")
class CrashRoot(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        reply = await ctx.spawn(AgentId("effect", f"{ctx.agent_id.key}-child"), blocks, timeout=60)
        return [TextBlock(text="child:" + _text(reply))]


class _KillConnectionOnStart(Interceptor):
    """Dooms the worker's connection while `Worker.start` runs (interceptors start first), the same way
    as `conn-killer`: the start then fails on a closed connection and the worker must say so and exit 1."""

    async def start(self, connection: Connection, worker_id: str) -> None:
        nc = connection.nc
        await nc.publish("_INBOX." + "x" * 5000, b"")
        # No flush: its PING, sent right behind the line the server refuses, could still be unread when the
        # server closes the socket, which then ends in a reset instead of the server's error (nats-py
        # reconnects after a reset, and the start would go on). Wait for the close the error causes.
        async with asyncio.timeout(5):
            while not nc.is_closed:  # noqa: ASYNC110 - nats-py offers no event for it
                await asyncio.sleep(0.01)


start_killer = App(interceptors=[_KillConnectionOnStart()])
start_killer.register("echo", lambda _id: Echo(), description="returns its input")
