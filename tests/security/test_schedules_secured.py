"""Timers and reminders under `plexus security init` on one node: the operator creates `PLEXUS_SCHEDULES`
and the inbox's source of fired copies; workers, as the worker user, write their agents' schedules and read
their reminders and nothing more (any permissions violation in the server log fails the test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.runtime.conftest import runtime, start_worker, worker_process
from tests.runtime.test_schedules import (
    test_a_reminder_fires_until_cleared_and_is_listed,
    test_timer_fires_once_after_kill9_of_the_worker_that_set_it,
)
from tests.security.seeds import SecuredSeed, running_seed

__all__ = [
    "runtime",
    "start_worker",
    "test_a_reminder_fires_until_cleared_and_is_listed",
    "test_timer_fires_once_after_kill9_of_the_worker_that_set_it",
    "worker_process",
]


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[SecuredSeed]:
    async with running_seed(tmp_path, 1) as seed:
        yield seed
