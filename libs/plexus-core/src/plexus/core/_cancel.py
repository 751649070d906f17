"""Cooperative cancellation: the generation counter of seed 002, made event-driven.

The host owns a `CancellationController`, which has two verbs:

* ``interrupt(reason)`` ends the current *turn*. It bumps the generation, so every `TurnCancellation`
  taken before it (``handle.checkpoint()``) reports cancelled, while the handle stays live and the next
  checkpoint starts clean.
* ``cancel(reason)`` ends *everything* and cannot be undone. The handle, every checkpoint (earlier or
  later) and every child token report cancelled.

Code that does the work gets a `CancellationToken`: the `CancellationHandle`, or a `TurnCancellation`
for one turn. It can poll ``is_cancelled`` or ``check()`` (which raises `CancellationError(reason)`), and
it can ``await token.wait()``. The wait parks on a future that is resolved with
``loop.call_soon_threadsafe``, so it wakes at once and never polls, even when the cancel comes from another
thread. Nothing here touches an event loop until ``wait()`` runs inside one.

``token.child()`` gives a new controller whose handle is cancelled, with the same reason, when the token
is cancelled. Cancelling the child leaves the parent alone. A parent holds its children weakly, so a child
that nobody references any more costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable

from ._errors import CancellationError

__all__ = [
    "CallbackRegistration",
    "CancellationController",
    "CancellationHandle",
    "CancellationToken",
    "TurnCancellation",
]

_Callback = Callable[[str], object]


def _check_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"a cancellation reason must be a non-empty string, got {reason!r}")
    return reason


class _State:
    """What a controller and its tokens share. A listener registered with ``since=None`` fires on cancel
    only; one registered with ``since=g`` (a turn taken at generation g) fires on the next interrupt too."""

    __slots__ = (
        "__weakref__",
        "_detach",
        "_listeners",
        "_lock",
        "_next_key",
        "_prune_at",
        "cancel_reason",
        "generation",
        "reasons",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation = 0
        # reasons[g] is the reason that moved the generation from g to g + 1.
        self.reasons: list[str] = []
        self.cancel_reason: str | None = None
        self._listeners: dict[int, tuple[int | None, _Callback, weakref.ref[_State] | None]] = {}
        self._next_key = 0
        self._prune_at = 16
        # Set on a child: removes its link from the parent once the child is cancelled on its own.
        self._detach: Callable[[], None] | None = None

    def fired(self, since: int | None) -> bool:
        return self.cancel_reason is not None or (since is not None and self.generation != since)

    def reason_for(self, since: int | None) -> str | None:
        if since is not None and self.generation > since:
            return self.reasons[since]
        return self.cancel_reason

    def add(self, since: int | None, fn: _Callback, child: _State | None = None) -> int | None:
        """Register `fn`; returns its key, or None when the scope has already fired (then nothing is kept)."""
        with self._lock:
            if self.fired(since):
                return None
            if len(self._listeners) >= self._prune_at:
                self._prune_dead_children()
            key = self._next_key
            self._next_key += 1
            self._listeners[key] = (since, fn, None if child is None else weakref.ref(child))
            return key

    def _prune_dead_children(self) -> None:
        # Amortised O(1): prune only when the table has doubled since the last prune.
        dead = [k for k, (_, _, ref) in self._listeners.items() if ref is not None and ref() is None]
        for key in dead:
            del self._listeners[key]
        self._prune_at = max(16, 2 * len(self._listeners))

    def remove(self, key: int) -> bool:
        with self._lock:
            return self._listeners.pop(key, None) is not None

    def bump(self, reason: str, *, final: bool) -> bool:
        """Interrupt (``final=False``) or cancel (``final=True``); False if it changed nothing."""
        with self._lock:
            if self.cancel_reason is not None:
                return False
            self.reasons.append(reason)
            self.generation += 1
            detach = None
            if final:
                self.cancel_reason = reason
                fire = list(self._listeners.values())
                self._listeners.clear()
                detach, self._detach = self._detach, None
            else:
                keys = [k for k, (since, _, _) in self._listeners.items() if since is not None]
                fire = [self._listeners.pop(k) for k in keys]
        # Run callbacks outside the lock so that they may call back into this state.
        errors: list[Exception] = []
        for _, fn, _ in fire:
            try:
                fn(reason)
            except Exception as exc:  # every callback runs even if one fails; failures are re-raised below
                errors.append(exc)
        if detach is not None:
            detach()
        if errors:
            raise ExceptionGroup(f"{len(errors)} cancellation callback(s) failed", errors)
        return True


def _settle(fut: asyncio.Future[str], reason: str) -> None:
    if not fut.done():  # the waiting task may have been cancelled meanwhile
        fut.set_result(reason)


class CallbackRegistration:
    """Returned by `CancellationToken.add_callback`; ``unregister()`` is idempotent."""

    __slots__ = ("_key", "_state")

    def __init__(self, state: _State | None, key: int | None) -> None:
        self._state = state
        self._key = key

    def unregister(self) -> bool:
        """Drop the callback; True if it was still pending (had not run)."""
        state, key = self._state, self._key
        self._state = self._key = None
        return state is not None and key is not None and state.remove(key)


class CancellationToken:
    """What cancellable work receives: a `CancellationHandle` or a `TurnCancellation`.

    Not built directly; get one from `CancellationController.handle` or `CancellationHandle.checkpoint`.
    """

    __slots__ = ("_since", "_state")

    def __init__(self, state: _State, since: int | None) -> None:
        self._state = state
        self._since = since

    @property
    def is_cancelled(self) -> bool:
        return self._state.fired(self._since)

    @property
    def reason(self) -> str | None:
        """Why this token was cancelled; None while it is not."""
        return self._state.reason_for(self._since)

    def check(self) -> None:
        """Raise `CancellationError(reason)` if cancelled; a cheap call for loops and tool code."""
        reason = self.reason
        if reason is not None:
            raise CancellationError(reason)

    async def wait(self) -> str:
        """Return the reason once this token is cancelled (at once if it already is). Never polls."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()

        def wake(reason: str) -> None:
            # RuntimeError: the loop is closed, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, fut, reason)

        key = self._state.add(self._since, wake)
        if key is None:
            return self._fired_reason()
        try:
            return await fut
        finally:
            # The waiter may be abandoned (its task cancelled after losing a race); don't keep it.
            self._state.remove(key)

    async def cancelled(self) -> str:
        """Same as `wait` (the name seed 002 uses): ``await token.cancelled()``."""
        return await self.wait()

    def add_callback(self, fn: Callable[[str], object]) -> CallbackRegistration:
        """Call ``fn(reason)`` once, on the thread that cancels; at once if already cancelled.

        A callback that raises doesn't stop the others: the cancelling call raises an ExceptionGroup after
        all of them have run.
        """
        key = self._state.add(self._since, fn)
        if key is None:
            fn(self._fired_reason())
            return CallbackRegistration(None, None)
        return CallbackRegistration(self._state, key)

    def child(self) -> CancellationController:
        """A new controller whose handle is cancelled when this token is; cancelling it spares this one."""
        child = CancellationController()
        child_state = child._state
        child_ref = weakref.ref(child_state)

        def propagate(reason: str) -> None:
            target = child_ref()
            if target is not None:
                target.bump(reason, final=True)

        key = self._state.add(self._since, propagate, child=child_state)
        if key is None:
            child.cancel(self._fired_reason())
        else:
            parent = self._state

            def detach() -> None:
                parent.remove(key)

            child_state._detach = detach
        return child

    def _fired_reason(self) -> str:
        reason = self.reason
        assert reason is not None, "called only after the scope has fired"
        return reason

    def __repr__(self) -> str:
        state = f"cancelled: {self.reason!r}" if self.is_cancelled else "live"
        return f"<{type(self).__name__} generation={self._state.generation} {state}>"


