"""A message the previous owner of its partition committed but never acked (its ack was lost) reaches the next
owner as a *first* delivery (that owner's consumer is new), after the agent's memory of handled messages has
moved on. It is answered from the EventLog's record of the commit, not run a second time (the chaos run found
it: a number twice in a ledger's state, the message run again after its answer)."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.wire._envelope import encode_envelope
from plexus.runtime.worker import _commit
from plexus.runtime.worker._activation import HANDLED_MEMORY

from .apps_misc import envelope, good_headers, send_raw
from .conftest import StartWorker


class Tally(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        text = " ".join(str(getattr(b, "text", "")) for b in blocks)
        seen = self.state.setdefault("seen", [])
        if text != "read":
            seen.append(text)
        return [TextBlock(text=",".join(seen))]


def _app() -> App:
    app = App()
    app.register("tally", lambda _id: Tally())
    return app


async def test_the_next_owner_answers_a_committed_unacked_message_from_the_log(
    runtime: Runtime, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The copy below is stored after the commit (a lost ack's message was stored before it), as long after as
    # the sends in between take on a loaded machine (1.3 s in one CI run): the window the log is read from
    # covers that, or the test would check the machine's speed instead of the lookup.
    monkeypatch.setattr(_commit, "CLOCK_SLACK", datetime.timedelta(seconds=60))
    agent = AgentId("tally", "k")
    first = await start_worker(_app())
    original = envelope("tally/k", reply_to=runtime.nc.new_inbox(), blocks=[TextBlock(text="m")])
    await send_raw(runtime, original, durable=True, host="tally", key="k")  # committed (and acked)
    committed = time.monotonic()
    # The agent's memory of handled ids moves past it (sent at once: the key runs them in order).
    await asyncio.gather(
        *(
            runtime.send_message([TextBlock(text=str(i))], agent, timeout=10)
            for i in range(HANDLED_MEMORY + 6)
        )
    )
    await first.stop(drain_timeout=5)
    # What the inbox holds when the ack of a committed message was lost: the message itself. (A copy
    # without the dedupe id, which the stream would drop; stored after the commit here, but within the
    # window before its store time from which the log is read.)
    headers = {k: v for k, v in good_headers(original).items() if k != "Nats-Msg-Id"}
    await runtime.js.publish(runtime.subjects.inbox("tally", "k"), encode_envelope(original), headers=headers)
    print(f"copy stored {time.monotonic() - committed:.3f} s after the commit")
    started = time.monotonic()
    await start_worker(_app())  # takes the partition with a new consumer: a first delivery
    reply = await runtime.send_message([TextBlock(text="read")], agent, timeout=10)
    seen = str(getattr(reply[0], "text", "")).split(",")
    assert seen.count("m") == 1, seen
    assert sorted(seen[1:], key=int) == [str(i) for i in range(HANDLED_MEMORY + 6)]  # nothing else either
    assert time.monotonic() - started < 10
