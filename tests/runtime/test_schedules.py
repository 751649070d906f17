"""Timers and reminders on JetStream message schedules (docs/schedules.md), against a real nats-server.

Waits are deadline-bound polls ("arrives within N s"); a "never" is checked after the time it would have
fired plus a few seconds of margin.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from plexus.core import AgentId, AgentNotFoundError, TextBlock
from plexus.runtime import InvalidScheduleError, NatsServer, Runtime, TooManyTimersError
from plexus.runtime.store._schedule_store import ScheduleStore
from plexus.runtime.store._schedules import (
    SchedulesUnsupportedError,
    check_server_version,
    cron_spec,
    every_spec,
    timer_spec,
)

from .apps_schedules import FLAKY_RUNS
from .apps_schedules import app as schedules_app
from .conftest import StartWorker, WorkerProcess

APP = "tests.runtime.apps_schedules:app"
WAIT_S = 60.0  # generous: a failover on a loaded 2-core machine


async def _ask(rt: Runtime, agent: AgentId, text: str) -> Any:
    blocks = await rt.send_message([TextBlock(text=text)], agent, timeout=60.0)
    return json.loads(str(getattr(blocks[0], "text", "null")))


async def _eventually(
    probe: Callable[[], Awaitable[tuple[bool, Any]]], what: str, timeout: float = WAIT_S
) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        done, observed = await probe()
        if done:
            return observed
        assert loop.time() < deadline, f"{what}: last observed {observed!r}"
        await asyncio.sleep(0.3)


def _sink_has(rt: Runtime, key: str, n: int) -> Callable[[], Awaitable[tuple[bool, Any]]]:
    async def probe() -> tuple[bool, Any]:
        got = await _ask(rt, AgentId("sink", key), "read")
        return len(got) >= n, got

    return probe


async def test_timer_fires_once_after_kill9_of_the_worker_that_set_it(
    runtime: Runtime, worker_process: WorkerProcess
) -> None:
    first = worker_process(APP)

    async def served() -> tuple[bool, Any]:
        try:
            return True, await _ask(runtime, AgentId("timers", "a"), "read")
        except AgentNotFoundError as exc:  # not registered yet
            return False, exc

    await _eventually(served, "the worker process serves timers")
    await _ask(runtime, AgentId("timers", "a"), "timer k9 1")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    # The timer fires while no worker hosts the types: the fire waits in sink/k9's inbox.
    await asyncio.sleep(2.5)
    worker_process(APP)
    got = await _eventually(_sink_has(runtime, "k9", 1), "the timer's message reaches sink/k9")
    await asyncio.sleep(2.0)
    got = await _ask(runtime, AgentId("sink", "k9"), "read")
    assert got == ["fired k9"], got


async def test_a_retried_handler_schedules_once(runtime: Runtime, start_worker: StartWorker) -> None:
    FLAKY_RUNS.clear()
    await start_worker(schedules_app)
    schedule_id = await _ask(runtime, AgentId("timers", "r"), "flaky kr 1")
    assert list(FLAKY_RUNS.values()) == [2], FLAKY_RUNS  # its first commit failed: it ran again
    await _eventually(_sink_has(runtime, "kr", 1), "the timer's message reaches sink/kr")
    await asyncio.sleep(3.0)
    assert await _ask(runtime, AgentId("sink", "kr"), "read") == ["fired kr"]
    assert isinstance(schedule_id, str)


async def test_a_cancelled_timer_never_fires(runtime: Runtime, start_worker: StartWorker) -> None:
    await start_worker(schedules_app)
    cancelled = await _ask(runtime, AgentId("timers", "c"), "timer kc 2")
    await _ask(runtime, AgentId("timers", "c"), "timer kc2 2")  # a witness that timers do fire meanwhile
    await _ask(runtime, AgentId("timers", "c"), f"cancel {cancelled}")
    await _eventually(_sink_has(runtime, "kc2", 1), "the witness timer fires")
    await asyncio.sleep(2.0)
    assert await _ask(runtime, AgentId("sink", "kc"), "read") == []


async def test_a_reminder_fires_until_cleared_and_is_listed(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    await start_worker(schedules_app)
    agent = AgentId("timers", "m")
    await _ask(runtime, agent, "remind nudge")
    assert await _ask(runtime, agent, "list") == ["nudge"]

    async def ticks() -> tuple[bool, Any]:
        state = await _ask(runtime, agent, "read")
        return int(state.get("ticks", 0)) >= 3, state

    await _eventually(ticks, "three ticks of the 1-second reminder")
    await _ask(runtime, agent, "clear nudge")
    assert await _ask(runtime, agent, "list") == []
    await asyncio.sleep(1.5)  # a fire already on its way when it was cleared
    settled = int((await _ask(runtime, agent, "read")).get("ticks", 0))
    await asyncio.sleep(3.0)
    assert int((await _ask(runtime, agent, "read")).get("ticks", 0)) == settled


async def test_setting_a_reminder_again_replaces_it(runtime: Runtime, start_worker: StartWorker) -> None:
    await start_worker(schedules_app)
    agent = AgentId("timers", "twice")
    await _ask(runtime, agent, "remind once")
    await _ask(runtime, agent, "remind once")
    assert await _ask(runtime, agent, "list") == ["once"]
    await _ask(runtime, agent, "clear once")


async def test_bad_input_is_refused_by_the_call(runtime: Runtime, nats_server: NatsServer) -> None:
    with pytest.raises(InvalidScheduleError):
        timer_spec(datetime.timedelta(0), None)
    with pytest.raises(InvalidScheduleError):
        timer_spec(None, datetime.datetime(2030, 1, 1))  # naive
    with pytest.raises(InvalidScheduleError):
        timer_spec(datetime.timedelta(seconds=1), datetime.datetime.now(datetime.UTC))
    with pytest.raises(InvalidScheduleError):
        every_spec(datetime.timedelta(milliseconds=500))
    with pytest.raises(InvalidScheduleError):
        cron_spec("61 * * * *", None)
    with pytest.raises(InvalidScheduleError):
        cron_spec("0 9 * * 1-5", "Mars/Olympus")
    assert cron_spec("0 9 * * 1-5", "Europe/Paris") == ("0 0 9 * * 1-5", "Europe/Paris")
    with pytest.raises(SchedulesUnsupportedError, match=r"2\.11\.4"):
        check_server_version("2.11.4")
    check_server_version("2.12.0")


async def test_a_target_that_cannot_be_addressed_fails_the_handler(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    await start_worker(schedules_app)
    with pytest.raises(AgentNotFoundError):
        await _ask(runtime, AgentId("timers", "bad"), "nobody")


async def test_more_timers_than_the_tenants_limit_are_refused_and_nothing_is_half_written(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    await start_worker(schedules_app, max_pending_schedules=3)

    async def stored() -> int:  # counted afresh (a worker's store uses a count up to a second old)
        return await ScheduleStore(runtime.connection).stored()

    agent = AgentId("timers", "lim")
    await _ask(runtime, agent, "timer lim 600")
    assert await stored() == 1
    # Three more in one handler run: the third call raises, the handler fails, none of the three is written.
    with pytest.raises(TooManyTimersError) as refused:
        await _ask(runtime, agent, "many lim 600 3")
    assert refused.value.limit == 3
    assert await stored() == 1
    await _ask(runtime, agent, "many lim 600 2")  # up to the limit
    assert await stored() == 3
    with pytest.raises(TooManyTimersError):
        await _ask(runtime, agent, "timer lim 600")
    with pytest.raises(TooManyTimersError):
        await _ask(runtime, agent, "remind nudge")
    assert await stored() == 3
    assert await _ask(runtime, agent, "list") == []
