"""Topic fan-out as one message (issue 12 item 4): a publication to stateless subscribers is ONE core NATS
message on the topic subject, each subscribed stateless type handles it exactly once however many workers
host it, durable subscribers keep their own inbox message, and bad topic messages are dead-lettered."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, TextBlock, TopicId
from plexus.runtime import Agent, App, Context, NatsServer, Runtime
from plexus.runtime.kernel import TypeSubscription
from plexus.runtime.store._registry import topic_group
from plexus.runtime.wire._envelope import HDR_TOPIC_TO, Envelope, encode_envelope, payload_from_blocks

from .apps_misc import dead_letters
from .conftest import StartWorker

TYPES = ("fan-a", "fan-b", "fan-c")


class Counting(Agent):
    """Records (type, key, text, message id) of every message it handles."""

    seen: ClassVar[asyncio.Queue[tuple[str, str, str]]]

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> None:
        body = "".join(getattr(b, "text", "") for b in blocks)
        Counting.seen.put_nowait((ctx.agent_id.type, ctx.agent_id.key, body))


def fan_app() -> App:
    app = App()
    for name in TYPES:
        app.register(name, lambda _id: Counting(), durable=False)
    app.register("fan-durable", lambda _id: Counting())
    return app


async def _collect(n: int, timeout: float = 10.0) -> list[tuple[str, str, str]]:
    return [await asyncio.wait_for(Counting.seen.get(), timeout) for _ in range(n)]


async def test_a_publication_is_one_message_and_each_type_handles_it_once(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    Counting.seen = asyncio.Queue()
    # Two workers host the same types: each type's copy must still run once, not once per worker.
    await start_worker(fan_app())
    await start_worker(fan_app())
    for name in (*TYPES, "fan-durable"):
        await runtime.add_subscription(TypeSubscription(topic_type="fan", agent_type=name))
    on_topic: list[Msg] = []
    on_eph: list[Msg] = []

    async def topic_cb(msg: Msg) -> None:
        on_topic.append(msg)

    async def eph_cb(msg: Msg) -> None:
        on_eph.append(msg)

    await runtime.nc.subscribe(runtime.subjects.topic_wildcard(), cb=topic_cb)
    await runtime.nc.subscribe(f"{runtime.subjects.base}.eph.>", cb=eph_cb)
    await runtime.nc.flush()

    rounds = 20
    for i in range(rounds):
        assert await runtime.publish_message([TextBlock(text=f"m{i}")], TopicId("fan", "room")) == 4
    got = await _collect(rounds * 4)
    per_type = Counter(t for t, _, _ in got)
    assert per_type == dict.fromkeys((*TYPES, "fan-durable"), rounds)
    assert {key for _, key, _ in got} == {"room"}
    sent = [f"m{i}" for i in range(rounds)]
    # A durable subscriber keeps its key's order; a stateless type's copies may run on either worker.
    assert [b for t, _, b in got if t == "fan-durable"] == sent
    for name in TYPES:
        assert sorted(b for t, _, b in got if t == name) == sorted(sent)
    await asyncio.sleep(0.3)  # nothing more may arrive: no second copy from the other worker
    assert Counting.seen.empty()
    # One core message per publication for the three stateless types, none on their per-key subjects.
    assert len(on_topic) == rounds
    assert on_eph == []
    assert sorted(on_topic[0].headers[HDR_TOPIC_TO].split(" ")) == sorted(TYPES)  # type: ignore[index]


async def test_a_type_without_a_subscription_never_sees_the_publication(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    Counting.seen = asyncio.Queue()
    await start_worker(fan_app())
    await runtime.add_subscription(TypeSubscription(topic_type="only-a", agent_type="fan-a"))
    assert await runtime.publish_message([TextBlock(text="x")], TopicId("only-a", "k")) == 1
    assert await _collect(1) == [("fan-a", "k", "x")]
    await asyncio.sleep(0.3)
    assert Counting.seen.empty()


def _topic_envelope(topic: str, *, kind: str = "publish") -> Envelope:
    return Envelope(
        id="01JTOPIC0000000000000000AA",
        kind=kind,  # type: ignore[arg-type]
        target="fan-a/k",
        topic=topic,
        payload=payload_from_blocks([TextBlock(text="bad")]),
        sent_at=time.time(),
    )


async def test_bad_topic_messages_are_dead_lettered_and_the_worker_keeps_serving(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    Counting.seen = asyncio.Queue()
    await start_worker(fan_app())
    await runtime.add_subscription(TypeSubscription(topic_type="fan", agent_type="fan-a"))
    subject = runtime.subjects.topic("fan", "k")
    cases: list[tuple[bytes, dict[str, str], str]] = []
    good_headers = {"Nats-Msg-Id": "01JTOPIC0000000000000000AA", "Plexus-V": "1", HDR_TOPIC_TO: "fan-a"}
    cases.append((b"\xff not json", good_headers, "garbage"))
    # The envelope names another topic than the subject it arrived on.
    cases.append((encode_envelope(_topic_envelope("default/other/k")), good_headers, "topic"))
    # A send envelope on a topic subject.
    cases.append((encode_envelope(_topic_envelope("default/fan/k", kind="send")), good_headers, "topic"))
    async with dead_letters(runtime) as dlq:
        for data, headers, _ in cases:
            await runtime.nc.publish(subject, data, headers=headers)
        reasons = []
        for _ in cases:
            dead = await dlq.expect(lambda m: (m.headers or {}).get("Plexus-Dlq-Subject") == subject)
            reasons.append((dead.headers or {})["Plexus-Dlq-Reason"])
    assert reasons[1:] == ["topic", "topic"]
    assert reasons[0] in {"garbage", "json", "schema", "header"}
    # A message that does not list a hosted type is not this worker's: neither handled nor dead-lettered.
    env = msgspec.structs.replace(_topic_envelope("default/fan/k"), id="01JTOPIC0000000000000000AB")
    await runtime.nc.publish(
        subject,
        encode_envelope(env),
        headers={"Nats-Msg-Id": env.id, "Plexus-V": "1", HDR_TOPIC_TO: "someone-else"},
    )
    # And the worker still serves publications and requests.
    assert await runtime.publish_message([TextBlock(text="ok")], TopicId("fan", "k")) == 1
    assert await _collect(1) == [("fan-a", "k", "ok")]
    assert await runtime.send_message([TextBlock(text="hi")], AgentId("fan-b", "z"), timeout=10) == []
    assert Counting.seen.get_nowait() == ("fan-b", "z", "hi")


class Mutating(Agent):
    """Appends to the list it was given: another type's copy of the same publication must not see it."""

    seen: ClassVar[asyncio.Queue[tuple[str, int]]]

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> None:
        Mutating.seen.put_nowait((ctx.agent_id.type, len(blocks)))
        blocks.append(TextBlock(text="mine"))


