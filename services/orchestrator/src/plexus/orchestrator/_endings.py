"""Tree-wide endings of run trees — budget crossed, deadline passed, cancelled, root finished — and the
helpers every orchestrator operation shares.

Ordering makes an interrupted ending repairable: the root's terminal state is written first (by CAS, so
exactly one replica wins), then every still-active run of the tree, then the broadcasts and log entries,
and only then is the tree's slot table cleared; the sweeper re-runs `close_tree` for trees whose root
ended but whose slots are still held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from plexus.core import (
    AgentStep,
    CancellationError,
    ErrorInfo,
    KernelError,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunId,
)
from plexus.runtime.kernel import INSTRUMENTS, metrics_enabled
from plexus.runtime.orchestration import (
    TERMINAL,
    RunRecord,
    RunStateError,
    RunStatus,
    TreeRecord,
    UsageTotals,
    limited_dimensions,
)

from ._budget import DIMENSIONS, budget_error, grown, read_own_usage, read_usage
from ._events import Announcer, namespace_of
from ._runlog import log_run_end
from ._store import RunStore

if TYPE_CHECKING:
    from ._hosts import HostCheck

__all__ = ["DEADLINE", "Ending", "EngineConfig", "EngineCore", "TreeReading", "apply_ending", "tree_error"]

log = logging.getLogger("plexus.orchestrator")

DEADLINE = "deadline"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    prefix: str = "px"
    counters_stream: str = "PLEXUS_COUNTERS"
    events_stream: str = "PLEXUS_EVENTS"


@dataclass(frozen=True, slots=True)
class TreeReading:
    """A tree's budget totals, as read (only ``dimensions``: the others are 0, not unknown)."""

    usage: UsageTotals
    dimensions: tuple[str, ...]


@dataclass(slots=True)
class Ending:
    """What a tree ending writes into the root and every still-active run."""

    status: RunStatus
    decision: str
    error: dict[str, Any] | None = None
    output: msgspec.Raw | None = None
    reason: str | None = None
    #: The tree's totals (a root keeps them).
    usage: UsageTotals = field(default_factory=UsageTotals)
    #: The run's own counters as read for this ending (None: not read, the record keeps what it has).
    own: UsageTotals | None = None


def deadline_ending() -> Ending:
    """How a run that missed its deadline ends, whoever notices first (the sweeper or the worker's report).
    A fresh value each time: `end_tree` fills in its usage."""
    return Ending(RunStatus.FAILED, DEADLINE, CancellationError(DEADLINE).to_wire(), reason=DEADLINE)


def deadline_caused(record: RunRecord, error: dict[str, Any] | None) -> bool:
    """Whether a cancellation report is the run's own deadline (said so, or the deadline is behind us)."""
    if record.deadline is not None and time.time() >= record.deadline:
        return True
    fields = (error or {}).get("fields") or {}
    return (error or {}).get("error_type") == "CancellationError" and fields.get("reason") == DEADLINE


def tree_error(record: RunRecord) -> KernelError | None:
    """The error agents of an ended tree must see (None for a completed one)."""
    if record.status not in TERMINAL or record.status == RunStatus.COMPLETED:
        return None
    if record.error:
        return KernelError.from_wire(record.error)
    return CancellationError(record.reason or str(record.status))


