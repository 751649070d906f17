"""One write per durable message (issue 12): an agent's EventLog entries and checkpoint are stored in one
atomic batch, fenced on both subjects, against a real nats-server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from nats.js.errors import NotFoundError

from plexus.core import AgentId, BaseBlock, ConcurrentAppendError, RunMessageReceived, TextBlock
from plexus.runtime import NatsServer, Runtime
from plexus.runtime._agentstate import AgentStateStore
from plexus.runtime._checkpoints import Checkpoint, CheckpointStore
from plexus.runtime._subjects import checkpoint_key

from .apps_misc import build_app
from .conftest import StartWorker

PING: list[BaseBlock] = [TextBlock(text="ping")]


@pytest.fixture
async def rt(nats_server: NatsServer) -> AsyncIterator[Runtime]:
    runtime = await Runtime.connect(nats_server.url)
    try:
        yield runtime
    finally:
        await runtime.close()


def _store(rt: Runtime, legacy: bool = False) -> AgentStateStore:
    return AgentStateStore(
        rt.nc,
        rt.js,
        rt.topology.names.events_stream,
        CheckpointStore(rt.topology.checkpoints) if legacy else None,
    )


def _entry(agent: AgentId) -> RunMessageReceived:
    return RunMessageReceived(run_id="run_x", agent_id=str(agent), message_id=f"m-{uuid.uuid4().hex}")


async def test_commit_stores_log_entries_and_checkpoint_in_one_batch(rt: Runtime) -> None:
    agent = AgentId("chat", "one")
    log, store = rt.event_log(agent), _store(rt)
    log_seq, revision = await store.commit(log, [_entry(agent)], 0, b'{"n":1}', None)
    assert revision == log_seq + 1  # consecutive: the batch was stored as one unit
    assert await log.last_seq() == log_seq
    assert await store.load(log, "unused") == (Checkpoint(b'{"n":1}', revision), False)

    log_seq2, revision2 = await store.commit(log, [_entry(agent)], log_seq, b'{"n":2}', revision)
    assert (await store.load(log, "unused"))[0] == Checkpoint(b'{"n":2}', revision2)
    # The checkpoint subject keeps only the newest message (rollup); the log keeps every entry.
    info = await rt.js.stream_info(rt.topology.names.events_stream, subjects_filter=">")
    assert info.state.subjects is not None
    assert info.state.subjects[store.checkpoint_subject(log)] == 1
    assert info.state.subjects[log.subject] == 2
    assert len(await log.read()) == 2
    assert log_seq2 > log_seq


@pytest.mark.parametrize("stale", ["log", "checkpoint"])
async def test_a_stale_commit_is_fenced_and_writes_nothing(rt: Runtime, stale: str) -> None:
    """A zombie (stale log sequence or checkpoint revision) gets ConcurrentAppendError; neither half lands."""
    agent = AgentId("chat", f"fenced-{stale}")
    log, store = rt.event_log(agent), _store(rt)
    log_seq, revision = await store.commit(log, [_entry(agent)], 0, b"owner-1", None)
    await store.commit(log, [_entry(agent)], log_seq, b"owner-2", revision)  # the new owner moved on
    last_log = await log.last_seq()
    expected_log, expected_revision = (log_seq, None) if stale == "log" else (last_log, revision)
    with pytest.raises(ConcurrentAppendError):
        await store.commit(log, [_entry(agent)], expected_log, b"zombie", expected_revision)
    assert await log.last_seq() == last_log
    assert (await store.load(log, "unused"))[0].state == b"owner-2"  # type: ignore[union-attr]


async def test_checkpoint_alone_is_fenced_by_its_revision(rt: Runtime) -> None:
    agent = AgentId("chat", "alone")
    log, store = rt.event_log(agent), _store(rt)
    revision = await store.save(log, b"a", None)
    assert await store.save(log, b"b", revision) > revision
    with pytest.raises(ConcurrentAppendError):
        await store.save(log, b"zombie", revision)
    assert (await store.load(log, "unused"))[0].state == b"b"  # type: ignore[union-attr]


async def test_a_legacy_kv_checkpoint_is_read_then_moved_by_the_next_commit(rt: Runtime) -> None:
    """Migration: checkpoints written before one-write commits live in the plexus_checkpoints bucket."""
    agent = AgentId("chat", "legacy")
    key = checkpoint_key(agent.namespace, agent.type, agent.key)
    await CheckpointStore(rt.topology.checkpoints).save(key, b'{"old":true}', None)
    log, store = rt.event_log(agent), _store(rt, legacy=True)
    loaded, legacy = await store.load(log, key)
    assert legacy
    assert loaded is not None
    assert loaded.state == b'{"old":true}'
    _, revision = await store.commit(log, [_entry(agent)], 0, b'{"new":true}', None)
    assert await store.load(log, key) == (Checkpoint(b'{"new":true}', revision), False)


async def test_a_worker_commit_is_one_batch_and_leaves_the_kv_bucket_alone(
    rt: Runtime, start_worker: StartWorker
) -> None:
    """End to end: after messages to a durable agent its checkpoint message directly follows its last log
    entry (one batch per message) and no checkpoint was written to the legacy KV bucket."""
    await start_worker(build_app())
    agent = AgentId("counter", "c1")
    for _ in range(3):
        await rt.send_message(PING, agent, timeout=10)
    log = rt.event_log(agent)
    ckpt = await rt.js.get_last_msg(rt.topology.names.events_stream, f"{log.subject}.ckpt")
    assert ckpt.seq == await log.last_seq() + 1
    assert len({record.seq for record in await log.read()}) == 3  # one log batch per message
    with pytest.raises(NotFoundError):
        await rt.topology.checkpoints.get(checkpoint_key(agent.namespace, agent.type, agent.key))