async def test_copies_decoded_once_are_still_separate_lists(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    Mutating.seen = asyncio.Queue()
    app = App()
    names = [f"mut-{i}" for i in range(5)]
    for name in names:
        app.register(name, lambda _id: Mutating(), durable=False)
    await start_worker(app)
    for name in names:
        await runtime.add_subscription(TypeSubscription(topic_type="mut", agent_type=name))
    for _ in range(3):
        await runtime.publish_message([TextBlock(text="one")], TopicId("mut", "k"))
    got = [await asyncio.wait_for(Mutating.seen.get(), 10) for _ in range(3 * len(names))]
    assert sorted(got) == sorted((name, 1) for name in names for _ in range(3))


def _topic_subscriptions(nats_server: NatsServer, subject: str) -> list[dict[str, Any]]:
    """Every subscription on `subject` the server knows, with its queue group and delivered count."""
    url = f"http://{nats_server.host}:{nats_server.monitor_port}/connz?subs=detail&limit=1024"
    with urllib.request.urlopen(url, timeout=5) as resp:
        connz = json.load(resp)
    return [
        sub
        for conn in connz["connections"]
        for sub in conn.get("subscriptions_list_detail") or []
        if sub["subject"] == subject
    ]


async def test_a_worker_receives_a_publication_once_for_all_the_types_it_hosts(
    runtime: Runtime, start_worker: StartWorker, nats_server: NatsServer
) -> None:
    """Issue 12 item 4: the worker takes the publication ONCE and dispatches it to its local subscribers
    (not one delivery per hosted type)."""
    Counting.seen = asyncio.Queue()
    await start_worker(fan_app())
    for name in TYPES:
        await runtime.add_subscription(TypeSubscription(topic_type="once", agent_type=name))
    rounds = 10
    for i in range(rounds):
        assert await runtime.publish_message([TextBlock(text=f"m{i}")], TopicId("once", "k")) == 3
    got = await _collect(rounds * 3)
    assert Counter(t for t, _, _ in got) == dict.fromkeys(TYPES, rounds)
    subs = _topic_subscriptions(nats_server, runtime.subjects.topic_wildcard())
    assert len(subs) == 1  # one topic subscription for the worker's three stateless types
    assert subs[0]["qgroup"] == runtime.subjects.topic_queue(topic_group(TYPES))
    assert int(subs[0]["msgs"]) == rounds  # one delivery per publication


def _mixed_app(*names: str) -> App:
    app = App()
    for name in names:
        app.register(name, lambda _id: Counting(), durable=False)
    return app


async def test_types_hosted_by_workers_of_different_sets_are_each_handled_once(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """A mixed deployment: worker 1 hosts a and b, worker 2 hosts b and c (two delivery groups, b in both).
    Each group receives every publication; b's copy is handled by one group only."""
    Counting.seen = asyncio.Queue()
    one = await start_worker(_mixed_app("fan-a", "fan-b"))
    two = await start_worker(_mixed_app("fan-b", "fan-c"))
    for name in TYPES:
        await runtime.add_subscription(TypeSubscription(topic_type="mixed", agent_type=name))
    groups = {topic_group(["fan-a", "fan-b"]), topic_group(["fan-b", "fan-c"])}
    # Both workers derive the same owner for b once each has seen the other's heartbeat.
    for worker in (one, two):
        view = worker.rt.connection.registry_view
        assert await view.wait_until(lambda v=view: len(v.live_workers()) == 2, 10)  # type: ignore[misc]
        assert view.topic_owner("default", "fan-b") == min(groups)
        assert view.topic_owner("default", "fan-a") == topic_group(["fan-a", "fan-b"])
    rounds = 20
    for i in range(rounds):
        assert await runtime.publish_message([TextBlock(text=f"m{i}")], TopicId("mixed", "k")) == 3
    got = await _collect(rounds * 3)
    assert Counter(t for t, _, _ in got) == dict.fromkeys(TYPES, rounds)
    for name in TYPES:
        assert sorted(b for t, _, b in got if t == name) == sorted(f"m{i}" for i in range(rounds))
    await asyncio.sleep(0.3)
    assert Counting.seen.empty()  # no second copy of b from the other group


async def _two_types_subscribed(runtime: Runtime, start_worker: StartWorker) -> str:
    """A worker hosting the fan types, fan-a and fan-b subscribed to topic "fan"; the subject of fan/k."""
    Counting.seen = asyncio.Queue()
    await start_worker(fan_app())
    for name in ("fan-a", "fan-b"):
        await runtime.add_subscription(TypeSubscription(topic_type="fan", agent_type=name))
    return runtime.subjects.topic("fan", "k")


def _dead_on(subject: str) -> Callable[[Msg], bool]:
    return lambda m: (m.headers or {}).get("Plexus-Dlq-Subject") == subject


async def test_a_bad_publication_for_several_hosted_types_is_dead_lettered_once(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """What all copies share is checked once: one dead letter per bad publication, not one per type."""
    subject = await _two_types_subscribed(runtime, start_worker)
    headers = {"Nats-Msg-Id": "01JTOPIC0000000000000000AC", "Plexus-V": "1", HDR_TOPIC_TO: "fan-a fan-b"}
    first = encode_envelope(_topic_envelope("default/fan/k", kind="send"))
    second = encode_envelope(_topic_envelope("default/other/k"))
    on_subject = _dead_on(subject)
    async with dead_letters(runtime) as dlq:
        await runtime.nc.publish(subject, first, headers=headers)
        assert (await dlq.expect(on_subject)).data == first
        await runtime.nc.publish(subject, second, headers=headers)
        # The next dead letter is the second publication's: the first had no copy for its second type.
        assert (await dlq.expect(on_subject)).data == second
    assert Counting.seen.empty()


async def test_a_copy_whose_id_would_be_too_long_is_dead_lettered_for_its_type(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """A copy's id is ``<publication id>.<type>``: one past the id limit is refused per copy, as schema."""
    subject = await _two_types_subscribed(runtime, start_worker)
    env = msgspec.structs.replace(_topic_envelope("default/fan/k"), id="m" * 252)  # + ".fan-a": 258
    headers = {"Nats-Msg-Id": env.id, "Plexus-V": "1", HDR_TOPIC_TO: "fan-a fan-b"}
    on_subject = _dead_on(subject)
    async with dead_letters(runtime) as dlq:
        await runtime.nc.publish(subject, encode_envelope(env), headers=headers)
        reasons = [((await dlq.expect(on_subject)).headers or {})["Plexus-Dlq-Reason"] for _ in range(2)]
    assert reasons == ["schema", "schema"]
    assert Counting.seen.empty()
