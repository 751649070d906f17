"""Topic subscriptions (AutoGen semantics) against a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from plexus.core._identity import AgentId, TopicId
from plexus.runtime.store._subscriptions import (
    Subscription,
    SubscriptionNotFoundError,
    SubscriptionTable,
    TypePrefixSubscription,
    TypeSubscription,
)


async def make_kv(nc: Client) -> KeyValue:
    """The subscriptions bucket as `_topology` creates it (history 1)."""
    return await nc.jetstream().create_key_value(bucket="subscriptions", history=1)


@pytest.fixture
async def conns(nats_url: str) -> AsyncIterator[tuple[Client, Client]]:
    a, b = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@pytest.fixture
async def tables(conns: tuple[Client, Client]) -> AsyncIterator[tuple[SubscriptionTable, SubscriptionTable]]:
    """Two started tables on two connections over one bucket."""
    kv_a = await make_kv(conns[0])
    kv_b = await conns[1].jetstream().key_value("subscriptions")
    a, b = SubscriptionTable(kv_a), SubscriptionTable(kv_b)
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


# -- values ----------------------------------------------------------------------------------------------
def test_subscriptions_match_and_map_like_autogen() -> None:
    sub = TypeSubscription(topic_type="news", agent_type="reader")
    assert sub.matches(TopicId("news", "s1"))
    assert not sub.matches(TopicId("news.sport", "s1"))
    assert not sub.matches(TopicId("news", "s1", namespace="other"))
    assert sub.recipient(TopicId("news", "s1")) == AgentId("reader", "s1")

    prefix = TypePrefixSubscription(topic_type_prefix="news.", agent_type="reader", namespace="team")
    assert prefix.matches(TopicId("news.sport", "s", namespace="team"))
    assert not prefix.matches(TopicId("news", "s", namespace="team"))
    assert not prefix.matches(TopicId("news.sport", "s"))
    assert prefix.recipient(TopicId("news.sport", "s", namespace="team")) == AgentId("reader", "s", "team")


def test_ids_are_fresh_ulids() -> None:
    a = TypeSubscription(topic_type="t", agent_type="x")
    b = TypeSubscription(topic_type="t", agent_type="x")
    assert a.id != b.id
    assert len(a.id) == 26


def test_subscriptions_round_trip_as_tagged_json() -> None:
    subs: list[Subscription] = [
        TypeSubscription(topic_type="t", agent_type="x", namespace="n"),
        TypePrefixSubscription(topic_type_prefix="t.", agent_type="y"),
    ]
    raw = msgspec.json.encode(subs)
    assert b'"kind":"type"' in raw
    assert b'"kind":"prefix"' in raw
    assert msgspec.json.decode(raw, type=list[Subscription]) == subs


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: TypeSubscription(topic_type="t", agent_type="bad type"), "agent type 'bad type'"),
        (lambda: TypeSubscription(topic_type="t/x", agent_type="a"), "topic type 't/x'"),
        (
            lambda: TypeSubscription(topic_type="t", agent_type="a", namespace=""),
            "namespace must not be empty",
        ),
        (
            lambda: TypePrefixSubscription(topic_type_prefix="", agent_type="a"),
            "topic type must not be empty",
        ),
        (
            lambda: TypeSubscription(topic_type="t", agent_type="a", id=""),
            "subscription id must not be empty",
        ),
    ],
)
def test_bad_subscriptions_are_rejected(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]


# -- table -----------------------------------------------------------------------------------------------
async def test_recipients_exact_prefix_dedupe_and_sender(
    tables: tuple[SubscriptionTable, SubscriptionTable],
) -> None:
    a, _ = tables
    await a.add(TypeSubscription(topic_type="news", agent_type="reader"))
    await a.add(TypeSubscription(topic_type="news", agent_type="archiver"))
    await a.add(TypePrefixSubscription(topic_type_prefix="ne", agent_type="reader"))  # same recipient again
    await a.add(TypeSubscription(topic_type="news", agent_type="reader", namespace="other"))

    topic = TopicId("news", "s1")
    assert a.recipients(topic) == [AgentId("reader", "s1"), AgentId("archiver", "s1")]
    # A publication never comes back to its sender.
    assert a.recipients(topic, sender=AgentId("reader", "s1")) == [AgentId("archiver", "s1")]
    assert a.recipients(topic, sender=AgentId("reader", "s2")) == [
        AgentId("reader", "s1"),
        AgentId("archiver", "s1"),
    ]
    assert a.recipients(TopicId("nest", "k")) == [AgentId("reader", "k")]
    assert a.recipients(TopicId("news", "s1", namespace="other")) == [AgentId("reader", "s1", "other")]
    assert a.recipients(TopicId("weather", "s1")) == []


async def test_add_and_remove_on_one_connection_are_seen_on_the_other(
    tables: tuple[SubscriptionTable, SubscriptionTable],
) -> None:
    a, b = tables
    topic = TopicId("news", "s1")
    assert b.recipients(topic) == []
    sub_id = await a.add(TypeSubscription(topic_type="news", agent_type="reader"))
    assert await b.wait_until(lambda: b.recipients(topic) == [AgentId("reader", "s1")], timeout=5)
    await a.remove(sub_id)
    assert await b.wait_until(lambda: b.recipients(topic) == [], timeout=5)

    other = TypePrefixSubscription(topic_type_prefix="new", agent_type="archiver")
    await b.add(other)
    assert await a.wait_until(lambda: a.recipients(topic) == [AgentId("archiver", "s1")], timeout=5)
    assert await a.list() == [other]


async def test_own_writes_are_visible_at_once(tables: tuple[SubscriptionTable, SubscriptionTable]) -> None:
    a, _ = tables
    topic = TopicId("news", "s1")
    sub_id = await a.add(TypeSubscription(topic_type="news", agent_type="reader"))
    assert a.recipients(topic) == [AgentId("reader", "s1")]
    await a.remove(sub_id)
    assert a.recipients(topic) == []


async def test_remove_unknown_id_raises_a_typed_error(
    tables: tuple[SubscriptionTable, SubscriptionTable],
) -> None:
    a, b = tables
    with pytest.raises(SubscriptionNotFoundError) as info:
        await a.remove("01HZZZZZZZZZZZZZZZZZZZZZZZ")
    assert info.value.subscription_id == "01HZZZZZZZZZZZZZZZZZZZZZZZ"
    assert str(info.value) == "no subscription with id '01HZZZZZZZZZZZZZZZZZZZZZZZ'"
    assert isinstance(info.value, KeyError)
    sub_id = await a.add(TypeSubscription(topic_type="t", agent_type="x"))
    await b.remove(sub_id)
    with pytest.raises(SubscriptionNotFoundError):
        await a.remove(sub_id)  # removed twice


async def test_add_is_idempotent_but_an_id_cannot_be_reused(
    tables: tuple[SubscriptionTable, SubscriptionTable],
) -> None:
    a, b = tables
    sub = TypeSubscription(topic_type="t", agent_type="x", id="fixed")
    assert await a.add(sub) == "fixed"
    assert await b.add(sub) == "fixed"
    with pytest.raises(ValueError, match="'fixed' is taken by a different subscription"):
        await b.add(TypeSubscription(topic_type="t", agent_type="other", id="fixed"))
    assert await a.list() == [sub]


async def test_list_with_and_without_cache(conns: tuple[Client, Client]) -> None:
    kv = await make_kv(conns[0])
    table = SubscriptionTable(kv)
    first = TypeSubscription(topic_type="t", agent_type="x")
    second = TypePrefixSubscription(topic_type_prefix="t", agent_type="y", namespace="n")
    await table.add(first)
    await table.add(second)
    with pytest.raises(RuntimeError, match="not started"):
        table.recipients(TopicId("t", "s"))
    assert await table.list() == [first, second]  # straight from KV, oldest first
    assert await table.list("n") == [second]
    await table.start()
    try:
        assert await table.list() == [first, second]
        assert await table.list("default") == [first]
        assert table.recipients(TopicId("t", "s")) == [AgentId("x", "s")]
    finally:
        await table.stop()
