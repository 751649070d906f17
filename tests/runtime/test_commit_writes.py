"""Issue 12 item 1: a durable message is committed by ONE JetStream write — the EventLog append, ending with a
`MessageCommitted` marker that carries the reply and the agent's state delta; the checkpoint is written for
a new agent, at least every `CHECKPOINT_EVERY` messages, and when no brief delta says the change. A new owner
rebuilds the state (checkpoint + deltas) and the handled-message memory from the log, so a duplicate is still
answered with the stored reply and the state continues exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError

from plexus.core import AgentId, BaseBlock, HandlerError, MessageId, RunMessageReceived, TextBlock
from plexus.runtime import Agent, App, Context, PayloadTooLargeError, Runtime
from plexus.runtime.store._registry import WorkerInfo
from plexus.runtime.wire._subjects import checkpoint_key
from plexus.runtime.worker._activation import CHECKPOINT_EVERY
from plexus.runtime.worker._commit import CheckpointTaken, MessageCommitted
from plexus.runtime.worker._delta import STATE_DELTAS

from .conftest import StartWorker


class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return blocks


class Counter(Agent):
    def __init__(self) -> None:
        self.n = 0

    def save_state(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.n = int(state["n"])

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.n += 1
        return [TextBlock(text=str(self.n))]


class Notes(Agent):
    """Appends each message's text to a list; "undo" adds one, restores, and answers with the list."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = "".join(getattr(b, "text", "") for b in blocks)
        self.state["notes"] = [*self.state.get("notes", []), text]
        self.state["last"] = text
        if text == "undo":
            await ctx.restore()
        return [TextBlock(text=",".join(self.state.get("notes", [])))]


def app() -> App:
    app = App()
    app.register("c-echo", lambda _id: Echo())
    app.register("c-counter", lambda _id: Counter())
    app.register("c-notes", lambda _id: Notes())
    return app


async def _revision(rt: Runtime, agent: AgentId) -> int:
    """The agent's checkpoint revision; 0 while it has none."""
    try:
        entry = await rt.topology.checkpoints.get(checkpoint_key(agent.namespace, agent.type, agent.key))
    except KeyNotFoundError:
        return 0
    return int(entry.revision or 0)


async def _send(rt: Runtime, agent: AgentId, text: str, message_id: str | None = None) -> str:
    reply = await rt.send_message([TextBlock(text=text)], agent, timeout=20, message_id=message_id)
    return "".join(getattr(b, "text", "") for b in reply)


