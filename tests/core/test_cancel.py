"""Cancellation: generations, sticky cancel, children, callbacks, and waits that wake without polling."""

from __future__ import annotations

import asyncio
import gc
import selectors
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from plexus.core._cancel import (
    CallbackRegistration,
    CancellationController,
    CancellationHandle,
    CancellationToken,
    TurnCancellation,
)
from plexus.core._errors import CancellationError


def _listeners(token: CancellationToken | CancellationController) -> Mapping[int, Any]:
    """Registered listeners of a scope (private: used only to prove nothing leaks)."""
    listeners: Mapping[int, Any] = token._state._listeners
    return listeners


def _status(token: CancellationToken) -> tuple[bool, str | None]:
    return token.is_cancelled, token.reason


# --- synchronous state --------------------------------------------------------------------------------


def test_a_fresh_handle_is_live_and_works_without_an_event_loop() -> None:
    ctrl = CancellationController()
    handle = ctrl.handle
    assert isinstance(handle, CancellationHandle)
    assert not handle.is_cancelled
    assert handle.reason is None
    assert handle.generation == ctrl.generation == 0
    handle.check()  # does not raise
    assert not ctrl.is_cancelled


def test_cancel_is_sticky_idempotent_and_keeps_the_first_reason() -> None:
    ctrl = CancellationController()
    assert ctrl.cancel("user pressed stop") is True
    assert ctrl.cancel("second reason") is False
    assert ctrl.is_cancelled
    assert ctrl.handle.is_cancelled
    assert ctrl.handle.reason == "user pressed stop"
    assert ctrl.generation == 1
    with pytest.raises(CancellationError) as info:
        ctrl.handle.check()
    assert info.value.reason == "user pressed stop"
    assert str(info.value) == "Cancelled: user pressed stop"


def test_default_reasons() -> None:
    ctrl = CancellationController()
    turn = ctrl.handle.checkpoint()
    ctrl.interrupt()
    assert turn.reason == "interrupted"
    ctrl.cancel()
    assert ctrl.handle.reason == "cancelled"


@pytest.mark.parametrize("reason", ["", "   ", None, 3])
def test_a_reason_must_be_a_non_empty_string(reason: Any) -> None:
    ctrl = CancellationController()
    with pytest.raises(ValueError, match="cancellation reason must be a non-empty string"):
        ctrl.cancel(reason)
    with pytest.raises(ValueError, match="cancellation reason must be a non-empty string"):
        ctrl.interrupt(reason)
    assert ctrl.generation == 0
    assert not ctrl.is_cancelled


def test_checkpoint_is_cancelled_iff_the_generation_moved() -> None:
    ctrl = CancellationController()
    handle = ctrl.handle
    first = handle.checkpoint()
    assert isinstance(first, TurnCancellation)
    assert first.generation == 0
    assert _status(first) == (False, None)

    assert ctrl.interrupt("turn 1 stopped") is True
    assert ctrl.generation == handle.generation == 1
    assert _status(first) == (True, "turn 1 stopped")
    with pytest.raises(CancellationError, match="turn 1 stopped"):
        first.check()
    # An interrupt ends the turn, not the handle: the next turn starts clean.
    assert not handle.is_cancelled
    second = handle.checkpoint()
    assert second.generation == 1
    assert not second.is_cancelled
    second.check()

    ctrl.interrupt("turn 2 stopped")
    assert second.reason == "turn 2 stopped"
    assert first.reason == "turn 1 stopped"  # each turn keeps the reason that ended it
    assert ctrl.generation == 2


def test_cancel_ends_every_checkpoint_earlier_or_later_and_stops_interrupts() -> None:
    ctrl = CancellationController()
    before = ctrl.handle.checkpoint()
    ctrl.cancel("shutdown")
    after = ctrl.handle.checkpoint()
    assert before.reason == "shutdown"
    assert after.is_cancelled
    assert after.reason == "shutdown"
    assert ctrl.interrupt("too late") is False
    assert ctrl.generation == 1


def test_repr_shows_state() -> None:
    ctrl = CancellationController()
    assert repr(ctrl.handle) == "<CancellationHandle generation=0 live>"
    ctrl.cancel("bye")
    assert repr(ctrl) == "<CancellationController of <CancellationHandle generation=1 cancelled: 'bye'>>"


# --- children -----------------------------------------------------------------------------------------


def test_parent_cancel_reaches_children_and_grandchildren_with_its_reason() -> None:
    root = CancellationController()
    child = root.handle.child()
    grandchild = child.handle.child()
    root.cancel("run cancelled by user")
    assert child.handle.reason == "run cancelled by user"
    assert grandchild.handle.reason == "run cancelled by user"


def test_cancelling_a_child_spares_the_parent_and_siblings() -> None:
    root = CancellationController()
    a, b = root.handle.child(), root.handle.child()
    a.cancel("a is done")
    assert a.handle.is_cancelled
    assert not root.handle.is_cancelled
    assert not b.handle.is_cancelled


