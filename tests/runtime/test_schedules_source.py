"""`PLEXUS_INBOX`'s position in its source `PLEXUS_SCHEDULES` (docs/schedules.md, "the source mark").

An inbox that has never stored a sourced message has no position there: when its sourcing consumer is made
again (on R3, after a leader moved), the server starts it at the time of the inbox's newest message, and
every fire stored before that time was skipped for good. Issue 40's R3 leader kill lost its timer so.
Here the sourcing consumer is deleted on one node, which the inbox handles the same way.
"""

from __future__ import annotations

import asyncio

import pytest

from plexus.runtime import NatsServer, Runtime
from plexus.runtime.store._schedules import STREAM_SCHEDULES, source_mark_subjects

INBOX = "PLEXUS_INBOX"
#: The inbox checks its sources every 10 s and then asks for a new consumer: well within this.
RESOURCED_WITHIN_S = 60.0


async def _stored(rt: Runtime, subjects: str) -> int:
    state = (await rt.connection.js.stream_info(INBOX, subjects_filter=subjects)).state
    return sum((state.subjects or {}).values())


@pytest.mark.timeout(RESOURCED_WITHIN_S + 30)
async def test_a_fire_made_while_the_inbox_had_no_sourcing_consumer_still_arrives(
    nats_server: NatsServer,
) -> None:
    # `replicas` makes this the operator's run, which reconciles the topology (and marks the source).
    rt = await Runtime.connect(nats_server.url, replicas=1)
    try:
        js = rt.connection.js
        assert await _stored(rt, source_mark_subjects("px")[1]) == 1
        # A message handled and acked away, as in any inbox in use: the server's fallback applies only then.
        handled = await js.publish("px.default.in.sink.done", b"")
        await js.delete_msg(INBOX, handled.seq)
        # The inbox's sourcing consumer goes away, as it does with the leader that held it.
        for consumer in await js.consumers_info(STREAM_SCHEDULES):
            await js.delete_consumer(STREAM_SCHEDULES, consumer.name)
        # A fire while nothing sources it (no worker runs: the copy would wait in the inbox), then a
        # message stored in the inbox directly, newer than that fire.
        await js.publish("px.default.fire.sink.lost", b"")
        await js.publish("px.default.in.sink.other", b"")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESOURCED_WITHIN_S
        while await _stored(rt, "px.default.inp.sink.*.lost") == 0:
            assert loop.time() < deadline, "the fire made meanwhile never reached the inbox"
            await asyncio.sleep(0.5)
        assert await _stored(rt, "px.default.inp.sink.*.lost") == 1
    finally:
        await rt.close()