async def test_every_message_commits_with_the_eventlog_append_alone(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    await start_worker(app())
    echo = AgentId("c-echo", "k")
    for i in range(CHECKPOINT_EVERY - 1):
        assert await _send(runtime, echo, f"m{i}") == f"m{i}"
    assert await _revision(runtime, echo) == 0  # not even a new agent's first message writes a checkpoint
    batches: dict[int, list[Any]] = {}
    for record in await runtime.event_log(echo).read():
        batches.setdefault(record.seq, []).append(record.entry)
    assert len(batches) == CHECKPOINT_EVERY - 1  # one EventLog write per message
    markers = [b[-1] for b in batches.values()]
    assert all(isinstance(m, MessageCommitted) and m.reply and m.state is None for m in markers)
    assert [isinstance(b[0], RunMessageReceived) for b in batches.values()] == [True] * len(batches)
    # The checkpoint is written with (at least) every CHECKPOINT_EVERY-th message.
    assert await _send(runtime, echo, "last") == "last"
    assert await _revision(runtime, echo) > 0
    # A state change is one write too: its delta rides in the marker (a new agent's first change as well).
    counter = AgentId("c-counter", "k")
    for i in range(1, 6):
        assert await _send(runtime, counter, "x") == str(i)
    assert await _revision(runtime, counter) == 0
    markers = [
        r.entry for r in await runtime.event_log(counter).read() if isinstance(r.entry, MessageCommitted)
    ]
    assert [m.state for m in markers] == [f'{{"set":{{"n":{i}}}}}' for i in range(1, 6)]


async def test_a_new_owner_answers_a_duplicate_of_a_message_committed_by_its_append_alone(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    first = await start_worker(app())
    echo = AgentId("c-echo", "dup")
    assert await _send(runtime, echo, "warm") == "warm"
    message_id = str(MessageId.new())
    assert await _send(runtime, echo, "once", message_id) == "once"
    revision = await _revision(runtime, echo)
    await first.stop(drain_timeout=5)
    await start_worker(app())
    # The checkpoint does not know the message; the log does. The duplicate is answered, not run again.
    assert await _revision(runtime, echo) == revision
    assert await _send(runtime, echo, "other text", message_id) == "once"
    received = [
        str(r.entry.message_id)
        for r in await runtime.event_log(echo).read()
        if isinstance(r.entry, RunMessageReceived)
    ]
    assert received.count(message_id) == 1
    # And the agent goes on.
    assert await _send(runtime, echo, "next") == "next"


async def test_a_new_owner_continues_from_the_checkpoint_and_the_logged_deltas(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    first = await start_worker(app())
    counter, notes = AgentId("c-counter", "moved"), AgentId("c-notes", "moved")
    for i in range(1, 6):
        assert await _send(runtime, counter, "x") == str(i)
    for i in range(5):
        assert await _send(runtime, notes, f"n{i}") == ",".join(f"n{j}" for j in range(i + 1))
    # A list that grows logs its new items only, not the list again.
    markers = [
        r.entry for r in await runtime.event_log(notes).read() if isinstance(r.entry, MessageCommitted)
    ]
    assert markers[-1].state == '{"set":{"last":"n4"},"ext":{"notes":["n4"]}}'
    await first.stop(drain_timeout=5)
    await start_worker(app())
    # Neither has a checkpoint yet: the new owner applies the deltas of their logs from the start.
    assert await _revision(runtime, counter) == 0
    assert await _send(runtime, counter, "x") == "6"
    assert await _send(runtime, notes, "n5") == "n0,n1,n2,n3,n4,n5"


async def test_restore_goes_back_to_the_last_commit_not_the_checkpoint(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    await start_worker(app())
    notes = AgentId("c-notes", "undo")
    for i in range(3):
        await _send(runtime, notes, f"n{i}")
    assert await _send(runtime, notes, "undo") == "n0,n1,n2"  # n1 and n2 were committed as deltas
    assert await _send(runtime, notes, "n3") == "n0,n1,n2,n3"


async def test_a_state_too_large_for_a_delta_is_checkpointed(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    await start_worker(app())
    notes = AgentId("c-notes", "big")
    await _send(runtime, notes, "a")
    await _send(runtime, notes, "b")
    before = await _revision(runtime, notes)
    await _send(runtime, notes, "x" * 40_000)  # over DELTA_MAX_BYTES: written whole
    assert await _revision(runtime, notes) > before
    last = [r.entry for r in await runtime.event_log(notes).read()][-1]
    assert not isinstance(last, MessageCommitted)  # its batch has no marker: the checkpoint committed it
    assert (await _send(runtime, notes, "c")).endswith(",c")


class Growing(Agent):
    """Keeps every message's text; "clear" forgets them all."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = "".join(getattr(b, "text", "") for b in blocks)
        kept = [] if text == "clear" else [*self.state.get("kept", []), text]
        self.state["kept"] = kept
        return [TextBlock(text=str(len(kept)))]


async def test_a_state_growing_by_deltas_past_the_checkpoint_limit_never_wedges_the_agent(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Each message adds 30 KB (a delta, under DELTA_MAX_BYTES); the one that would make the state too big for
    a checkpoint fails with PayloadTooLargeError (as before deltas), and the agent goes on afterwards. Without
    the size check, the deltas would carry the state past the limit and the next checkpoint, and every one
    after it, would fail: the agent would be stuck for good."""
    app = App()
    app.register("c-growing", lambda _id: Growing())
    await start_worker(app)
    agent = AgentId("c-growing", "k")
    chunk = "y" * 30_000
    counts: list[int] = []
    failure: Exception | None = None
    for _ in range(60):  # 60 x 30 KB is well past 1 MB
        try:
            counts.append(int(await _send(runtime, agent, chunk)))
        except PayloadTooLargeError as exc:
            failure = exc
            break
    assert isinstance(failure, PayloadTooLargeError)
    assert counts == list(range(1, len(counts) + 1))
    assert len(counts) * 30_000 < runtime.nc.max_payload  # refused before the state outgrew a checkpoint
    assert await _send(runtime, agent, "small") == str(len(counts) + 1)  # not wedged
    assert await _send(runtime, agent, "clear") == "0"


async def test_no_delta_is_written_while_an_older_worker_hosts_the_type(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Rolling upgrade: a live host of the type that does not list the `state-delta` feature (a worker of
    the previous version) could not read a marker's delta, so state changes are checkpointed as before
    until it is gone."""
    await start_worker(app())
    counter = AgentId("c-counter", "upgrade")
    older = WorkerInfo.local("older-worker", [f"{counter.namespace}/{counter.type}"])
    await runtime.registry.heartbeat(older)
    view = runtime.connection.registry_view  # follows the same bucket as the worker's own view
    for _ in range(100):
        if not view.supported_by_all(f"{counter.namespace}/{counter.type}", STATE_DELTAS):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # and the worker's view, a watch of the same bucket, as well
    revisions = []
    for i in range(1, 4):
        assert await _send(runtime, counter, "x") == str(i)
        revisions.append(await _revision(runtime, counter))
    assert revisions == sorted(set(revisions))  # every change checkpointed
    markers = [
        r.entry for r in await runtime.event_log(counter).read() if isinstance(r.entry, MessageCommitted)
    ]
    assert markers == []


PAUSED = asyncio.Event()
RESUME = asyncio.Event()


class Saver(Agent):
    """On "save": counts, waits for the test, then asks for a checkpoint. On "peek": the count."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        if "".join(getattr(b, "text", "") for b in blocks) == "save":
            self.state["saved"] = self.state.get("saved", 0) + 1
            PAUSED.set()
            await RESUME.wait()
            await ctx.checkpoint()
        return [TextBlock(text=str(self.state.get("saved", 0)))]


async def test_a_checkpoint_a_handler_asks_for_is_fenced_like_a_commit(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """`ctx.checkpoint()` logs a fenced `CheckpointTaken` first. Here the agent's log moves on under a running
    handler (as a new owner's commits would move it under a zombie): its checkpoint must not be written, or
    it would replace the base of the state with a change that is never committed. The message then runs
    again (redelivered) and is counted once. Without the fence the stale checkpoint lands (its CAS
    succeeds: commits write no checkpoint as a rule) and the change is counted twice."""
    PAUSED.clear()
    RESUME.clear()
    app = App()
    app.register("c-saver", lambda _id: Saver())
    await start_worker(app)
    saver = AgentId("c-saver", "k")
    reply = asyncio.create_task(_send(runtime, saver, "save"))
    await asyncio.wait_for(PAUSED.wait(), 10)
    log = runtime.event_log(saver)
    intruder = RunMessageReceived(run_id="run_x", agent_id=str(saver), message_id="elsewhere")
    await log.append([intruder], await log.last_seq())
    RESUME.set()
    assert await reply == "1"  # the second run, after the first was fenced
    assert await _send(runtime, saver, "peek") == "1"
    taken = [r.entry for r in await log.read() if isinstance(r.entry, CheckpointTaken)]
    assert len(taken) == 1  # the second run's


class Fragile(Agent):
    """Counts messages; "boom" counts too, then fails."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = self.state.get("n", 0) + 1
        if "".join(getattr(b, "text", "") for b in blocks) == "boom":
            raise RuntimeError("boom")
        return [TextBlock(text=str(self.state["n"]))]


async def test_a_failed_handling_commits_its_error_not_its_state(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """What Dapr actors and Temporal workflows do: a handler that raises leaves no half-applied state (the
    agent goes back to its last commit), and its error is committed so a duplicate is answered with it."""
    app = App()
    app.register("c-fragile", lambda _id: Fragile())
    await start_worker(app)
    agent = AgentId("c-fragile", "k")
    assert await _send(runtime, agent, "a") == "1"
    failed = str(MessageId.new())
    with pytest.raises(HandlerError):
        await _send(runtime, agent, "boom", failed)
    assert await _send(runtime, agent, "b") == "2"  # "boom" counted nothing
    with pytest.raises(HandlerError):  # a duplicate gets the committed error; the handler does not run
        await _send(runtime, agent, "boom", failed)
    assert await _send(runtime, agent, "c") == "3"
