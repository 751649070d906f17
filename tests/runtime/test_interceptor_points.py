"""Interceptors, second draft (issue 12 item 5): lifecycle hooks, declared agent-type options, and the
`Context` calls (send, publish, usage, spawn, emit_progress) as interception points — on a real nats-server
with in-process workers."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from plexus.core import AgentId, BaseBlock, TextBlock, TopicId
from plexus.runtime import (
    Agent,
    App,
    Context,
    Interceptor,
    ProgressInput,
    PublishInput,
    Runtime,
    SendInput,
    SpawnInput,
    UsageInput,
)
from plexus.runtime.interceptors._interceptors import HandleInput, HandleNext, chain, overrides
from plexus.runtime.kernel import TypeSubscription
from plexus.runtime.store._connection import Connection

from .conftest import StartWorker


def text(blocks: list[BaseBlock]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)


class Recorder(Interceptor):
    """Records every interception point it sees; reads the `tag` option of the agent type."""

    options: ClassVar[frozenset[str]] = frozenset({"tag"})

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.connection: Connection | None = None
        self.stopped = False

    async def start(self, connection: Connection, worker_id: str) -> None:
        self.connection = connection
        self.calls.append(("start", worker_id))

    async def stop(self) -> None:
        self.stopped = True

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        self.calls.append(("handle", inp.agent_type.options.get("tag")))
        return await call_next(inp)

    async def send(self, inp: SendInput, call_next: Any) -> list[BaseBlock]:
        self.calls.append(("send", str(inp.recipient)))
        inp.headers["x-recorded"] = "yes"
        result: list[BaseBlock] = await call_next(inp)
        return result

    async def publish(self, inp: PublishInput, call_next: Any) -> None:
        self.calls.append(("publish", str(inp.topic)))
        await call_next(inp)

    async def usage(self, inp: UsageInput, call_next: Any) -> None:
        self.calls.append(("usage", inp.usage.output_tokens))
        await call_next(inp)

    async def spawn(self, inp: SpawnInput, call_next: Any) -> list[BaseBlock]:
        self.calls.append(("spawn", str(inp.child)))
        result: list[BaseBlock] = await call_next(inp)
        return result

    async def emit_progress(self, inp: ProgressInput, call_next: Any) -> None:
        self.calls.append(("progress", str(inp.step)))
        await call_next(inp)


class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return [TextBlock(text=f"echo:{text(blocks)}")]


class Busy(Agent):
    """Uses every Context call that has an interception point."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("thinking")
        await ctx.usage(tokens=7)
        sent = await ctx.send([TextBlock(text="a")], AgentId("echo", "x"), timeout=10)
        spawned = await ctx.spawn(AgentId("echo", "y"), [TextBlock(text="b")], timeout=10)
        await ctx.publish([TextBlock(text="c")], TopicId("busy-news", "room"))
        return [TextBlock(text=f"{text(sent)}|{text(spawned)}")]


class Forbid(Interceptor):
    """A guard on spawn: refuses children of type `forbidden` before anything is enqueued."""

    async def spawn(self, inp: SpawnInput, call_next: Any) -> list[BaseBlock]:
        if inp.child.type == "forbidden":
            raise PermissionError("no forbidden children")
        result: list[BaseBlock] = await call_next(inp)
        return result


async def test_context_calls_run_through_the_apps_interceptors(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    recorder = Recorder()
    app = App(interceptors=[recorder])
    app.register("busy", lambda _id: Busy(), options={"tag": "t1"})
    app.register("echo", lambda _id: Echo())
    worker = await start_worker(app)
    assert recorder.calls[0] == ("start", worker.worker_id)
    assert recorder.connection is not None
    assert recorder.connection.namespace == app.namespace
    await runtime.add_subscription(TypeSubscription(topic_type="busy-news", agent_type="echo"))
    reply = await runtime.send_message([TextBlock(text="go")], AgentId("busy", "k"), timeout=20)
    assert text(reply) == "echo:a|echo:b"
    seen = [name for name, _ in recorder.calls]
    for point in ("handle", "progress", "usage", "send", "spawn", "publish"):
        assert point in seen, point
    assert ("handle", "t1") in recorder.calls
    assert ("usage", 7) in recorder.calls
    assert ("send", "echo/x") in recorder.calls
    assert ("spawn", "echo/y") in recorder.calls
    assert ("publish", "busy-news/room") in recorder.calls
    # The order the handler made the calls in is the order the interceptor saw them.
    order = [n for n in seen if n in ("progress", "usage", "send", "spawn", "publish")]
    assert order == ["progress", "usage", "send", "spawn", "publish"]


async def test_interceptor_stops_with_the_worker(runtime: Runtime, start_worker: StartWorker) -> None:
    recorder = Recorder()
    app = App(interceptors=[recorder])
    app.register("echo", lambda _id: Echo())
    worker = await start_worker(app)
    assert (
        text(await runtime.send_message([TextBlock(text="1")], AgentId("echo", "k"), timeout=10)) == "echo:1"
    )
    assert not recorder.stopped
    await worker.stop(drain_timeout=5)
    assert recorder.stopped


async def test_a_spawn_guard_refuses_before_the_child_exists(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    class Parent(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            try:
                await ctx.spawn(AgentId("forbidden", "c"), blocks, timeout=5)
            except PermissionError as exc:
                return [TextBlock(text=f"refused: {exc}")]
            return [TextBlock(text="spawned")]

    created: list[AgentId] = []

    def forbidden(agent_id: AgentId) -> Agent:
        created.append(agent_id)
        return Echo()

    app = App(interceptors=[Forbid()])
    app.register("parent", lambda _id: Parent())
    app.register("forbidden", forbidden)
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="x")], AgentId("parent", "p"), timeout=10)
    assert text(reply) == "refused: no forbidden children"
    await asyncio.sleep(0.2)
    assert created == []


def test_an_option_no_interceptor_declares_is_refused_at_registration() -> None:
    app = App(interceptors=[Recorder()])
    app.register("ok", lambda _id: Echo(), options={"tag": "x"})
    with pytest.raises(ValueError, match=r"'tagg'.*declared: tag"):
        app.register("typo", lambda _id: Echo(), options={"tagg": "x"})
    bare = App()
    with pytest.raises(ValueError, match=r"declared: none"):
        bare.register("any", lambda _id: Echo(), options={"tag": "x"})
    assert "typo" not in app.types


async def test_a_chain_leaves_out_interceptors_that_do_not_override_the_point() -> None:
    class OnlyHandle(Interceptor):
        async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
            return await call_next(inp)

    async def terminal(inp: object) -> object:
        return inp

    plain = [Interceptor(), OnlyHandle()]
    assert not overrides(plain[0], "usage")
    assert overrides(plain[1], "handle")
    # Nothing overrides `usage`: the chain is the terminal itself, no wrapper per call.
    assert chain(plain, "usage", terminal) is terminal
    assert chain(plain, "handle", terminal) is not terminal
    assert await chain(plain, "handle", terminal)("x") == "x"
