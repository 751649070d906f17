"""Issue 12 item 1: a durable message is committed by ONE JetStream write — the EventLog append, ending with a
`MessageCommitted` marker that carries the reply and the agent's state delta; the checkpoint is written for
a new agent, at least every `CHECKPOINT_EVERY` messages, and when no brief delta says the change. A new owner
rebuilds the state (checkpoint + deltas) and the handled-message memory from the log, so a duplicate is still
answered with the stored reply and the state continues exactly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plexus.core import AgentId, BaseBlock, MessageId, RunMessageReceived, TextBlock
from plexus.runtime import Agent, App, Context, MessageCommitted, Runtime
from plexus.runtime.wire._subjects import checkpoint_key
from plexus.runtime.worker._activation import CHECKPOINT_EVERY

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
    entry = await rt.topology.checkpoints.get(checkpoint_key(agent.namespace, agent.type, agent.key))
    return int(entry.revision or 0)


async def _send(rt: Runtime, agent: AgentId, text: str, message_id: str | None = None) -> str:
    reply = await rt.send_message([TextBlock(text=text)], agent, timeout=20, message_id=message_id)
    return "".join(getattr(b, "text", "") for b in reply)


async def test_an_unchanged_state_commits_with_the_eventlog_append_alone(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    await start_worker(app())
    echo = AgentId("c-echo", "k")
    assert await _send(runtime, echo, "first") == "first"  # a new agent: its checkpoint is written
    first = await _revision(runtime, echo)
    for i in range(CHECKPOINT_EVERY - 1):
        assert await _send(runtime, echo, f"m{i}") == f"m{i}"
    assert await _revision(runtime, echo) == first  # no checkpoint write for these
    batches: dict[int, list[Any]] = {}
    for record in await runtime.event_log(echo).read():
        batches.setdefault(record.seq, []).append(record.entry)
    assert len(batches) == CHECKPOINT_EVERY  # one EventLog write per message
    markers = [b[-1] for b in list(batches.values())[1:]]
    assert all(isinstance(m, MessageCommitted) and m.reply for m in markers)
    assert [isinstance(b[0], RunMessageReceived) for b in batches.values()] == [True] * len(batches)
    # The checkpoint is still written with (at least) every CHECKPOINT_EVERY-th message.
    assert await _send(runtime, echo, "last") == "last"
    assert await _revision(runtime, echo) > first
    # A state change is one write too: its delta rides in the marker.
    counter = AgentId("c-counter", "k")
    assert await _send(runtime, counter, "x") == "1"  # new: checkpointed
    created = await _revision(runtime, counter)
    for i in range(2, 6):
        assert await _send(runtime, counter, "x") == str(i)
    assert await _revision(runtime, counter) == created
    markers = [
        r.entry for r in await runtime.event_log(counter).read() if isinstance(r.entry, MessageCommitted)
    ]
    assert [m.state for m in markers] == [f'{{"set":{{"n":{i}}}}}' for i in range(2, 6)]


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
    # The checkpoint holds n=1 and ["n0"]; the new owner applies the deltas logged after it.
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
    before = await _revision(runtime, notes)
    await _send(runtime, notes, "x" * 40_000)  # over DELTA_MAX_BYTES: written whole
    assert await _revision(runtime, notes) > before
    markers = [
        r.entry for r in await runtime.event_log(notes).read() if isinstance(r.entry, MessageCommitted)
    ]
    assert markers == []
    assert (await _send(runtime, notes, "b")).endswith(",b")
