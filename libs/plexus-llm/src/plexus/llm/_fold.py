"""`PrefixFold`: a left fold over a transcript that goes on from where the conversation's last call stopped.

Every model turn sends the whole conversation, and what a provider's messages are depends on the items'
order (tool results merged after their calls, calls left unanswered answered as cancelled), so an item's
own conversion (`ItemMemo`) is not the whole story: a pass over every item remained, and each turn's cost
grew with the conversation. A conversation mostly grows at its end, so the fold keeps the state it reached
after the last call's items and, when the next call's items begin with those same item objects, adds only
the new ones.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Generic, TypeVar

from plexus.core import Item

__all__ = ["PrefixFold"]

S = TypeVar("S")


class _Run(Generic[S]):
    """The state after folding the items whose ids are ``ids``, all of them alive (an item that dies ends
    the run, so an id the interpreter gives to a later item never matches)."""

    __slots__ = ("__weakref__", "forget", "ids", "refs", "state")

    def __init__(self, state: S, forget: Callable[[weakref.ref[Item]], None]) -> None:
        self.state = state
        self.forget = forget  # the callback of each item's weak reference
        self.ids: list[int] = []
        self.refs: list[weakref.ref[Item]] = []


class PrefixFold(Generic[S]):
    """``fold(items)`` is ``start()`` with ``add(state, item)`` applied for each item in order, resumed from
    the state the last call reached when its items are a prefix of these (the same objects, in order).

    One run is kept per first item (a conversation's system prompt or first message): conversations going
    on side by side each keep theirs. The returned state is shared with the next call: read it, never change
    it. When ``add`` raises, the run is dropped (its state is half-changed) and the next call starts over.
    Calls from several threads take turns (a run is extended by one call at a time).
    """

    def __init__(self, start: Callable[[], S], add: Callable[[S, Item], None]) -> None:
        self._start = start
        self._add = add
        self._runs: dict[int, _Run[S]] = {}
        # Reentrant: a garbage collection inside ``add`` may run a dead item's callback on this thread.
        self._lock = threading.RLock()

    def __call__(self, items: Sequence[Item]) -> S:
        if not items:
            return self._start()
        with self._lock:
            return self._fold(items)

    def _fold(self, items: Sequence[Item]) -> S:
        key = id(items[0])
        run = self._runs.get(key)
        done = 0
        if run is not None:
            done = len(run.ids)
            # Ids compared at C speed; they stand for the objects because every one of them is alive.
            if done > len(items) or list(map(id, islice(items, done))) != run.ids:
                run, done = None, 0
        if run is None:
            run = self._runs[key] = self._new_run(key)
        try:
            for item in islice(items, done, None):
                self._add(run.state, item)
                run.ids.append(id(item))
                run.refs.append(weakref.ref(item, run.forget))
        except BaseException:
            if self._runs.get(key) is run:
                del self._runs[key]
            raise
        return run.state

    def _new_run(self, key: int) -> _Run[S]:
        # The callback holds the fold and the run weakly: a fold nobody uses, and a run replaced in it, go
        # at once with their last reference, not at a garbage collection.
        fold_ref = weakref.ref(self)
        run_ref: weakref.ref[_Run[S]] | None = None

        def forget(_dead: weakref.ref[Item]) -> None:
            fold = fold_ref()
            if fold is None or run_ref is None:
                return
            with fold._lock:
                if (current := fold._runs.get(key)) is not None and current is run_ref():
                    del fold._runs[key]

        run = _Run(self._start(), forget)
        run_ref = weakref.ref(run)
        return run

    def __len__(self) -> int:
        return len(self._runs)
