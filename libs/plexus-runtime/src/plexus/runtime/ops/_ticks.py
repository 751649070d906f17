"""Timeouts on the hot path, grouped by the 10 ms tick they fall in.

Every send and every handled message carries a deadline. A loop timer per message cost ≈ 2 µs to make and
left a cancelled handle in the loop's heap until the loop swept it (a worker at 14k messages/s with 30 s
deadlines carried hundreds of thousands). A `TickWheel` keeps one loop timer per tick that has any armed
expiry, and disarming is a set removal. An expiry therefore fires up to one tick late, never early.

A tick left with nothing armed is dropped at once (its timer cancelled): most expiries are disarmed long
before their time, and a burst's empty ticks, kept until their time, held a set, a timer and a context
for every 10 ms of the burst for a whole deadline — scattered over the burst's memory, enough to keep
the allocator from returning any of it (RSS stayed at its peak after every activation was passivated).
The one exception is the tick emptied last, kept until another empties (or its time comes): a handler that
finishes without waiting arms and disarms its deadline within one step, and the next message's falls in the
same tick, so dropping it at once made and cancelled a loop timer per message.
"""

from __future__ import annotations

import asyncio
import math
from typing import Protocol

__all__ = ["TICK_S", "Expiring", "TickWheel", "wheel_of"]

#: The wheel's resolution: an expiry fires at most this late.
TICK_S = 0.01


class Expiring(Protocol):
    """What a wheel holds: something told once that its time is up (hashable, by identity)."""

    def expire(self) -> None: ...


class TickWheel:
    """Armed expiries by the tick their time falls in; one loop timer per tick that has any."""

    __slots__ = ("_spare", "_ticks", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._ticks: dict[int, _Tick] = {}
        #: The tick emptied last, kept (with its timer) in case the next expiry falls in it too.
        self._spare: int | None = None

    def arm(self, expiry: Expiring, delay: float) -> int:
        """Call ``expiry.expire()`` once `delay` seconds have passed; the tick to `disarm` it with."""
        tick = math.ceil((self.loop.time() + delay) / TICK_S)
        armed = self._ticks.get(tick)
        if armed is None:
            armed = self._ticks[tick] = _Tick(self.loop.call_at(tick * TICK_S, self._fire, tick))
        armed.add(expiry)
        return tick

    def disarm(self, expiry: Expiring, tick: int) -> None:
        armed = self._ticks.get(tick)
        if armed is not None:
            armed.discard(expiry)
            if not armed and tick != self._spare:
                spare, self._spare = self._spare, tick
                if spare is not None:
                    self._drop_if_empty(spare)

    def _drop_if_empty(self, tick: int) -> None:
        armed = self._ticks.get(tick)
        if armed is not None and not armed:
            del self._ticks[tick]
            armed.timer.cancel()

    def _fire(self, tick: int) -> None:
        if tick == self._spare:
            self._spare = None
        for expiry in self._ticks.pop(tick, ()):
            expiry.expire()


class _Tick(set[Expiring]):
    """The expiries armed for one tick, and the loop timer that fires them."""

    __slots__ = ("timer",)

    def __init__(self, timer: asyncio.TimerHandle) -> None:
        super().__init__()
        self.timer = timer


_wheels: dict[asyncio.AbstractEventLoop, TickWheel] = {}


def wheel_of(loop: asyncio.AbstractEventLoop) -> TickWheel:
    """The wheel of `loop` (one per loop, made on first use; a closed loop's wheel is dropped then)."""
    wheel = _wheels.get(loop)
    if wheel is None:
        for stale in [lp for lp in _wheels if lp.is_closed()]:
            del _wheels[stale]
        wheel = _wheels[loop] = TickWheel(loop)
    return wheel
