"""Deadlines: the earliest of a message's deadline, its run's deadline and its type's time limit.

Every send carries a deadline, so arming one is on the hot path of every message: expiries go on the
loop's `TickWheel` (one timer per 10 ms tick, not one per message), so a deadline fires up to one tick
late, never early.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from plexus.core import BaseBlock, CancellationError
from plexus.runtime.interceptors._interceptors import HandleInput, HandleNext, Interceptor
from plexus.runtime.ops._ticks import TickWheel, wheel_of

if TYPE_CHECKING:
    from plexus.runtime._context import Context

__all__ = ["DeadlineInterceptor"]

#: How long a handler may run on after its cancellation token fired before its task is cancelled.
_GRACE_S = 0.05


class DeadlineInterceptor(Interceptor):
    """Enforces the earliest of the envelope's deadline, its run's deadline and the agent type's time limit.

    The handler's cancellation token fires first (cooperative); if the handler ignores it, the handler task
    is cancelled after a short grace and the caller gets `CancellationError("deadline")`.
    """

    async def handle(self, inp: HandleInput, call_next: HandleNext) -> list[BaseBlock] | None:
        remaining = inp.agent_type.time_limit_s
        run = inp.envelope.run
        # The run's deadline (`new_root_run(deadline=…)`, a budget's deadline_s) binds every message of the
        # tree, orchestrated or not: children inherit it with the run info.
        for deadline in (inp.envelope.deadline, run.deadline if run is not None else None):
            if deadline is not None:
                left = deadline - time.time()
                remaining = left if remaining is None else min(remaining, left)
        if remaining is None:
            return await call_next(inp)
        if remaining <= 0:
            raise CancellationError("deadline")
        expiry = _Expiry(inp.ctx, wheel_of(asyncio.get_running_loop()), remaining)
        try:
            return await call_next(inp)
        except asyncio.CancelledError:
            if expiry.close():
                raise CancellationError("deadline") from None
            raise
        finally:
            expiry.close()


class _Expiry:
    """One message's deadline: the cooperative cancel when it passes, the task's cancel after the grace.

    The hard cancel follows `asyncio.timeout`'s rules: it is undone by `uncancel()` and reported only when
    nobody else cancelled the task meanwhile.
    """

    __slots__ = ("_cancelled", "_cancelling", "_ctx", "_task", "_tick", "_timer", "_wheel")

    def __init__(self, ctx: Context, wheel: TickWheel, delay: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a running task")
        self._ctx = ctx
        self._task = task
        self._wheel = wheel
        self._cancelling = task.cancelling()
        self._cancelled = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tick: int | None = wheel.arm(self, delay)

    def expire(self) -> None:
        self._tick = None
        self._ctx._controller.cancel("deadline")
        self._timer = self._wheel.loop.call_later(_GRACE_S, self._cancel_task)

    def _cancel_task(self) -> None:
        self._cancelled += 1
        self._task.cancel()
        # Re-cancel until disarmed: nats-py swallows a CancelledError that lands inside its publish path.
        self._timer = self._wheel.loop.call_later(0.1, self._cancel_task)

    def close(self) -> bool:
        """Disarm (idempotent); True when this expiry cancelled the task and no one else did."""
        if self._tick is not None:
            self._wheel.disarm(self, self._tick)
            self._tick = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._cancelled:
            return False
        remaining = self._task.cancelling()
        for _ in range(self._cancelled):
            remaining = self._task.uncancel()
        self._cancelled = 0
        return remaining <= self._cancelling
