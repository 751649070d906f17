"""What a worker holds in memory between messages: the collector's thresholds while it runs, an idle
activation's EventLog lock (made for a turn, let go after it), and how a new activation reads its state."""

from __future__ import annotations

import asyncio
import gc
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, cast

import pytest

from plexus.core import AgentId, TextBlock
from plexus.runtime import App, Interceptor, Runtime, WorkerConfig
from plexus.runtime.store._connection import Connection
from plexus.runtime.worker._activation import Activation, _both
from plexus.runtime.worker._gc import DEFAULT_GC_THRESHOLD
from tests.runtime.apps_misc import Echo, idle_activation
from tests.runtime.conftest import StartWorker


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The process's thresholds before the test, put back after it whatever happened."""
    found = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*found)


async def test_the_first_worker_sets_the_thresholds_and_the_last_to_stop_restores_them(
    thresholds: tuple[int, int, int], start_worker: StartWorker, runtime: Runtime
) -> None:
    app = App()
    app.register("echo", lambda _id: Echo(), durable=False)
    first = await start_worker(app)
    assert gc.get_threshold() == DEFAULT_GC_THRESHOLD
    second = await start_worker(app, gc_threshold=(5_000, 5, 5))
    assert gc.get_threshold() == DEFAULT_GC_THRESHOLD  # the process's collector is held by the first
    reply = await runtime.send_message([TextBlock(text="hi")], AgentId("echo", "k"), timeout=10)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["hi"]
    await first.stop(drain_timeout=5)
    assert gc.get_threshold() == DEFAULT_GC_THRESHOLD  # still one worker running
    await second.stop(drain_timeout=5)
    assert gc.get_threshold() == thresholds
    await second.stop(drain_timeout=5)  # a second stop releases nothing more
    assert gc.get_threshold() == thresholds


async def test_none_leaves_the_collector_alone(
    thresholds: tuple[int, int, int], start_worker: StartWorker
) -> None:
    app = App()
    app.register("echo", lambda _id: Echo(), durable=False)
    worker = await start_worker(app, gc_threshold=None)
    assert gc.get_threshold() == thresholds
    await worker.stop(drain_timeout=5)
    assert gc.get_threshold() == thresholds


@pytest.mark.parametrize(
    "value", [(1, 2), (1, 2, 3, 4), (-1, 10, 10), (700, 10, 1.5), (True, 10, 10), [700, 10, 10], "700"]
)
def test_a_bad_threshold_is_refused_when_the_config_is_made(value: object) -> None:
    with pytest.raises(ValueError, match="gc_threshold must be None or three non-negative ints"):
        WorkerConfig(gc_threshold=cast(Any, value))


def _activation() -> Activation:
    return idle_activation(OrderedDict())


def _lock_of(activation: Activation) -> asyncio.Lock | None:
    return activation._log_lock


async def test_log_turns_take_turns_and_an_idle_activation_holds_no_lock() -> None:
    activation = _activation()
    assert _lock_of(activation) is None
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def first() -> None:
        async with activation.log_turn():
            order.append("first in")
            first_in.set()
            await release_first.wait()
            order.append("first out")

    async def second() -> None:
        await first_in.wait()
        async with activation.log_turn():
            order.append("second in")

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    await first_in.wait()
    await asyncio.sleep(0.01)
    assert order == ["first in"]  # the second waits for the first's turn to end
    release_first.set()
    await asyncio.gather(*tasks)
    assert order == ["first in", "first out", "second in"]
    assert _lock_of(activation) is None
    assert activation._log_users == 0


async def test_a_turn_cancelled_while_waiting_leaves_the_lock_consistent() -> None:
    activation = _activation()
    holding = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with activation.log_turn():
            holding.set()
            await release.wait()

    async def waiter() -> None:
        async with activation.log_turn():
            raise AssertionError("a cancelled waiter must never get its turn")

    held = asyncio.create_task(holder())
    await holding.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    assert activation._log_users == 2
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert activation._log_users == 1
    assert _lock_of(activation) is not None
    release.set()
    await held
    assert _lock_of(activation) is None
    assert activation._log_users == 0
    async with activation.log_turn():  # a fresh lock for the next turn
        lock = _lock_of(activation)
        assert lock is not None
        assert lock.locked()


async def test_a_new_activation_s_two_reads_run_at_once_and_fail_cleanly() -> None:
    """`_both`: a new activation's two reads run concurrently; a failing read cancels the other."""
    release = asyncio.Event()

    async def slow(value: str) -> str:
        await release.wait()  # only the second read sets it: one after the other would never finish
        return value

    async def fast() -> int:
        release.set()
        return 7

    assert await asyncio.wait_for(_both(slow("checkpoint"), fast()), 5) == ("checkpoint", 7)

    never = asyncio.Event()
    first_task: list[asyncio.Task[Any]] = []

    async def waits_forever() -> str:
        task = asyncio.current_task()
        assert task is not None
        first_task.append(task)
        await never.wait()
        return "unreachable"

    async def fails() -> int:
        await asyncio.sleep(0)
        raise RuntimeError("no stream leader")

    with pytest.raises(RuntimeError, match="no stream leader"):
        await _both(waits_forever(), fails())
    await asyncio.sleep(0)
    assert first_task[0].cancelled()

    async def first_fails() -> str:
        raise ValueError("unreadable checkpoint")

    async def second_ok() -> int:
        await asyncio.sleep(0.01)
        return 1

    with pytest.raises(ValueError, match="unreadable checkpoint"):
        await _both(first_fails(), second_ok())


class _FailsToStart(Interceptor):
    async def start(self, connection: Connection, worker_id: str) -> None:
        raise RuntimeError("no telemetry backend")


async def test_a_worker_that_fails_to_start_leaves_the_collector_alone(
    thresholds: tuple[int, int, int], start_worker: StartWorker
) -> None:
    app = App(interceptors=[_FailsToStart()])
    app.register("echo", lambda _id: Echo(), durable=False)
    with pytest.raises(RuntimeError, match="no telemetry backend"):
        await start_worker(app)
    assert gc.get_threshold() == thresholds