def test_child_of_a_cancelled_token_starts_cancelled() -> None:
    root = CancellationController()
    root.cancel("gone")
    assert root.handle.child().handle.reason == "gone"
    assert root.handle.checkpoint().child().handle.reason == "gone"


def test_child_of_a_turn_follows_interrupts_but_child_of_the_handle_does_not() -> None:
    ctrl = CancellationController()
    turn = ctrl.handle.checkpoint()
    turn_child = turn.child()
    handle_child = ctrl.handle.child()
    ctrl.interrupt("stop this turn")
    assert turn_child.handle.reason == "stop this turn"
    assert not handle_child.handle.is_cancelled


def test_a_child_that_cancels_itself_unlinks_from_its_parent() -> None:
    root = CancellationController()
    child = root.handle.child()
    assert len(_listeners(root.handle)) == 1
    child.cancel("own reason")
    assert len(_listeners(root.handle)) == 0
    root.cancel("later")
    assert child.handle.reason == "own reason"


def test_forgotten_children_are_pruned() -> None:
    root = CancellationController()
    for _ in range(200):
        root.handle.child()  # dropped at once
    gc.collect()
    kept = root.handle.child()
    assert len(_listeners(root.handle)) < 40  # pruned as the table grows, not 201
    root.cancel("still reaches live children")
    assert kept.handle.reason == "still reaches live children"


# --- callbacks ----------------------------------------------------------------------------------------


def test_callback_runs_once_with_the_reason_on_the_cancelling_thread() -> None:
    ctrl = CancellationController()
    calls: list[tuple[str, int]] = []
    ctrl.handle.add_callback(lambda reason: calls.append((reason, threading.get_ident())))
    thread = threading.Thread(target=ctrl.cancel, args=("from worker",))
    thread.start()
    thread.join()
    ctrl.cancel("again")
    assert calls == [("from worker", thread.ident)]


def test_unregistered_callback_does_not_run() -> None:
    ctrl = CancellationController()
    calls: list[str] = []
    registration = ctrl.handle.add_callback(calls.append)
    assert isinstance(registration, CallbackRegistration)
    assert registration.unregister() is True
    assert registration.unregister() is False
    ctrl.cancel("x")
    assert calls == []


def test_callback_on_a_cancelled_token_runs_immediately() -> None:
    ctrl = CancellationController()
    ctrl.cancel("already")
    calls: list[str] = []
    registration = ctrl.handle.add_callback(calls.append)
    assert calls == ["already"]
    assert registration.unregister() is False


def test_turn_callbacks_fire_on_interrupt_and_handle_callbacks_do_not() -> None:
    ctrl = CancellationController()
    turn_calls: list[str] = []
    handle_calls: list[str] = []
    ctrl.handle.checkpoint().add_callback(turn_calls.append)
    ctrl.handle.add_callback(handle_calls.append)
    ctrl.interrupt("next turn please")
    assert turn_calls == ["next turn please"]
    assert handle_calls == []
    ctrl.cancel("end")
    assert turn_calls == ["next turn please"]  # fired once only
    assert handle_calls == ["end"]


def test_a_failing_callback_does_not_stop_the_others() -> None:
    ctrl = CancellationController()
    calls: list[str] = []

    def boom(reason: str) -> None:
        raise RuntimeError(f"boom on {reason}")

    ctrl.handle.add_callback(boom)
    ctrl.handle.add_callback(calls.append)
    child = ctrl.handle.child()
    with pytest.raises(ExceptionGroup) as info:
        ctrl.cancel("stop")
    assert [str(e) for e in info.value.exceptions] == ["boom on stop"]
    assert calls == ["stop"]
    assert child.handle.is_cancelled
    assert ctrl.is_cancelled


def test_callbacks_may_reenter_the_controller() -> None:
    ctrl = CancellationController()
    turn = ctrl.handle.checkpoint()
    # An interrupt handler that escalates to a full cancel must not deadlock.
    turn.add_callback(lambda reason: ctrl.cancel(f"escalated: {reason}"))
    ctrl.interrupt("stuck")
    assert ctrl.handle.reason == "escalated: stuck"


# --- waiting ------------------------------------------------------------------------------------------


