"""`emit_progress` publishes without waiting for its JetStream ack; the worker waits for all of a handler's
acks when it returns, before its result counts. A progress event JetStream refuses still fails the message,
as an awaited publish did, and every event of an answered message is stored."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, HandlerError, TextBlock
from plexus.runtime import Agent, App, Context, Runtime

from .conftest import StartWorker


class Talker(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        size = int(getattr(blocks[0], "text", "0"))
        for i in range(5):
            await ctx.emit_progress("thinking", [TextBlock(text=str(i) + "x" * size)])
        return [TextBlock(text="done")]


def talker_app() -> App:
    app = App()
    app.register("talker", lambda _id: Talker())
    app.register("talker-eph", lambda _id: Talker(), durable=False)
    return app


async def _stored(runtime: Runtime, agent: AgentId) -> int:
    name = runtime.topology.names.progress_stream
    info = await runtime.js.stream_info(
        name, subjects_filter=f"{runtime.subjects.base}.progress.*.{agent.type}.{agent.key}"
    )
    return sum((info.state.subjects or {}).values())


@pytest.mark.parametrize("agent_type", ["talker", "talker-eph"])
async def test_every_progress_event_of_an_answered_message_is_stored(
    runtime: Runtime, start_worker: StartWorker, agent_type: str
) -> None:
    await start_worker(talker_app())
    agent = AgentId(agent_type, "k")
    for n in range(3):
        assert await runtime.send_message([TextBlock(text="10")], agent, timeout=20) == [
            TextBlock(text="done")
        ]
        assert await _stored(runtime, agent) == 5 * (n + 1)  # read as soon as the answer is in


@pytest.mark.parametrize("agent_type", ["talker", "talker-eph"])
async def test_a_progress_event_jetstream_refuses_fails_the_message(
    runtime: Runtime, start_worker: StartWorker, agent_type: str
) -> None:
    await start_worker(talker_app())
    agent = AgentId(agent_type, "k")
    assert await runtime.send_message([TextBlock(text="10")], agent, timeout=20) == [TextBlock(text="done")]
    stream = await runtime.js.stream_info(runtime.topology.names.progress_stream)
    config = stream.config
    config.max_msg_size = 2048
    await runtime.js.update_stream(config)
    # Small events are still stored; a 4 KB one is refused by the stream (not by the client's size check).
    assert await runtime.send_message([TextBlock(text="10")], agent, timeout=20) == [TextBlock(text="done")]
    with pytest.raises(HandlerError) as info:
        await runtime.send_message([TextBlock(text="4000")], AgentId(agent_type, "big"), timeout=20)
    assert "maximum" in info.value.cause.lower() or "size" in info.value.cause.lower(), info.value.cause
    assert await _stored(runtime, AgentId(agent_type, "big")) == 0
    # And the worker serves on.
    assert await runtime.send_message([TextBlock(text="10")], agent, timeout=20) == [TextBlock(text="done")]


class Narrator(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        for i in range(3):
            await ctx.emit_progress("thinking", [TextBlock(text=f"step {i}")])
            await ctx.stream(f"text {i}")
        return []


async def test_progress_goes_out_in_order_with_the_handlers_other_messages(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Not waiting for the ack must not reorder: a viewer sees each step before the text streamed after it."""
    app = App()
    app.register("narrator", lambda _id: Narrator())
    await start_worker(app)
    seen: list[str] = []
    base = runtime.subjects.base

    async def on_msg(msg: Msg) -> None:
        if msg.subject.startswith((f"{base}.progress.", f"{base}.stream.")):
            seen.append(msg.subject.split(".")[2])  # "progress" or "stream"

    sub = await runtime.nc.subscribe(f"{base}.>", cb=on_msg)  # one subscription: arrival order is wire order
    try:
        await runtime.send_message([TextBlock(text="go")], AgentId("narrator", "k"), timeout=20)
        await runtime.nc.flush()
    finally:
        await sub.unsubscribe()
    assert seen == ["progress", "stream"] * 3
