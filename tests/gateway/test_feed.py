"""`TreeFeed`, the hand-over between an SSE stream's subscription callback and the stream's loop."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.msg import Msg

from plexus.gateway._feed import TreeFeed


def _msg(i: int) -> Msg:
    client: Any = None  # never used: the feed only holds the message
    return Msg(_client=client, subject="px.t", data=str(i).encode())


async def test_events_come_out_in_the_order_delivered_and_wake_the_stream() -> None:
    feed = TreeFeed()
    waiting = asyncio.ensure_future(feed.wait(5.0))
    await asyncio.sleep(0)
    for i in range(3):
        await feed.deliver(_msg(i))
    assert await waiting is True
    assert [feed.take().data for _ in range(3)] == [b"0", b"1", b"2"]
    assert not feed.msgs


async def test_a_quiet_wait_ends_after_its_timeout_and_a_spent_one_at_once() -> None:
    feed = TreeFeed()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await feed.wait(0.05) is False
    assert loop.time() - started >= 0.04
    assert await feed.wait(0.0) is False
    assert await feed.wait(-1.0) is False


async def test_the_token_tap_wakes_a_waiting_stream_through_the_same_event() -> None:
    feed = TreeFeed()
    waiting = asyncio.ensure_future(feed.wait(5.0))
    await asyncio.sleep(0)
    feed.wake.set()  # what TokenTap does when it queues a delta
    assert await waiting is True
    assert not feed.msgs


async def test_delivery_waits_while_the_feed_is_full_and_loses_nothing() -> None:
    feed = TreeFeed(limit=2)
    await feed.deliver(_msg(0))
    await feed.deliver(_msg(1))
    third = asyncio.ensure_future(feed.deliver(_msg(2)))
    await asyncio.sleep(0.01)
    assert not third.done()  # back-pressure: nats-py keeps it (and what follows) in its own queue
    assert feed.take().data == b"0"
    await asyncio.wait_for(third, 1.0)
    assert [feed.take().data for _ in range(2)] == [b"1", b"2"]
