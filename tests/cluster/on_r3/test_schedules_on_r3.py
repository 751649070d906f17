"""Timers and reminders (tests/runtime/test_schedules.py) on the secured R3 cluster of this directory's
conftest: `PLEXUS_SCHEDULES` is created R3 by the operator's topology, workers write schedules as their
least-privileged user (a permissions violation fails the test), and a fire while no worker runs waits in the
inbox."""

from tests.runtime.test_schedules import (
    test_a_cancelled_timer_never_fires,
    test_a_reminder_fires_until_cleared_and_is_listed,
    test_timer_fires_once_after_kill9_of_the_worker_that_set_it,
)

__all__ = [
    "test_a_cancelled_timer_never_fires",
    "test_a_reminder_fires_until_cleared_and_is_listed",
    "test_timer_fires_once_after_kill9_of_the_worker_that_set_it",
]
