"""Agent-type registry and worker heartbeats against a real nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.js.kv import KeyValue

from plexus.runtime.store._registry import (
    AgentTypeInfo,
    AgentTypeNotFoundError,
    KVMirror,
    Registry,
    RegistryCache,
    WorkerInfo,
    kv_snapshot,
    type_ref,
)

TTL = 30.0


async def make_buckets(nc: Client) -> tuple[KeyValue, KeyValue]:
    """The two buckets as `_topology` creates them: registry history 1, workers with a bucket TTL."""
    js = nc.jetstream()
    types = await js.create_key_value(bucket="registry", history=1)
    workers = await js.create_key_value(bucket="workers", history=1, ttl=TTL)
    return types, workers


@pytest.fixture
async def conns(nats_url: str) -> AsyncIterator[tuple[Client, Client]]:
    a, b = await nats.connect(nats_url), await nats.connect(nats_url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@pytest.fixture
async def registries(conns: tuple[Client, Client]) -> tuple[Registry, Registry]:
    """Two registries on two connections over the same buckets."""
    types_a, workers_a = await make_buckets(conns[0])
    js_b = conns[1].jetstream()
    types_b, workers_b = await js_b.key_value("registry"), await js_b.key_value("workers")
    return Registry(types_a, workers_a, ttl_s=TTL), Registry(types_b, workers_b, ttl_s=TTL)


def echo(**changes: object) -> AgentTypeInfo:
    base = AgentTypeInfo(
        namespace="default",
        type="echo",
        description="repeats",
        capabilities=["chat", "echo"],
        durable=True,
        partitions=4,
        metadata={"team": "core"},
    )
    return msgspec.structs.replace(base, **changes)


def worker(worker_id: str, *types: str, heartbeat_at: float | None = None) -> WorkerInfo:
    now = time.time()
    return WorkerInfo(
        worker_id=worker_id,
        host="h",
        pid=1,
        started_at=now,
        heartbeat_at=now if heartbeat_at is None else heartbeat_at,
        types=list(types),
        concurrency=4,
        version="0.1.0",
    )


# -- values ----------------------------------------------------------------------------------------------
def test_agent_type_info_round_trips_as_json() -> None:
    info = echo()
    assert msgspec.json.decode(msgspec.json.encode(info), type=AgentTypeInfo) == info
    assert info.ref == "default/echo"
    assert info.version == 1


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"partitions": 0}, "partitions must be >= 1"),
        ({"type": "bad type"}, "agent type 'bad type'"),
        ({"namespace": ""}, "namespace must not be empty"),
        ({"capabilities": ["chat", ""]}, "capabilities must be non-empty"),
    ],
)
def test_agent_type_info_rejects_bad_values(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        echo(**changes)


def test_bad_agent_type_info_on_the_wire_is_rejected() -> None:
    raw = msgspec.json.encode(echo()).replace(b'"partitions":4', b'"partitions":-1')
    with pytest.raises(msgspec.ValidationError, match="partitions must be >= 1"):
        msgspec.json.decode(raw, type=AgentTypeInfo)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"worker_id": ""}, "worker_id must not be empty"),
        ({"concurrency": 0}, "concurrency must be >= 1"),
        ({"types": ["echo"]}, "'echo' is not 'ns/type'"),
        ({"types": ["default/bad type"]}, "agent type 'bad type'"),
    ],
)
def test_worker_info_rejects_bad_values(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        msgspec.structs.replace(worker("w1"), **changes)


def test_worker_info_local_and_liveness() -> None:
    info = WorkerInfo.local("w1", ["default/echo", "default/echo"], concurrency=2)
    assert info.types == ["default/echo"]
    assert info.pid > 0
    assert info.hosts("default/echo")
    assert not info.hosts("default/other")
    assert info.is_live(10, now=info.heartbeat_at + 10)
    assert not info.is_live(10, now=info.heartbeat_at + 10.5)
    assert info.is_live(10, now=info.heartbeat_at - 100)  # clock skew: a future heartbeat is live


def test_registry_rejects_a_non_positive_ttl() -> None:
    with pytest.raises(ValueError, match="heartbeat TTL"):
        Registry(None, None, ttl_s=0)  # type: ignore[arg-type]


# -- agent types -----------------------------------------------------------------------------------------
async def test_register_get_list_and_capabilities(registries: tuple[Registry, Registry]) -> None:
    a, b = registries
    assert await b.get_type("default", "echo") is None
    assert await b.list_types() == []
    await a.register_type(echo())
    await a.register_type(echo(type="search", capabilities=["web"], durable=False, partitions=1))
    await a.register_type(echo(namespace="team.x", capabilities=["chat"]))

    assert await b.get_type("default", "echo") == echo()
    assert [t.ref for t in await b.list_types()] == ["default/echo", "default/search", "team.x/echo"]
    assert [t.ref for t in await b.list_types("team.x")] == ["team.x/echo"]
    assert await b.capabilities("default", "echo") == ["chat", "echo"]
    assert [t.ref for t in await b.find_by_capability("chat")] == ["default/echo", "team.x/echo"]
    assert [t.ref for t in await b.find_by_capability("chat", "team.x")] == ["team.x/echo"]
    assert await b.find_by_capability("nothing") == []


async def test_names_are_escaped_into_keys(registries: tuple[Registry, Registry]) -> None:
    a, b = registries
    await a.register_type(echo(namespace="a.b", type="x:y=z"))
    await a.register_type(echo(namespace="a", type="b.x:y=z"))  # would collide without escaping
    assert (await b.get_type("a.b", "x:y=z")) == echo(namespace="a.b", type="x:y=z")
    assert [t.ref for t in await b.list_types("a")] == ["a/b.x:y=z"]


async def test_unknown_type_capabilities_raise(registries: tuple[Registry, Registry]) -> None:
    with pytest.raises(AgentTypeNotFoundError, match="default/ghost is not registered") as info:
        await registries[0].capabilities("default", "ghost")
    assert (info.value.namespace, info.value.type) == ("default", "ghost")


async def test_register_is_idempotent_and_updates_descriptive_fields(
    registries: tuple[Registry, Registry], conns: tuple[Client, Client]
) -> None:
    a, b = registries
    kv = await conns[0].jetstream().key_value("registry")
    await a.register_type(echo())
    rev = (await kv.get("default.echo")).revision
    await b.register_type(echo())
    assert (await kv.get("default.echo")).revision == rev  # same info: no write at all
    await b.register_type(echo(description="new words", capabilities=["chat"], version=2))
    stored = await a.get_type("default", "echo")
    assert stored is not None
    assert (stored.description, stored.capabilities, stored.version) == ("new words", ["chat"], 2)


async def test_conflicting_registration_raises(registries: tuple[Registry, Registry]) -> None:
    a, b = registries
    await a.register_type(echo())
    with pytest.raises(ValueError, match=r"partitions=4.*partitions=8"):
        await b.register_type(echo(partitions=8))
    with pytest.raises(ValueError, match=r"durable=True.*durable=False"):
        await b.register_type(echo(durable=False))
    assert await a.get_type("default", "echo") == echo()


async def test_concurrent_first_registrations_agree(registries: tuple[Registry, Registry]) -> None:
    a, b = registries
    results = await asyncio.gather(
        a.register_type(echo()), b.register_type(echo(partitions=8)), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, ValueError)]
    assert len(errors) == 1  # exactly one of the two shapes won
    stored = await a.get_type("default", "echo")
    assert stored in results


async def test_unregister(registries: tuple[Registry, Registry]) -> None:
    a, b = registries
    await a.register_type(echo())
    assert await b.unregister_type("default", "echo")
    assert not await b.unregister_type("default", "echo")
    assert await a.get_type("default", "echo") is None
    await a.register_type(echo(partitions=8))  # a fresh registration may choose a new shape
    assert (await b.capabilities("default", "echo")) == ["chat", "echo"]


async def test_undecodable_values_are_skipped(
    registries: tuple[Registry, Registry], conns: tuple[Client, Client]
) -> None:
    a, _ = registries
    kv = await conns[0].jetstream().key_value("registry")
    await a.register_type(echo())
    await kv.put("default.broken", b"{not json")
    assert [t.ref for t in await a.list_types()] == ["default/echo"]


# -- workers ---------------------------------------------------------------------------------------------
async def test_heartbeat_live_workers_and_remove(registries: tuple[Registry, Registry]) -> None:
    a, b = registries
    before = time.time()
    stored = await a.heartbeat(worker("w2", "default/echo", heartbeat_at=0))
    assert stored.heartbeat_at >= before  # heartbeat() stamps the time itself
    await b.heartbeat(worker("w1", "default/echo", "default/search"))
    assert [w.worker_id for w in await a.live_workers()] == ["w1", "w2"]
    assert [w.worker_id for w in await a.live_workers("default/search")] == ["w1"]
    assert await a.live_workers("default/none") == []
    await b.remove_worker("w1")
    assert [w.worker_id for w in await a.live_workers()] == ["w2"]


async def test_stale_heartbeat_counts_as_dead_before_the_server_expires_it(
    registries: tuple[Registry, Registry], conns: tuple[Client, Client]
) -> None:
    a, _ = registries
    kv = await conns[0].jetstream().key_value("workers")
    stale = worker("w-old", "default/echo", heartbeat_at=time.time() - TTL - 1)
    await kv.put("w-old", msgspec.json.encode(stale))
    assert await a.live_workers() == []
    await a.heartbeat(stale)
    assert [w.worker_id for w in await a.live_workers()] == ["w-old"]


async def test_wait_for_host(registries: tuple[Registry, Registry]) -> None:
    a, b = registries
    assert not await a.wait_for_host("default", "echo", timeout=0.2)
    await b.heartbeat(worker("w-other", "default/other"))
    waiting = asyncio.create_task(a.wait_for_host("default", "echo", timeout=10))
    await asyncio.sleep(0)  # let the waiter start its watch; correctness does not depend on it
    await b.heartbeat(worker("w1", "default/echo"))
    assert await waiting
    assert await a.wait_for_host("default", "echo", timeout=0.2)  # already hosted: True at once
    await b.remove_worker("w1")
    assert not await a.wait_for_host("default", "echo", timeout=0.2)


async def test_worker_key_expires_with_the_bucket_ttl(conns: tuple[Client, Client]) -> None:
    js = conns[0].jetstream()
    types = await js.create_key_value(bucket="registry", history=1)
    workers = await js.create_key_value(bucket="workers", history=1, ttl=1)
    registry = Registry(types, workers, ttl_s=1)
    await registry.heartbeat(worker("w1", "default/echo"))
    loop = asyncio.get_running_loop()
    end = loop.time() + 15
    while await kv_snapshot(workers):  # server-side expiry emits no event: re-check until the deadline
        assert loop.time() < end, "the worker key did not expire"
        await asyncio.sleep(0.1)
    assert await registry.live_workers() == []


# -- RegistryCache ---------------------------------------------------------------------------------------
async def test_cache_follows_changes_from_another_connection(
    registries: tuple[Registry, Registry], conns: tuple[Client, Client]
) -> None:
    a, _ = registries
    await a.register_type(echo())
    await a.heartbeat(worker("w1", "default/echo"))
    js = conns[1].jetstream()
    cache = RegistryCache(Registry(await js.key_value("registry"), await js.key_value("workers"), ttl_s=TTL))
    with pytest.raises(RuntimeError, match="not started"):
        cache.get_type("default", "echo")
    await cache.start()
    try:
        # Current contents are loaded by the time start() returns.
        assert cache.get_type("default", "echo") == echo()
        assert [w.worker_id for w in cache.live_workers("default/echo")] == ["w1"]
        assert cache.has_live_host("default", "echo")
        assert not cache.has_live_host("default", "search")
        assert cache.capabilities("default", "echo") == ["chat", "echo"]

        await a.register_type(echo(type="search", capabilities=["web"]))
        assert await cache.wait_until(lambda: cache.get_type("default", "search") is not None, 5)
        assert [t.ref for t in cache.find_by_capability("web")] == ["default/search"]
        assert [t.ref for t in cache.list_types("default")] == ["default/echo", "default/search"]

        await a.unregister_type("default", "search")
        assert await cache.wait_until(lambda: cache.get_type("default", "search") is None, 5)
        with pytest.raises(AgentTypeNotFoundError):
            cache.capabilities("default", "search")

        assert not await cache.wait_for_host("default", "search", timeout=0.2)
        waiting = asyncio.create_task(cache.wait_for_host("default", "search", timeout=10))
        await a.heartbeat(worker("w2", "default/search"))
        assert await waiting

        await a.remove_worker("w1")
        assert await cache.wait_until(lambda: not cache.live_workers("default/echo"), 5)
        assert [w.worker_id for w in cache.live_workers()] == ["w2"]
    finally:
        await cache.stop()


async def test_mirror_ignores_older_revisions_and_bad_values(conns: tuple[Client, Client]) -> None:
    types, _ = await make_buckets(conns[0])
    mirror: KVMirror[AgentTypeInfo] = KVMirror(types, msgspec.json.Decoder(AgentTypeInfo).decode)
    await mirror.start()
    try:
        mirror.apply("k", msgspec.json.encode(echo(version=2)), 10)
        mirror.apply("k", msgspec.json.encode(echo(version=1)), 9)  # arrives late: ignored
        assert mirror.items["k"].version == 2
        mirror.apply("k", None, 10)  # a local delete of the revision it removed wins
        assert "k" not in mirror.items
        mirror.apply("k", msgspec.json.encode(echo()), 10)  # the watch's copy of that revision: ignored
        assert "k" not in mirror.items
        mirror.apply("bad", b"[1, 2]", 11)
        assert "bad" not in mirror.items
    finally:
        await mirror.stop()


def test_type_ref() -> None:
    assert type_ref("ns", "t") == "ns/t"
