"""`Follower` (a subscription read without a task per message) and the iterators built on it:
`Runtime.progress` and `Runtime.stream` keep order over a burst and end when the connection closes."""

from __future__ import annotations

import asyncio

import pytest

from plexus.core import AgentId, AgentStep, TextDelta, progress_event_json
from plexus.runtime import NatsServer, Runtime, new_root_run
from plexus.runtime.store._follow import Follower


async def test_delivers_in_order_and_ends_after_what_was_delivered() -> None:
    follower: Follower[int] = Follower()
    for i in range(5):
        await follower.deliver(i)
    follower.end()
    await follower.deliver(99)  # after the end: dropped, not read
    assert [m async for m in follower] == [0, 1, 2, 3, 4]


async def test_a_waiting_reader_wakes_for_each_delivery() -> None:
    follower: Follower[str] = Follower()
    got: list[str] = []

    async def read() -> None:
        async for m in follower:
            got.append(m)

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.01)  # the reader waits on an empty follower
    await follower.deliver("a")
    await asyncio.sleep(0.01)
    assert got == ["a"]
    await follower.deliver("b")
    follower.end()
    await asyncio.wait_for(reader, 1)
    assert got == ["a", "b"]


async def test_the_closed_event_ends_a_waiting_reader() -> None:
    closed = asyncio.Event()
    follower: Follower[int] = Follower(closed)
    await follower.deliver(1)
    reader = asyncio.ensure_future(_collect(follower))
    await asyncio.sleep(0.01)
    assert not reader.done()
    closed.set()
    assert await asyncio.wait_for(reader, 1) == [1]


async def test_past_the_limit_delivery_waits_for_the_reader() -> None:
    follower: Follower[int] = Follower(limit=2)
    await follower.deliver(1)
    await follower.deliver(2)
    third = asyncio.ensure_future(follower.deliver(3))
    await asyncio.sleep(0.01)
    assert not third.done()  # held back: the subscription's own queue keeps the rest meanwhile
    assert await follower.__anext__() == 1
    await asyncio.wait_for(third, 1)
    follower.end()
    assert [m async for m in follower] == [2, 3]


async def test_end_releases_a_delivery_held_at_the_limit() -> None:
    follower: Follower[int] = Follower(limit=1)
    await follower.deliver(1)
    held = asyncio.ensure_future(follower.deliver(2))
    await asyncio.sleep(0.01)
    follower.end()
    await asyncio.wait_for(held, 1)
    assert [m async for m in follower] == [1]


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        Follower(limit=0)


async def _collect(follower: Follower[int]) -> list[int]:
    return [m async for m in follower]


async def test_progress_and_stream_keep_order_over_a_burst_and_end_on_close(nats_server: NatsServer) -> None:
    rt = await Runtime.connect(nats_server.url)
    writer = await Runtime.connect(nats_server.url)
    try:
        run = new_root_run()
        agent = AgentId("burst", "k")
        n = 3000
        progress = rt.progress(run.run_id)
        stream = rt.stream(agent)
        got_progress: list[int] = []
        got_stream: list[str] = []
        all_in = asyncio.Event()

        async def read_progress() -> None:
            async for event in progress:
                got_progress.append(event.seq)
                if len(got_stream) == n and len(got_progress) == n:
                    all_in.set()

        async def read_stream() -> None:
            async for event in stream:
                assert isinstance(event, TextDelta)
                got_stream.append(event.text)
                if len(got_stream) == n and len(got_progress) == n:
                    all_in.set()

        readers = [asyncio.create_task(read_progress()), asyncio.create_task(read_stream())]
        await asyncio.sleep(0.3)  # both subscriptions are live (the progress one replays anyway)
        progress_subject = rt.subjects.progress(run.root_id, agent.type, agent.key)
        stream_subject = rt.subjects.stream(agent.type, agent.key)
        for seq in range(1, n + 1):
            event = progress_event_json(
                agent_id=str(agent),
                step=AgentStep.THINKING,
                content=[],
                run_id=run.run_id,
                root_id=run.root_id,
                parent_id=None,
                depth=0,
                seq=seq,
                ts=0.0,
                metadata={},
            )
            await writer.nc.publish(progress_subject, event)  # stored by the progress stream, in order
            await writer.nc.publish(stream_subject, b'{"type":"text_delta","text":"%d"}' % seq)
        await writer.nc.flush()
        await asyncio.wait_for(all_in.wait(), 30)
        assert got_progress == list(range(1, n + 1))
        assert got_stream == [str(i) for i in range(1, n + 1)]
        await rt.close()  # both iterations end: nothing hangs on a closed connection
        await asyncio.wait_for(asyncio.gather(*readers), 5)
    finally:
        await writer.close()
        if not rt.nc.is_closed:
            await rt.close()
