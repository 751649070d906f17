"""Timers and reminders (tests/runtime/test_schedules.py) on the secured R3 cluster of this directory's
conftest: `PLEXUS_SCHEDULES` is created R3 by the operator's topology, workers write schedules as their
least-privileged user (a permissions violation fails the test), and a fire while no worker runs waits in the
inbox."""

import asyncio

from plexus.runtime import Runtime
from tests.runtime.test_schedules import (
    test_a_cancelled_timer_never_fires,
    test_a_reminder_fires_until_cleared_and_is_listed,
    test_timer_fires_once_after_kill9_of_the_worker_that_set_it,
)

__all__ = [
    "test_a_cancelled_timer_never_fires",
    "test_a_reminder_fires_until_cleared_and_is_listed",
    "test_the_inbox_sources_fired_copies_right_after_the_topology",
    "test_timer_fires_once_after_kill9_of_the_worker_that_set_it",
]


async def test_the_inbox_sources_fired_copies_right_after_the_topology(runtime: Runtime) -> None:
    # The conftest's operator has just created the topology. The inbox's sourcing consumer is created by
    # PLEXUS_SCHEDULES's leader: asked before that stream existed, nobody answered, and the inbox asked
    # again only 30 s + 10 s later (or later still), while every fire waited in PLEXUS_SCHEDULES.
    js = runtime.connection.js
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20.0
    while True:
        sources = (await js.stream_info("PLEXUS_INBOX")).sources or []
        active = [s.active for s in sources if s.name == "PLEXUS_SCHEDULES"]
        # Active is -1 until the source has reached the stream.
        if active and active[0] is not None and active[0] >= 0:
            break
        assert loop.time() < deadline, f"PLEXUS_INBOX's source of PLEXUS_SCHEDULES: {sources}"
        await asyncio.sleep(0.3)
