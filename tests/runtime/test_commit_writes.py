"""Issue 12 item 1 (in part): a message that leaves its agent's state unchanged is committed by ONE JetStream
write (the EventLog append, ending with a `MessageCommitted` marker that carries the reply); the checkpoint is
written when the state changes, for a new agent, and at least every `CHECKPOINT_EVERY` messages. A new owner
rebuilds the handled-message memory from the log, so a duplicate is still answered with the stored reply."""

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


def app() -> App:
    app = App()
    app.register("c-echo", lambda _id: Echo())
    app.register("c-counter", lambda _id: Counter())
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
    # A state change writes it every time.
    counter = AgentId("c-counter", "k")
    revisions = []
    for i in range(3):
        assert await _send(runtime, counter, "x") == str(i + 1)
        revisions.append(await _revision(runtime, counter))
    assert revisions == sorted(set(revisions))


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
