"""Scheduled runs (docs/schedules.md, "Scheduled runs"): the server fires, the orchestrator replicas start
the runs. Against a real nats-server, with 1-second schedules.

No worker hosts the test types, so a started run stays ``running`` until the test cancels it: that is the
"previous run still running" of the overlap policies. Waits are deadline-bound polls ("within N s"); a
"never" is checked after a few fire periods.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plexus.core import AgentId, AgentNotFoundError, ExecutionBudget, TextBlock
from plexus.runtime import (
    InvalidScheduleError,
    NatsServer,
    Runtime,
    ScheduleNotFoundError,
    TooManySchedulesError,
)
from plexus.runtime.orchestration import TERMINAL, ScheduleInfo

from .conftest import StartReplica, until_serving

SECOND = datetime.timedelta(seconds=1)
WAIT_S = 30.0
ECHO = AgentId("echo", "k")


async def eventually(
    probe: Callable[[], Awaitable[tuple[bool, Any]]], what: str, timeout: float = WAIT_S
) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        done, seen = await probe()
        if done:
            return seen
        assert loop.time() < deadline, f"{what}: last seen {seen!r}"
        await asyncio.sleep(0.2)


def started(info: ScheduleInfo) -> list[str]:
    return [r.run_id for r in info.state.last_runs if r.outcome == "started"]


def outcomes(info: ScheduleInfo, outcome: str) -> int:
    return sum(1 for r in info.state.last_runs if r.outcome == outcome)


async def runs_started(rt: Runtime, sid: str, n: int) -> ScheduleInfo:
    async def probe() -> tuple[bool, Any]:
        info = await rt.get_schedule(sid)
        return len(started(info)) >= n, info.state

    await eventually(probe, f"{n} runs of {sid} started")
    return await rt.get_schedule(sid)


async def test_an_every_second_schedule_starts_a_run_at_each_fire_under_its_budget(
    rt: Runtime, replicas: StartReplica
) -> None:
    await replicas()
    budget = ExecutionBudget(max_tokens=1234, deadline_s=600)
    info = await rt.schedule_run(
        ECHO, [TextBlock(text="tick")], every=SECOND, overlap="allow", budget=budget, schedule_id="ticks"
    )
    assert info.schedule.agent_id == str(ECHO)
    assert info.next_fires
    info = await runs_started(rt, "ticks", 3)
    runs = [await rt.get_run(run_id) for run_id in started(info)]
    assert len({r.run_id for r in runs}) == len(runs)
    for run in runs:
        assert run.parent_id is None
        assert run.root_id == run.run_id
        assert run.agent_id == str(ECHO)
        assert run.budget is not None
        assert run.budget["max_tokens"] == 1234
    await rt.delete_schedule("ticks")


async def test_a_one_second_cron_in_a_time_zone_fires(rt: Runtime, replicas: StartReplica) -> None:
    await replicas()
    info = await rt.schedule_run(
        ECHO,
        [TextBlock(text="cron")],
        cron="* * * * * *",
        tz="Europe/Paris",
        overlap="allow",
        schedule_id="c",
    )
    assert info.schedule.tz == "Europe/Paris"
    assert len(info.next_fires) == 3
    await runs_started(rt, "c", 2)
    # A 5-field cron is a minute schedule: its next fires are on whole minutes.
    minute = await rt.schedule_run(ECHO, [TextBlock(text="m")], cron="*/5 * * * *", schedule_id="m")
    assert all(t % 300 == 0 for t in minute.next_fires), minute.next_fires
    await rt.delete_schedule("c")
    await rt.delete_schedule("m")


async def test_pause_resume_trigger_and_delete(rt: Runtime, replicas: StartReplica) -> None:
    await replicas()
    await rt.schedule_run(ECHO, [TextBlock(text="p")], every=SECOND, overlap="allow", schedule_id="p")
    await runs_started(rt, "p", 1)
    paused = await rt.pause_schedule("p")
    assert paused.schedule.paused
    assert paused.next_fires == []
    await asyncio.sleep(1.5)  # a fire stored before the pause is dropped by the consumer
    before = (await rt.get_schedule("p")).state.fires
    await asyncio.sleep(3.5)
    assert (await rt.get_schedule("p")).state.fires == before, "a paused schedule fired"

    # Trigger now works while paused, starts exactly the run it names, and is idempotent per fire id.
    run_id = await rt.trigger_schedule("p", fire_id="once")
    assert await rt.trigger_schedule("p", fire_id="once") == run_id
    info = await eventually(lambda: _has_run(rt, "p", run_id), "the triggered run starts")
    assert next(r for r in info.state.last_runs if r.run_id == run_id).manual
    assert (await rt.get_run(run_id)).agent_id == str(ECHO)

    resumed = await rt.resume_schedule("p")
    assert not resumed.schedule.paused
    assert resumed.next_fires
    count = len(started(resumed))
    await runs_started(rt, "p", count + 2)

    listed = await rt.list_schedules()
    assert [s.schedule.id for s in listed.schedules] == ["p"]
    assert listed.limit == 100
    assert all(r.status for r in listed.schedules[0].state.last_runs if r.outcome == "started")

    await rt.delete_schedule("p")
    with pytest.raises(ScheduleNotFoundError):
        await rt.get_schedule("p")
    with pytest.raises(ScheduleNotFoundError):
        await rt.trigger_schedule("p")
    with pytest.raises(ScheduleNotFoundError):
        await rt.delete_schedule("p")
    assert (await rt.list_schedules()).schedules == []


async def _has_run(rt: Runtime, sid: str, run_id: str) -> tuple[bool, Any]:
    info = await rt.get_schedule(sid)
    return run_id in started(info), info


async def test_overlap_skip_drops_fires_while_the_previous_run_runs(
    rt: Runtime, replicas: StartReplica
) -> None:
    await replicas()
    await rt.schedule_run(ECHO, [TextBlock(text="s")], every=SECOND, overlap="skip", schedule_id="s")
    first = started(await runs_started(rt, "s", 1))[0]

    async def skipped() -> tuple[bool, Any]:
        info = await rt.get_schedule("s")
        return info.state.skipped >= 3, info

    info = await eventually(skipped, "three fires skipped")
    assert started(info) == [first], "a fire started a run while the previous one was running"
    assert outcomes(info, "skipped") >= 3
    await rt.cancel_run(first)
    info = await runs_started(rt, "s", 2)
    assert started(info)[-1] == first
    await rt.delete_schedule("s")


async def test_overlap_buffer_one_holds_one_fire_until_the_previous_run_ends(
    rt: Runtime, replicas: StartReplica
) -> None:
    await replicas(schedule_recheck_s=0.2)
    await rt.schedule_run(ECHO, [TextBlock(text="b")], every=SECOND, overlap="buffer_one", schedule_id="b")
    first = started(await runs_started(rt, "b", 1))[0]

    async def held_and_dropped() -> tuple[bool, Any]:
        info = await rt.get_schedule("b")
        return info.state.buffered is not None and info.state.skipped >= 2, info

    state = (await eventually(held_and_dropped, "one fire held, later ones dropped")).state
    held = state.buffered
    assert started(await rt.get_schedule("b")) == [first]
    await rt.cancel_run(first)
    info = await eventually(lambda: _has_run(rt, "b", held), "the held fire starts once the run ended")
    assert info.state.buffered is None or info.state.buffered != held
    await rt.delete_schedule("b")


async def test_overlap_allow_starts_every_fire(rt: Runtime, replicas: StartReplica) -> None:
    await replicas()
    await rt.schedule_run(ECHO, [TextBlock(text="a")], every=SECOND, overlap="allow", schedule_id="a")
    info = await runs_started(rt, "a", 3)
    statuses = [(await rt.get_run(r)).status for r in started(info)]
    assert all(s not in TERMINAL for s in statuses), statuses  # all running at once
    assert info.state.skipped == 0
    await rt.delete_schedule("a")


async def test_bad_input_is_typed_and_writes_nothing(rt: Runtime, replicas: StartReplica) -> None:
    await replicas(max_schedules=2)
    blocks = [TextBlock(text="x")]
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"cron": "61 * * * *"}, InvalidScheduleError, "not a valid cron"),
        ({"cron": "* * *"}, InvalidScheduleError, "5 fields"),
        ({"cron": "0 9 * * 1-5", "tz": "Mars/Olympus"}, InvalidScheduleError, "time zone"),
        ({"every": SECOND / 2}, InvalidScheduleError, "at least 1 second"),
        ({"every": SECOND, "tz": "Europe/Paris"}, InvalidScheduleError, "cron only"),
        ({}, InvalidScheduleError, "exactly one"),
        ({"every": SECOND, "overlap": "queue"}, InvalidScheduleError, "overlap"),
        ({"every": SECOND, "schedule_id": "no spaces"}, InvalidScheduleError, "schedule id"),
    ]
    for kwargs, error, text in bad:
        with pytest.raises(error, match=text):
            await rt.schedule_run(ECHO, blocks, **kwargs)
    with pytest.raises(AgentNotFoundError):
        await rt.schedule_run(AgentId("never-registered", "k"), blocks, every=SECOND)
    # The orchestrator checks too (a client of another version, or a raw request).
    from plexus.runtime.orchestration import RunSchedule

    raw = RunSchedule(id="raw", agent_id=str(ECHO), payload=b"[]", cron="bad cron x y z")  # type: ignore[arg-type]
    with pytest.raises(InvalidScheduleError):
        await rt.orchestrator.call("sched_put", raw, ScheduleInfo)
    assert (await rt.list_schedules()).schedules == []

    await rt.schedule_run(ECHO, blocks, cron="@daily", schedule_id="one")
    await rt.schedule_run(ECHO, blocks, cron="@hourly", schedule_id="two")
    with pytest.raises(TooManySchedulesError) as caught:
        await rt.schedule_run(ECHO, blocks, cron="@weekly", schedule_id="three")
    assert caught.value.limit == 2
    # Replacing an existing one is not one more.
    await rt.schedule_run(ECHO, blocks, cron="@monthly", schedule_id="two")
    listed = await rt.list_schedules()
    assert sorted((s.schedule.id, s.schedule.cron) for s in listed.schedules) == [
        ("one", "@daily"),
        ("two", "@monthly"),
    ]


@pytest.fixture
def two_replica_processes(nats_server: NatsServer, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    for i in range(2):
        log = (tmp_path / f"orchestrator{i}.log").open("wb")
        cmd = [sys.executable, "-m", "plexus.runtime.cli", "orchestrator", "--nats", nats_server.url]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


async def test_fires_while_a_replica_is_killed_are_served_by_the_other(
    rt: Runtime, two_replica_processes: list[subprocess.Popen[bytes]]
) -> None:
    await until_serving(rt.nc, timeout=30.0)
    await rt.schedule_run(ECHO, [TextBlock(text="ha")], every=SECOND, overlap="allow", schedule_id="ha")
    count = len(started(await runs_started(rt, "ha", 2)))
    victim = two_replica_processes[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    # Every later fire is started by the survivor (one the victim had taken comes back after the ack wait).
    info = await runs_started(rt, "ha", min(count + 4, 10))
    for run_id in started(info):
        assert (await rt.get_run(run_id)).status not in TERMINAL
    assert two_replica_processes[1].poll() is None
    await rt.delete_schedule("ha")


async def _plexus(nats_url: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "plexus.runtime.cli",
        *args,
        "--nats",
        nats_url,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_the_plexus_schedules_command(
    rt: Runtime, replicas: StartReplica, nats_server: NatsServer
) -> None:
    await replicas()
    url = nats_server.url
    code, out, err = await _plexus(
        url, "schedules", "create", "cli", "echo/k", "hello", "--every", "1", "--overlap", "allow", "--json"
    )
    assert code == 0, err
    created = json.loads(out)
    assert created["schedule"]["payload"][0]["text"] == "hello"
    await runs_started(rt, "cli", 1)
    code, out, err = await _plexus(url, "schedules", "pause", "cli", "--json")
    assert code == 0, err
    assert json.loads(out)["schedule"]["paused"] is True
    code, out, err = await _plexus(url, "schedules", "trigger", "cli")
    assert code == 0, err
    await eventually(lambda: _has_run(rt, "cli", out.strip()), "the triggered run starts")
    code, out, err = await _plexus(url, "schedules", "resume", "cli")
    assert code == 0, err
    code, out, err = await _plexus(url, "schedules", "ls", "--json")
    assert code == 0, err
    assert [row["schedule"]["id"] for row in json.loads(out)] == ["cli"]
    code, out, err = await _plexus(url, "schedules", "create", "bad", "echo/k", "x", "--cron", "nope")
    assert code == 1
    assert "InvalidScheduleError" in err
    code, out, err = await _plexus(url, "schedules", "rm", "cli")
    assert code == 0, err
    code, out, err = await _plexus(url, "schedules", "rm", "cli")
    assert code == 1
    assert "ScheduleNotFoundError" in err
