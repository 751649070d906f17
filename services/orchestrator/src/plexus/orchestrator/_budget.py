"""Budget totals of run trees: reading the JetStream counters and noticing when they cross a budget.

Reporters (workers) increment ``<prefix>.<ns>.ctr.<root>.<dimension>`` with ``Nats-Incr``; the server adds
atomically, so the stored total is exact whatever the number of reporters. A core subscriber to the
counter subjects sees each increment's original publish (the delta, not the total), so `BudgetWatcher`
treats a delivery only as "this tree's total moved" and reads the total from the stream. Checks of one
tree are coalesced: at most one read in flight plus one queued, however fast the increments come.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from plexus.core import BudgetExhaustedError, ExecutionBudget
from plexus.runtime.kernel import StreamGets, escape_token, unescape_token
from plexus.runtime.orchestration import (
    COST_SCALE,
    UsageTotals,
    budget_counter_subject,
    run_counter_subject,
)

__all__ = ["DIMENSIONS", "BudgetWatcher", "budget_error", "grown", "read_own_usage", "read_usage"]

log = logging.getLogger("plexus.orchestrator")

DIMENSIONS = ("tokens", "cost_micros", "turns")
# `ctr.att.<message>` are handler-attempt counters, not budgets (`att` is refused as a run id at start).
_ATTEMPTS_TOKEN = "att"


def budget_error(budget: dict[str, Any] | None, usage: UsageTotals) -> BudgetExhaustedError | None:
    """The first dimension whose total is over the limit (tokens, cost, turns), as the agents' error."""
    if not budget:
        return None
    limits = ExecutionBudget.model_validate(budget)
    if limits.max_tokens is not None and usage.tokens > limits.max_tokens:
        return BudgetExhaustedError("tokens", usage.tokens, limits.max_tokens)
    if limits.max_cost_usd is not None and usage.cost_micros > limits.max_cost_usd * COST_SCALE:
        return BudgetExhaustedError("cost", usage.cost_micros / COST_SCALE, limits.max_cost_usd)
    if limits.max_turns is not None and usage.turns > limits.max_turns:
        return BudgetExhaustedError("turns", usage.turns, limits.max_turns)
    return None


async def read_counter(reader: JetStreamContext | StreamGets, stream: str, subject: str) -> int:
    try:
        msg = await reader.get_last_msg(stream, subject)
    except NotFoundError:
        return 0  # never incremented
    try:
        return int(json.loads(msg.data or b"{}")["val"])
    except (ValueError, KeyError, TypeError):
        log.warning("counter %s holds %r, not a counter value; counting it as 0", subject, msg.data)
        return 0


async def read_usage(
    reader: JetStreamContext | StreamGets,
    stream: str,
    prefix: str,
    namespaces: Iterable[str],
    root_id: str,
    dimensions: Iterable[str] = DIMENSIONS,
) -> UsageTotals:
    """A tree's totals: each dimension summed over the namespaces its agents report from (only
    ``dimensions`` are read; the others stay 0)."""
    root_tok = escape_token(root_id)
    totals = dict.fromkeys(DIMENSIONS, 0)
    reads = [
        (dimension, budget_counter_subject(prefix, escape_token(ns), root_tok, dimension))
        for ns in sorted(set(namespaces))
        for dimension in dimensions
    ]
    values = await asyncio.gather(*(read_counter(reader, stream, subject) for _, subject in reads))
    for (dimension, _), value in zip(reads, values, strict=True):
        totals[dimension] += value
    return UsageTotals(**totals)


async def read_own_usage(
    reader: JetStreamContext | StreamGets, stream: str, prefix: str, namespace: str, run_id: str
) -> UsageTotals:
    """What one run spent itself: its own counters (in its agent's namespace, where its worker reports)."""
    ns_tok, run_tok = escape_token(namespace), escape_token(run_id)
    values = await asyncio.gather(
        *(read_counter(reader, stream, run_counter_subject(prefix, ns_tok, run_tok, d)) for d in DIMENSIONS)
    )
    return UsageTotals(**dict(zip(DIMENSIONS, values, strict=True)))


def grown(recorded: UsageTotals, read: UsageTotals) -> UsageTotals:
    """Each dimension's larger figure: counters only grow, and one that expired (read as 0) must not erase
    what a record kept."""
    return UsageTotals(
        **{d: max(getattr(recorded, d), getattr(read, d)) for d in DIMENSIONS},
    )


class BudgetWatcher:
    """Calls ``check(root_id)`` when a budget counter of that tree moves, ``delay_s`` later: the moves of
    that window (a consume moves two or three counters; a busy tree reports many times a second) cost one
    check. The reporter whose increment crosses the budget is refused by its own consume at once; the
    watcher stops the tree's other agents, so it may come a moment later."""

    def __init__(
        self, nc: NATS, prefix: str, check: Callable[[str], Awaitable[object]], delay_s: float = 0.0
    ) -> None:
        if not delay_s >= 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.nc = nc
        self.prefix = prefix
        self.check = check
        self.delay_s = delay_s
        self._running: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._sub: Any = None
        self._stopping = False

    async def start(self) -> None:
        # All namespaces: a tree's agents may report from any of them.
        self._sub = await self.nc.subscribe(f"{self.prefix}.*.ctr.*.*", cb=self._on_increment)

    async def stop(self) -> None:
        self._stopping = True
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _on_increment(self, msg: Msg) -> None:
        tokens = msg.subject.split(".")
        if len(tokens) < 4 or tokens[-3] != "ctr" or tokens[-2] == _ATTEMPTS_TOKEN:
            return
        if tokens[-1] not in DIMENSIONS:
            return
        try:
            root_id = unescape_token(tokens[-2])
        except ValueError:
            return  # not a subject any reporter of ours writes
        self.poke(root_id)

    def poke(self, root_id: str) -> None:
        """Schedule a check of ``root_id`` (or mark the running one dirty so it checks once more)."""
        if self._stopping:
            return
        if root_id in self._running:
            self._dirty.add(root_id)
            return
        self._running[root_id] = asyncio.create_task(self._run(root_id), name=f"budget-{root_id}")

    async def _run(self, root_id: str) -> None:
        try:
            while True:
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                self._dirty.discard(root_id)
                try:
                    await self.check(root_id)
                except Exception:
                    log.exception("budget check of run tree %s failed", root_id)
                if root_id not in self._dirty or self._stopping:
                    return
        finally:
            self._running.pop(root_id, None)
