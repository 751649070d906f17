"""Reading an EventLog's few batches since a checkpoint leaves no consumer on the server.

A re-activated key replays its EventLog since its checkpoint. Each replay used to make an ordered consumer,
which the server keeps for its inactivity threshold after the read; a worker re-activating keys at full
speed (a restart after a burst, keys passivated and coming back) had thousands of them, and its handlers
failed with "maximum consumers limit reached". Short reads are now single requests; a long stretch still
reads through one consumer, and both return the same records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.kernel import EventLog
from tests.runtime.conftest import StartWorker


class Counter(Agent):
    """Durable state: each message's change is committed to its EventLog, and a re-activation replays it."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        return [TextBlock(text=str(self.state["n"]))]


async def _events_consumers(runtime: Runtime) -> int:
    info = await runtime.js.stream_info(runtime.topology.names.events_stream)
    return int(info.state.consumer_count)


async def _each_key_once(runtime: Runtime, keys: list[str]) -> list[str]:
    sem = asyncio.Semaphore(50)

    async def send(key: str) -> str:
        async with sem:
            reply = await runtime.send_message([TextBlock(text="+1")], AgentId("counter", key), timeout=30)
            block = reply[0]
            assert isinstance(block, TextBlock)
            return block.text

    return await asyncio.gather(*(send(key) for key in keys))


async def test_re_activating_known_keys_makes_no_consumer_and_keeps_their_state(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    app = App()
    app.register("counter", lambda _id: Counter())
    worker = await start_worker(app, idle_passivate_s=3600.0)
    keys = [f"k{i}" for i in range(200)]
    assert await _each_key_once(runtime, keys) == ["1"] * len(keys)

    worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=0.0)
    await worker._upkeep.passivate()
    worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=3600.0)
    before = await _events_consumers(runtime)
    # Each key comes back from its EventLog (one message: no checkpoint yet) and counts on from there.
    assert await _each_key_once(runtime, keys) == ["2"] * len(keys)
    assert await _events_consumers(runtime) == before == 0


async def test_a_short_and_a_long_read_return_every_batch_in_order(runtime: Runtime) -> None:
    names = runtime.topology.names
    subject = runtime.subjects.evlog("reads", "mine")
    other = runtime.subjects.evlog("reads", "other")
    # A log of integers, interleaved with another key's so its sequences are not contiguous; read with
    # nats-py's gets (the default) and with the runtime connection's multiplexed ones.
    plain = EventLog(
        runtime.js, subject, stream=names.events_stream, encode=lambda n: str(n).encode(), decode=int
    )
    gets = runtime.connection.gets
    multiplexed = EventLog(
        runtime.js,
        subject,
        stream=names.events_stream,
        encode=lambda n: str(n).encode(),
        decode=int,
        get_last_msg=gets.get_last_msg,
        get_next_msg=gets.get_next_msg,
    )
    neighbour = EventLog(
        runtime.js, other, stream=names.events_stream, encode=lambda n: str(n).encode(), decode=int
    )
    seqs: list[int] = []
    for n in range(80):
        seqs.append(await plain.append([2 * n, 2 * n + 1], expected_seq=seqs[-1] if seqs else 0))
        await neighbour.append([-n], expected_seq=0 if n == 0 else await neighbour.last_seq())

    # Short (through the runtime's multiplexed gets) and long (over the single-request budget: the rest by a
    # consumer), from the start and from the middle, up to the end or to a given batch.
    for reader in (plain, multiplexed):
        whole = await reader.read()
        assert [r.seq for r in whole] == [s for s in seqs for _ in range(2)]
        assert [r.index for r in whole] == [0, 1] * 80
        part = await reader.read(from_seq=seqs[70], to_seq=seqs[72])
        assert [r.seq for r in part] == [seqs[70]] * 2 + [seqs[71]] * 2 + [seqs[72]] * 2
        assert await reader.read(from_seq=seqs[-1] + 1) == []
    assert [r.entry for r in await plain.read(from_seq=seqs[3], to_seq=seqs[4])] == [6, 7, 8, 9]


async def test_reading_since_a_time_makes_no_consumer_and_matches_the_consumer_read(runtime: Runtime) -> None:
    """What a takeover asks of every message it inherits: the batches stored since the message was."""
    names = runtime.topology.names
    subject = runtime.subjects.evlog("reads", "since")
    gets = runtime.connection.gets

    def encode(n: int) -> bytes:
        return str(n).encode()

    stream = names.events_stream
    by_consumer = EventLog(runtime.js, subject, stream=stream, encode=encode, decode=int)
    by_gets = EventLog(
        runtime.js,
        subject,
        stream=stream,
        encode=encode,
        decode=int,
        get_last_msg=gets.get_last_msg,
        get_next_msg=gets.get_next_msg,
        get_first_since=gets.get_first_since,
    )
    seqs = [await by_gets.append([0], expected_seq=0)]
    await asyncio.sleep(0.3)
    middle = datetime.datetime.now(datetime.UTC)
    await asyncio.sleep(0.3)
    for n in range(1, 35):
        seqs.append(await by_gets.append([n], expected_seq=seqs[-1]))
    await asyncio.sleep(0.3)
    late = datetime.datetime.now(datetime.UTC)
    await asyncio.sleep(0.3)
    for n in range(35, 40):
        seqs.append(await by_gets.append([n], expected_seq=seqs[-1]))

    # A short read since a time (the usual case: a message stored shortly before): single requests only.
    since_late = await by_gets.read_since(late)
    assert [(r.seq, r.entry) for r in since_late] == list(zip(seqs[35:], range(35, 40), strict=True))
    assert await by_gets.read_since(datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=5)) == []
    assert await _events_consumers(runtime) == 0
    # Longer ones (past the single-request budget) read the rest through a consumer, as the old path did.
    assert [r.entry for r in await by_gets.read_since(middle)] == list(range(1, 40))
    assert [r.entry for r in await by_gets.read_since(middle - datetime.timedelta(hours=1))] == list(
        range(40)
    )
    assert [r.entry for r in await by_consumer.read_since(middle)] == list(range(1, 40))
