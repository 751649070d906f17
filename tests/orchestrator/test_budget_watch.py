"""`BudgetWatcher`: a tree's counter moves are compared with its budget once per ``delay_s`` window."""

from __future__ import annotations

import asyncio

import pytest

from plexus.orchestrator import BudgetWatcher, OrchestratorConfig
from plexus.runtime import Runtime
from plexus.runtime.kernel import escape_token
from plexus.runtime.orchestration import budget_counter_subject


class Checks:
    """The watcher's check: records the trees it is asked about; ``hold`` keeps the first one reading."""

    def __init__(self, hold: asyncio.Event | None = None) -> None:
        self.roots: list[str] = []
        self._moved = asyncio.Event()
        self._hold = hold

    async def __call__(self, root_id: str) -> None:
        self.roots.append(root_id)
        self._moved.set()
        if self._hold is not None and len(self.roots) == 1:
            await self._hold.wait()

    async def until(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.roots) < n:
                self._moved.clear()
                await self._moved.wait()


async def _moves(rt: Runtime, root: str, n: int) -> None:
    """What a reporter's increments look like to the watcher's core subscription (the original publish)."""
    for i in range(n):
        dimension = ("tokens", "turns", "cost_micros")[i % 3]
        await rt.nc.publish(budget_counter_subject("px", "default", escape_token(root), dimension), b"")
    await rt.nc.flush()


async def test_the_moves_of_one_window_cost_one_check_per_tree(rt: Runtime) -> None:
    checks = Checks()
    watcher = BudgetWatcher(rt.nc, "px", checks, delay_s=0.3)
    await watcher.start()
    try:
        await _moves(rt, "run-a", 12)
        await _moves(rt, "run-b", 2)
        await asyncio.sleep(0.1)
        assert checks.roots == []  # not before the window ends
        await checks.until(2)
        await asyncio.sleep(0.5)
        assert sorted(checks.roots) == ["run-a", "run-b"]
        await _moves(rt, "run-a", 3)  # a later move is checked again
        await checks.until(3)
        await asyncio.sleep(0.5)
        assert sorted(checks.roots) == ["run-a", "run-a", "run-b"]
    finally:
        await watcher.stop()


async def test_a_move_during_a_check_is_checked_once_more(rt: Runtime) -> None:
    release = asyncio.Event()
    checks = Checks(hold=release)  # the first check is still reading when the counter moves again
    watcher = BudgetWatcher(rt.nc, "px", checks, delay_s=0.05)
    await watcher.start()
    try:
        await _moves(rt, "run-c", 1)
        await checks.until(1)
        await _moves(rt, "run-c", 4)
        await asyncio.sleep(0.1)
        release.set()
        await checks.until(2)
        await asyncio.sleep(0.3)
        assert checks.roots == ["run-c", "run-c"]
    finally:
        await watcher.stop()


def test_delays_are_never_negative(rt: Runtime) -> None:
    with pytest.raises(ValueError, match="delay_s"):
        BudgetWatcher(rt.nc, "px", Checks(), delay_s=-1)
    with pytest.raises(ValueError, match="budget_check_delay_s"):
        OrchestratorConfig(budget_check_delay_s=-0.1)