class CancellationHandle(CancellationToken):
    """The shared side of a controller: live until the controller cancels (interrupts don't touch it)."""

    __slots__ = ()

    @property
    def generation(self) -> int:
        """How many interrupts and cancels have happened so far."""
        return self._state.generation

    def checkpoint(self) -> TurnCancellation:
        """A token for the turn starting now: cancelled by the next interrupt or by a cancel."""
        return TurnCancellation(self._state, self._state.generation)


class TurnCancellation(CancellationToken):
    """A token for one turn: cancelled iff the generation moved since it was taken, or the handle is."""

    __slots__ = ()

    @property
    def generation(self) -> int:
        """The generation at which this checkpoint was taken."""
        assert self._since is not None
        return self._since


class CancellationController:
    """Owned by the host. Hand out ``controller.handle``; keep the power to interrupt and cancel."""

    __slots__ = ("_handle", "_state")

    def __init__(self) -> None:
        self._state = _State()
        self._handle = CancellationHandle(self._state, None)

    @property
    def handle(self) -> CancellationHandle:
        return self._handle

    @property
    def generation(self) -> int:
        return self._state.generation

    @property
    def is_cancelled(self) -> bool:
        return self._state.cancel_reason is not None

    def interrupt(self, reason: str = "interrupted") -> bool:
        """End the current turn; returns False (and does nothing) if already cancelled."""
        return self._state.bump(_check_reason(reason), final=False)

    def cancel(self, reason: str = "cancelled") -> bool:
        """Cancel for good; returns False if already cancelled (the first reason stays)."""
        return self._state.bump(_check_reason(reason), final=True)

    def __repr__(self) -> str:
        return f"<CancellationController of {self._handle!r}>"
