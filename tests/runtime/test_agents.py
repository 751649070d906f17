"""End-to-end programming model on a real nats-server with in-process workers."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import ClassVar

from plexus.core import (
    AgentId,
    AgentStep,
    BaseBlock,
    ReplyMessage,
    RunMessageReceived,
    TextBlock,
    TextDelta,
    TopicId,
)
from plexus.runtime import Agent, App, Context, Runtime, new_root_run
from plexus.runtime.kernel import TypeSubscription

from .conftest import StartWorker


def text(blocks: list[BaseBlock]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)


class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return [TextBlock(text=f"{ctx.agent_id.key}:{text(blocks)}")]


async def test_send_message_round_trip(runtime: Runtime, start_worker: StartWorker) -> None:
    app = App()
    app.register("echo", lambda _id: Echo())
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="hi")], AgentId("echo", "k1"), timeout=10)
    assert text(reply) == "k1:hi"


async def test_ephemeral_type_uses_core_nats(runtime: Runtime, start_worker: StartWorker) -> None:
    app = App()
    app.register("fast", lambda _id: Echo(), durable=False)
    await start_worker(app)
    info = next(t for t in await runtime.agent_types() if t.type == "fast")
    assert info.durable is False
    reply = await runtime.send_message([TextBlock(text="x")], AgentId("fast", "a"), timeout=10)
    assert text(reply) == "a:x"


async def test_lazy_activation_and_capabilities_without_instantiation(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    created: list[AgentId] = []

    def factory(agent_id: AgentId) -> Agent:
        created.append(agent_id)
        return Echo()

    app = App()
    app.register("lazy", factory, description="lazy one", capabilities=["chat", "vision"])
    await start_worker(app)
    assert await runtime.capabilities("lazy") == ["chat", "vision"]
    assert [w.worker_id for w in await runtime.workers("lazy")]
    assert await runtime.get("lazy", "k", lazy=False, timeout=5) == AgentId("lazy", "k")
    assert created == []  # querying never instantiates
    await runtime.send_message([TextBlock(text="1")], AgentId("lazy", "k"), timeout=10)
    await runtime.send_message([TextBlock(text="2")], AgentId("lazy", "k"), timeout=10)
    assert created == [AgentId("lazy", "k")]  # once per key, on the first message


class Tracker(Agent):
    """Records overlap per key and globally; order of arrival per key."""

    running: ClassVar[dict[str, int]] = defaultdict(int)
    max_same_key: ClassVar[dict[str, int]] = defaultdict(int)
    total_running = 0
    max_total = 0
    order: ClassVar[dict[str, list[int]]] = defaultdict(list)

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cls = Tracker
        key = ctx.agent_id.key
        cls.running[key] += 1
        cls.total_running += 1
        cls.max_same_key[key] = max(cls.max_same_key[key], cls.running[key])
        cls.max_total = max(cls.max_total, cls.total_running)
        cls.order[key].append(int(text(blocks)))
        await asyncio.sleep(0.05)
        cls.running[key] -= 1
        cls.total_running -= 1
        return []


async def test_same_key_is_serial_and_fifo_while_keys_run_concurrently(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    app = App()
    app.register("tracker", lambda _id: Tracker())
    await start_worker(app, concurrency=16)
    keys = [f"k{i}" for i in range(6)]
    # Fire all sends for a key in order: the client awaits each JetStream publish ack before the next
    # send starts, so stream order == send order; replies are awaited together.
    tasks = []
    for n in range(8):
        for key in keys:
            tasks.append(
                asyncio.create_task(runtime.send_message([TextBlock(text=str(n))], AgentId("tracker", key)))
            )
            await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    assert all(v == 1 for v in Tracker.max_same_key.values()), Tracker.max_same_key
    assert Tracker.max_total > 1  # different keys overlapped
    for key in keys:
        assert Tracker.order[key] == list(range(8)), (key, Tracker.order[key])


class Counter(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        return [TextBlock(text=str(self.state["n"]))]


async def test_idle_activation_is_passivated_and_restored_from_checkpoint(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    created = 0

    def factory(_id: AgentId) -> Agent:
        nonlocal created
        created += 1
        return Counter()

    app = App()
    app.register("counter", factory)
    worker = await start_worker(app, idle_passivate_s=0.2)
    target = AgentId("counter", "c")
    assert text(await runtime.send_message([], target, timeout=10)) == "1"
    assert text(await runtime.send_message([], target, timeout=10)) == "2"
    async with asyncio.timeout(10):
        # Passivation runs on the worker's maintenance timer; there is no event to await.
        while worker._activations.get(target) is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    # The state came back from the checkpoint:
    assert text(await runtime.send_message([], target, timeout=10)) == "3"
    assert created == 2


class Listener(Agent):
    got: ClassVar[asyncio.Queue[tuple[str, str]]]

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> None:
        Listener.got.put_nowait((ctx.agent_id.key, text(blocks)))


class Announcer(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.publish(blocks, TopicId("news", ctx.agent_id.key))
        return []


async def test_publish_reaches_subscribers_not_the_sender_and_unsubscribe_stops_it(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    Listener.got = asyncio.Queue()
    app = App()
    app.register("listener", lambda _id: Listener())
    app.register("announcer", lambda _id: Announcer())
    await start_worker(app)
    sub_id = await runtime.add_subscription(TypeSubscription(topic_type="news", agent_type="listener"))
    await runtime.add_subscription(TypeSubscription(topic_type="news", agent_type="announcer"))
    await runtime.send_message([TextBlock(text="hello")], AgentId("announcer", "room1"), timeout=10)
    assert await asyncio.wait_for(Listener.got.get(), 10) == ("room1", "hello")
    # The announcer is subscribed too, but a publish never delivers to its sender (it would loop forever).
    count = await runtime.publish_message([TextBlock(text="direct")], TopicId("news", "room2"))
    assert count == 2
    # Both subscribers get it; the announcer relays it once more (with itself as sender, so not to itself).
    assert await asyncio.wait_for(Listener.got.get(), 10) == ("room2", "direct")
    assert await asyncio.wait_for(Listener.got.get(), 10) == ("room2", "direct")
    await runtime.remove_subscription(sub_id)
    assert await runtime.publish_message([TextBlock(text="late")], TopicId("news", "room3")) == 1
    assert Listener.got.empty()


class Reporter(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("started", blocks)
        for word in ("a", "b", "c"):
            await ctx.stream(word)
        await ctx.emit_progress(AgentStep.DONE)
        return [TextBlock(text="ok")]


async def test_progress_replays_the_run_tree_then_follows_live(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    app = App()
    app.register("reporter", lambda _id: Reporter())
    await start_worker(app)
    run = new_root_run()
    await runtime.send_message([TextBlock(text="go")], AgentId("reporter", "r"), run=run, timeout=10)
    seen = []
    async with asyncio.timeout(10):
        async for event in runtime.progress(run.run_id):  # subscribed AFTER the run: replay from the start
            seen.append(event)
            if event.step == AgentStep.DONE:
                break
    assert [e.step for e in seen] == [AgentStep.STARTED, AgentStep.DONE]
    assert [e.seq for e in seen] == [1, 2]
    assert all(e.run_id == run.run_id and e.root_id == run.run_id and e.depth == 0 for e in seen)


async def test_stream_delivers_token_deltas_live(runtime: Runtime, start_worker: StartWorker) -> None:
    app = App()
    app.register("reporter", lambda _id: Reporter())
    await start_worker(app)
    target = AgentId("reporter", "s")
    deltas: list[str] = []
    ready = asyncio.Event()

    async def watch() -> None:
        stream = runtime.stream(target)
        it = aiter(stream)
        ready.set()
        async for event in it:
            assert isinstance(event, TextDelta)
            deltas.append(event.text)
            if len(deltas) == 3:
                return

    watcher = asyncio.create_task(watch())
    await ready.wait()
    await asyncio.sleep(0.1)  # let the core subscription reach the server before the agent streams
    await runtime.send_message([], target, timeout=10)
    await asyncio.wait_for(watcher, 10)
    assert deltas == ["a", "b", "c"]


async def test_event_log_records_received_messages_and_replies(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    app = App()
    app.register("echo", lambda _id: Echo())
    await start_worker(app)
    target = AgentId("echo", "logged")
    await runtime.send_message([TextBlock(text="one")], target, timeout=10, message_id="msg-one")
    log = runtime.event_log(target)
    records = await log.read()
    entries = [r.entry for r in records]
    assert isinstance(entries[0], RunMessageReceived)
    assert entries[0].message_id == "msg-one"
    assert isinstance(entries[1], ReplyMessage)
    assert entries[1].text == "logged:one"
    assert await log.last_seq() == records[-1].seq


async def test_duplicate_message_id_is_handled_once(runtime: Runtime, start_worker: StartWorker) -> None:
    app = App()
    app.register("counter", lambda _id: Counter())
    await start_worker(app)
    target = AgentId("counter", "dup")
    first = await runtime.send_message([], target, timeout=10, message_id="same-id")
    assert text(first) == "1"
    # A retried send with the same id is de-duplicated by JetStream (inside the window) and answered from the
    # checkpoint's stored reply (issue 12: it used to wait for its deadline); the handler does not run twice.
    assert text(await runtime.send_message([], target, timeout=10, message_id="same-id")) == "1"
    assert text(await runtime.send_message([], target, timeout=10)) == "2"


class Restorer(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        await ctx.checkpoint()
        self.state["n"] = 999  # an unwanted change...
        await ctx.restore()  # ...rolled back to the checkpoint
        return [TextBlock(text=str(self.state["n"]))]


async def test_context_checkpoint_and_restore(runtime: Runtime, start_worker: StartWorker) -> None:
    app = App()
    app.register("restorer", lambda _id: Restorer())
    await start_worker(app)
    target = AgentId("restorer", "r")
    assert text(await runtime.send_message([], target, timeout=10)) == "1"
    assert text(await runtime.send_message([], target, timeout=10)) == "2"