class EngineCore:
    """State shared by every operation, and the tree-wide endings (budget, deadline, cancellation)."""

    def __init__(self, nc: NATS, js: JetStreamContext, store: RunStore, config: EngineConfig) -> None:
        self.nc = nc
        self.js = js
        self.store = store
        self.config = config
        self.announce = Announcer(nc, js, config.prefix, config.events_stream)
        #: Registry checks (set by the replica; None in engine-only tests): see `_hosts.py`.
        self.hosts: HostCheck | None = None

    # -- helpers --------------------------------------------------------------------------------------
    async def usage(
        self, root: RunRecord, tree: TreeRecord | None = None, dimensions: Iterable[str] = DIMENSIONS
    ) -> UsageTotals:
        namespaces = {namespace_of(root.agent_id)}
        if tree is not None:
            namespaces.update(tree.namespaces)  # where its runs reported, ended ones included
            namespaces.update(namespace_of(slot.agent_id) for slot in tree.active.values())  # older records
        return await read_usage(
            self.store.gets or self.js,
            self.config.counters_stream,
            self.config.prefix,
            namespaces,
            root.run_id,
            dimensions,
        )

    async def own_usage(self, agent_id: str, run_id: str) -> UsageTotals:
        """What run ``run_id`` (of ``agent_id``) spent itself, from its own counters."""
        return await read_own_usage(
            self.store.gets or self.js,
            self.config.counters_stream,
            self.config.prefix,
            namespace_of(agent_id),
            run_id,
        )

    async def _root_of(self, record: RunRecord) -> RunRecord:
        if record.parent_id is None:
            return record
        return (await self.store.require_run(record.root_id))[0]

    def _refuse_if_ended(self, root: RunRecord, run: RunRecord, action: str) -> None:
        error = tree_error(root)
        if error is not None:
            raise error
        if root.status in TERMINAL:
            raise RunStateError(root.run_id, str(root.status), action)
        if run.status in TERMINAL:
            raise RunStateError(run.run_id, str(run.status), action)

    async def _log(
        self, record: RunRecord, decision: str, entry: RunEvent, step: AgentStep, text: str, **meta: Any
    ) -> None:
        root_ns = namespace_of(record.agent_id) if record.parent_id is None else await self._root_ns(record)
        await self.announce.decision(record, root_ns, decision, entry, step, text, **meta)

    async def _root_ns(self, record: RunRecord) -> str:
        found = await self.store.get_run(record.root_id)
        return namespace_of(found[0].agent_id if found else record.agent_id)

    # -- tree-wide endings ----------------------------------------------------------------------------
    async def read_tree(self, root: RunRecord, dimensions: Iterable[str] = DIMENSIONS) -> TreeReading:
        """The tree's totals (only ``dimensions``), read with its record (which names the namespaces its
        agents report from): one round trip when they all report from the root's, two otherwise."""
        dimensions = tuple(dimensions)
        found, usage = await asyncio.gather(
            self.store.get_tree(root.run_id), self.usage(root, None, dimensions)
        )
        tree = found[0] if found else None
        root_namespace = namespace_of(root.agent_id)
        if tree is not None and (
            any(ns != root_namespace for ns in tree.namespaces)
            or any(namespace_of(slot.agent_id) != root_namespace for slot in tree.active.values())
        ):
            usage = await self.usage(root, tree, dimensions)
        return TreeReading(usage, dimensions)

    async def check_budget(self, root_id: str, known: RunRecord | None = None) -> bool:
        """Fail the tree if its counters are over its budget. ``known``: the root's record as the caller
        has it (a mirror may lag, but a root's parent and budget never change, and a stale status only
        costs this read: `end_tree` decides on the stored record)."""
        if known is None:
            found = await self.store.get_run(root_id)
            if found is None:
                return False
            known = found[0]
        root = known
        if root.parent_id is not None or root.status in TERMINAL or not root.budget:
            return False
        reading = await self.read_tree(root, limited_dimensions(root.budget))
        error = budget_error(root.budget, reading.usage)
        if error is None:
            return False
        ending = Ending(RunStatus.FAILED, "budget_exceeded", error.to_wire())
        return await self.end_tree(root_id, ending) is not None

    async def enforce_deadline(self, root_id: str) -> bool:
        found = await self.store.get_run(root_id)
        if found is None:
            return False
        root = found[0]
        if root.status in TERMINAL or root.deadline is None or time.time() < root.deadline:
            return False
        return await self.end_tree(root_id, deadline_ending()) is not None

    async def end_tree(
        self,
        root_id: str,
        ending: Ending,
        known: tuple[RunRecord, int] | None = None,
        reading: TreeReading | None = None,
    ) -> RunRecord | None:
        """End the whole tree (root first, by CAS: exactly one caller wins); the root as we wrote it, or None
        when another caller ended it first.

        ``known``: the root's record and revision as the caller just read them (not read again; a stale
        one costs a CAS conflict and a re-read). ``reading``: the tree's totals as the caller just read them
        (`read_tree` of every dimension): the totals the root keeps are those. The tree record itself is
        read again after the root's write, so children admitted meanwhile end too."""
        if reading is not None and set(reading.dimensions) != set(DIMENSIONS):
            raise ValueError(f"an ending records every dimension; read were only {reading.dimensions}")
        found = known or await self.store.get_run(root_id)
        if found is None or found[0].status in TERMINAL:
            return None
        root = found[0]
        if reading is None:
            read, ending.own = await asyncio.gather(
                self.read_tree(root), self.own_usage(root.agent_id, root_id)
            )
            ending.usage = read.usage
        else:
            ending.usage, ending.own = reading.usage, await self.own_usage(root.agent_id, root_id)
        changed = await self.store.update_run(root_id, lambda rec: apply_ending(rec, ending), known=found)
        if not changed.written:
            return None
        if metrics_enabled():
            _record_budget_use(changed.record, ending)
        await self.close_tree(changed.record, ending.decision)
        return changed.record

    async def close_tree(self, root: RunRecord, decision: str | None = None) -> None:
        """After the root ended: broadcast, end every still-active run like it, log, clear the slots.

        The broadcast goes first so agents stop at once however large the tree; a repeated close (the
        sweeper re-runs it for trees whose closing was interrupted) only repeats idempotent steps."""
        found = await self.store.get_tree(root.run_id)
        active = dict(found[0].active) if found else {}
        others = [run_id for run_id in active if run_id != root.run_id]
        if root.status == RunStatus.COMPLETED:
            inherited = Ending(
                RunStatus.CANCELLED,
                "cancelled",
                CancellationError("root run completed").to_wire(),
                reason="root run completed",
            )
        else:
            inherited = Ending(
                RunStatus(root.status), decision or str(root.status), root.error, reason=root.reason
            )
        if root.status != RunStatus.COMPLETED or others:
            namespaces = {namespace_of(root.agent_id), *(namespace_of(s.agent_id) for s in active.values())}
            reason = inherited.reason or root.reason or str(root.status)
            await self.announce.cancel(namespaces, root.run_id, reason, inherited.error)
        # Each run's own usage so far (its agent may still be spending until the broadcast reaches it:
        # that part is caught up later, see `settle_usage`).
        owns = await asyncio.gather(*(self.own_usage(active[run_id].agent_id, run_id) for run_id in others))
        for run_id, own in zip(others, owns, strict=True):
            theirs = replace(inherited, own=own)
            try:
                changed = await self.store.update_run(run_id, partial(apply_ending, ending=theirs))
            except KernelError:
                continue  # a slot whose run record never got written
            if changed.written:
                await self._log_ending(changed.record, theirs)
        if decision is not None:
            await self._log_ending(
                root,
                Ending(RunStatus(root.status), decision, root.error, root.output, root.reason, root.usage),
            )
        if found is not None:
            # From the revision read above when the root held the only slot; with children, their reports
            # (to the cancel above) free slots meanwhile, so a fresh read beats a likely conflict.
            await self.store.update_tree(root.run_id, clear_slots, known=None if others else found)

    async def _log_ending(self, record: RunRecord, ending: Ending) -> None:
        log_run_end(record, ending.decision)
        entry: RunEvent
        if record.status == RunStatus.COMPLETED:
            output = msgspec.json.decode(bytes(record.output)) if record.output is not None else None
            entry = RunCompleted(run_id=RunId(record.run_id), agent_id=record.agent_id, output=output)
            step, text = AgentStep.DONE, f"run {record.run_id} completed"
        elif record.status == RunStatus.CANCELLED:
            entry = RunCancelled(run_id=RunId(record.run_id), agent_id=record.agent_id, reason=record.reason)
            step, text = AgentStep.ERROR, f"run {record.run_id} cancelled: {record.reason}"
        else:
            wire = record.error or KernelError(record.reason or "failed").to_wire()
            entry = RunFailed(
                run_id=RunId(record.run_id), agent_id=record.agent_id, error=ErrorInfo.model_validate(wire)
            )
            step, text = AgentStep.ERROR, f"run {record.run_id} failed: {record.reason}"
        usage = msgspec.to_builtins(record.usage)
        await self._log(record, ending.decision, entry, step, text, reason=record.reason, usage=usage)


