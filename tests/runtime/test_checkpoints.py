"""CheckpointStore against a real nats-server: compare-and-swap saves fence out zombies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from plexus.core._errors import KernelError
from plexus.runtime.ops._server import NatsServer
from plexus.runtime.store._artifacts import PayloadTooLargeError
from plexus.runtime.store._checkpoints import Checkpoint, CheckpointConflictError, CheckpointStore
from plexus.runtime.store._topology import ensure_topology

KEY = "default.chat.s1"


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    conn = await nats.connect(nats_server.url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def kv(nc: NATS) -> KeyValue:
    return (await ensure_topology(nc.jetstream())).checkpoints


async def test_load_of_a_missing_key_is_none(kv: KeyValue) -> None:
    assert await CheckpointStore(kv).load(KEY) is None


async def test_save_then_load_and_update(kv: KeyValue) -> None:
    store = CheckpointStore(kv)
    r1 = await store.save(KEY, b"one", None)
    assert await store.load(KEY) == Checkpoint(b"one", r1)
    r2 = await store.save(KEY, b"two", r1)
    assert r2 > r1
    assert await store.load(KEY) == Checkpoint(b"two", r2)
    r3 = await store.save(KEY, b"", r2)  # empty state is a state
    assert await store.load(KEY) == Checkpoint(b"", r3)


async def test_create_when_it_already_exists_conflicts(kv: KeyValue) -> None:
    store = CheckpointStore(kv)
    r1 = await store.save(KEY, b"one", 0)
    with pytest.raises(CheckpointConflictError) as info:
        await store.save(KEY, b"again", None)
    assert (info.value.key, info.value.expected_revision, info.value.actual_revision) == (KEY, None, r1)
    assert await store.load(KEY) == Checkpoint(b"one", r1)


async def test_update_of_a_missing_key_conflicts(kv: KeyValue) -> None:
    with pytest.raises(CheckpointConflictError) as info:
        await CheckpointStore(kv).save(KEY, b"x", 5)
    assert info.value.expected_revision == 5
    assert info.value.actual_revision is None


async def test_a_zombie_cannot_overwrite_the_new_owner(nats_server: NatsServer) -> None:
    # Two workers on their own connections, like two processes.
    conn_a = await nats.connect(nats_server.url)
    conn_b = await nats.connect(nats_server.url)
    try:
        a = CheckpointStore((await ensure_topology(conn_a.jetstream())).checkpoints)
        b = CheckpointStore((await ensure_topology(conn_b.jetstream())).checkpoints)
        r = await a.save(KEY, b"state-0", None)

        loaded_a = await a.load(KEY)  # A owns the partition and starts a handler...
        loaded_b = await b.load(KEY)  # ...A stalls, its lease expires, B takes over
        assert loaded_a is not None
        assert loaded_b is not None
        assert loaded_a.revision == loaded_b.revision == r
        r_b = await b.save(KEY, b"state-from-B", loaded_b.revision)

        with pytest.raises(CheckpointConflictError) as info:
            await a.save(KEY, b"late-state-from-A", loaded_a.revision)
        err = info.value
        assert (err.key, err.expected_revision, err.actual_revision) == (KEY, r, r_b)
        assert await b.load(KEY) == Checkpoint(b"state-from-B", r_b)
    finally:
        await conn_a.close()
        await conn_b.close()


async def test_racing_saves_with_the_same_revision_one_wins(kv: KeyValue) -> None:
    store = CheckpointStore(kv)
    r = await store.save(KEY, b"0", None)

    async def save(i: int) -> int | CheckpointConflictError:
        try:
            return await store.save(KEY, str(i).encode(), r)
        except CheckpointConflictError as exc:
            return exc

    results = await asyncio.gather(*(save(i) for i in range(10)))
    wins = [x for x in results if isinstance(x, int)]
    losses = [x for x in results if isinstance(x, CheckpointConflictError)]
    assert len(wins) == 1
    assert len(losses) == 9
    assert all(x.expected_revision == r and x.actual_revision == wins[0] for x in losses)


async def test_delete_with_and_without_revision(kv: KeyValue) -> None:
    store = CheckpointStore(kv)
    r1 = await store.save(KEY, b"a", None)
    r2 = await store.save(KEY, b"b", r1)
    with pytest.raises(CheckpointConflictError) as info:
        await store.delete(KEY, r1)
    assert info.value.actual_revision == r2
    assert await store.load(KEY) == Checkpoint(b"b", r2)
    await store.delete(KEY, r2)
    assert await store.load(KEY) is None
    # After a delete the key can be created again.
    r3 = await store.save(KEY, b"c", None)
    assert await store.load(KEY) == Checkpoint(b"c", r3)
    await store.delete(KEY, None)
    assert await store.load(KEY) is None


async def test_state_larger_than_max_payload_is_a_clear_error(tmp_path: Path) -> None:
    server = NatsServer(store_dir=tmp_path / "small", max_payload=4096).start()
    try:
        conn = await nats.connect(server.url)
        try:
            store = CheckpointStore((await ensure_topology(conn.jetstream())).checkpoints)
            with pytest.raises(PayloadTooLargeError) as info:
                await store.save(KEY, b"x" * 5000, None)
            assert info.value.limit == 4096
            assert info.value.size > 5000
            # Fits the payload alone but not with the CAS header: still caught before the server sees it.
            with pytest.raises(PayloadTooLargeError):
                await store.save(KEY, b"x" * 4090, None)
            assert await store.load(KEY) is None
            r = await store.save(KEY, b"small", None)  # the connection survived
            assert await store.load(KEY) == Checkpoint(b"small", r)
            assert conn.is_connected
        finally:
            await conn.close()
    finally:
        server.stop()


@pytest.mark.parametrize("key", ["", "has space", "a*b", "a>b", ".lead", "trail."])
async def test_bad_keys_are_value_errors(kv: KeyValue, key: str) -> None:
    store = CheckpointStore(kv)
    with pytest.raises(ValueError, match="invalid checkpoint key"):
        await store.load(key)
    with pytest.raises(ValueError, match="invalid checkpoint key"):
        await store.save(key, b"x", None)
    with pytest.raises(ValueError, match="invalid checkpoint key"):
        await store.delete(key, None)


async def test_negative_revision_is_a_value_error(kv: KeyValue) -> None:
    with pytest.raises(ValueError, match="expected_revision"):
        await CheckpointStore(kv).save(KEY, b"x", -1)


def test_conflict_error_is_a_kernel_error_that_round_trips() -> None:
    err = CheckpointConflictError("k", 3, 4)
    assert isinstance(err, KernelError)
    assert err.field_values() == {"key": "k", "expected_revision": 3, "actual_revision": 4}
    assert KernelError.from_wire(err.to_wire()) == err
    assert "expected revision 3, found revision 4" in str(err)
    assert "found absent" in str(CheckpointConflictError("k", None, None))