async def test_wait_returns_the_reason_when_cancelled() -> None:
    ctrl = CancellationController()
    waiter = asyncio.create_task(ctrl.handle.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    ctrl.cancel("done here")
    async with asyncio.timeout(2):
        assert await waiter == "done here"


async def test_wait_on_a_cancelled_token_returns_at_once() -> None:
    ctrl = CancellationController()
    ctrl.cancel("earlier")
    assert await ctrl.handle.wait() == "earlier"
    assert await ctrl.handle.checkpoint().cancelled() == "earlier"


async def test_turn_wait_wakes_on_interrupt_but_handle_wait_does_not() -> None:
    ctrl = CancellationController()
    turn_waiter = asyncio.create_task(ctrl.handle.checkpoint().cancelled())
    handle_waiter = asyncio.create_task(ctrl.handle.wait())
    await asyncio.sleep(0)
    ctrl.interrupt("new user message")
    async with asyncio.timeout(2):
        assert await turn_waiter == "new user message"
    await asyncio.sleep(0.05)
    assert not handle_waiter.done()
    ctrl.cancel("bye")
    async with asyncio.timeout(2):
        assert await handle_waiter == "bye"


async def test_wait_races_work_and_an_abandoned_waiter_leaves_nothing_behind() -> None:
    ctrl = CancellationController()
    handle = ctrl.handle

    async def work() -> str:
        await asyncio.sleep(0)
        return "result"

    work_task = asyncio.create_task(work())
    cancel_task = asyncio.create_task(handle.wait())
    done, pending = await asyncio.wait({work_task, cancel_task}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {work_task}
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    assert len(_listeners(handle)) == 0
    ctrl.cancel("afterwards")  # resolving nothing must not fail


async def test_cancel_from_another_thread_wakes_waiters_on_two_loops_promptly() -> None:
    ctrl = CancellationController()
    other_loop_result: list[str] = []
    other_registered = threading.Event()

    def other_loop() -> None:
        async def run() -> None:
            task = asyncio.create_task(ctrl.handle.wait())
            await asyncio.sleep(0)
            other_registered.set()
            other_loop_result.append(await task)

        asyncio.run(run())

    other = threading.Thread(target=other_loop)
    other.start()
    waiter = asyncio.create_task(ctrl.handle.wait())
    await asyncio.sleep(0)
    assert await asyncio.to_thread(other_registered.wait, 5)

    cancelled_at: list[float] = []

    def cancel_later() -> None:
        time.sleep(0.05)
        cancelled_at.append(time.monotonic())
        ctrl.cancel("from a thread")

    threading.Thread(target=cancel_later).start()
    async with asyncio.timeout(5):
        assert await waiter == "from a thread"
    woke_after = time.monotonic() - cancelled_at[0]
    await asyncio.to_thread(other.join, 5)
    assert other_loop_result == ["from a thread"]
    assert woke_after < 0.5


def test_cancel_after_the_waiting_loop_closed_is_harmless() -> None:
    ctrl = CancellationController()
    loop = asyncio.new_event_loop()
    task = loop.create_task(ctrl.handle.wait())
    loop.run_until_complete(asyncio.sleep(0))  # the waiter registers and parks
    loop.close()
    assert ctrl.cancel("late") is True  # call_soon_threadsafe on a closed loop is swallowed
    assert not task.done()
    task._log_destroy_pending = False  # type: ignore[attr-defined]  # silence "Task was destroyed but it is pending"


class _RecordingSelector(selectors.DefaultSelector):
    """Records the timeout of every select(): one per loop iteration."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        return super().select(timeout)


def test_wait_never_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a waiter is parked the loop blocks in select() with no timeout: no timer, no sleep, no poll."""
    selector = _RecordingSelector()
    loop = asyncio.SelectorEventLoop(selector)
    ctrl = CancellationController()

    def no_sleeping(*args: object, **kwargs: object) -> None:
        raise AssertionError("wait() must not sleep")

    def no_timers(*args: object, **kwargs: object) -> None:
        raise AssertionError("wait() must not schedule timers")

    async def main() -> tuple[str, str]:
        monkeypatch.setattr(asyncio, "sleep", no_sleeping)
        monkeypatch.setattr(loop, "call_later", no_timers)
        monkeypatch.setattr(loop, "call_at", no_timers)
        parked = threading.Event()
        handle_waiter = loop.create_task(ctrl.handle.wait())
        turn_waiter = loop.create_task(ctrl.handle.checkpoint().wait())

        def cancel_when_parked() -> None:
            parked.wait(5)
            time.sleep(0.3)  # long enough for a 10 ms poller to spin ~30 times
            ctrl.cancel("stop")

        threading.Thread(target=cancel_when_parked).start()
        loop.call_soon(parked.set)
        return await handle_waiter, await turn_waiter

    try:
        assert loop.run_until_complete(main()) == ("stop", "stop")
    finally:
        loop.close()
    assert all(t is None or t == 0 for t in selector.timeouts), selector.timeouts
    assert len(selector.timeouts) < 12, selector.timeouts
    assert selector.timeouts.count(None) >= 1  # the loop really blocked


def test_wait_outside_an_event_loop_is_refused() -> None:
    ctrl = CancellationController()
    coro = ctrl.handle.wait()
    with pytest.raises(RuntimeError, match="no running event loop"):
        coro.send(None)
    coro.close()


def test_token_is_the_common_type() -> None:
    ctrl = CancellationController()
    tokens: list[CancellationToken] = [ctrl.handle, ctrl.handle.checkpoint()]
    checks: list[Callable[[], None]] = [t.check for t in tokens]
    ctrl.cancel("all")
    for check in checks:
        with pytest.raises(CancellationError):
            check()