def apply_ending(rec: RunRecord, ending: Ending) -> bool:
    if rec.status in TERMINAL:
        return False
    rec.status = ending.status
    rec.error = ending.error
    rec.output = ending.output
    if ending.reason is not None:
        rec.reason = ending.reason
    elif ending.error is not None:
        rec.reason = str(ending.error.get("message") or ending.error.get("error_type"))
    else:
        rec.reason = None
    if ending.own is not None:
        rec.own_usage = grown(rec.own_usage, ending.own)
    # A root keeps its tree's totals, a child its own (see `RunRecord.usage`).
    rec.usage = grown(rec.usage, ending.usage) if rec.parent_id is None else rec.own_usage
    rec.retry_at = None
    rec.updated_at = time.time()
    return True


def clear_slots(tree: TreeRecord) -> bool:
    if not tree.active:
        return False
    tree.active = {}
    return True


def _record_budget_use(root: RunRecord, ending: Ending) -> None:
    """Budget use per run tree: tokens used, and the share of each budgeted dimension, when it ends."""
    attributes = {"agent_type": root.agent_id.split("/", 1)[0], "decision": ending.decision}
    INSTRUMENTS.tree_tokens.record(ending.usage.tokens, attributes)
    budget = root.budget or {}
    used = {
        "tokens": (ending.usage.tokens, budget.get("max_tokens")),
        "cost": (ending.usage.cost_micros / 1e6, budget.get("max_cost_usd")),
        "turns": (ending.usage.turns, budget.get("max_turns")),
    }
    for dimension, (value, limit) in used.items():
        if isinstance(limit, int | float) and limit > 0:
            INSTRUMENTS.budget_used.record(value / limit, {**attributes, "dimension": dimension})
