"""Spawn slots of one run tree: admission against `SpawnBudget.max_agents`, preemption and release.

Pure functions over a `TreeRecord` (mutated in place), applied inside a compare-and-swap on the tree's KV
key, so two replicas admitting at once can never both take the last slot.

Rules (the issue is explicit on the first three, the rest are our choices):
- a slot is held by every active run of the tree, the root included; a paused run holds none;
- over budget, a HIGH or CRITICAL request with ``allow_preempt`` pauses the lowest-priority running agent
  strictly below it and takes its slot;
- when a slot is released, paused runs resume before new spawns can take it;
- the requesting run and its ancestors are never preempted: they are waiting for this very child, so
  pausing them would free a slot by stalling the work that asked for it;
- among equally low candidates, the most recently admitted is paused (it has done the least work); among
  paused runs, the highest priority resumes first, then the earliest admitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from plexus.core import Priority
from plexus.runtime.orchestration import Slot, TreeRecord

from ._events import namespace_of

__all__ = ["Admission", "admit", "choose_victim", "release", "running_count"]

#: The lowest priority that may preempt (HIGH, CRITICAL).
PREEMPT_FLOOR = int(Priority.HIGH)


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of `admit`: whether the child got a slot, the run paused for it, and whether the tree
    record changed (False for a repeated admission of the same child, or a denial)."""

    admitted: bool
    preempted: str | None = None
    changed: bool = False


def running_count(tree: TreeRecord) -> int:
    """Slots in use: active runs that are not paused."""
    return sum(1 for slot in tree.active.values() if not slot.paused)


def choose_victim(tree: TreeRecord, priority: int, protected: Iterable[str] = ()) -> str | None:
    """The run to pause for a request at ``priority``, or None when no running run is strictly below it."""
    keep = set(protected)
    best: tuple[int, int, str] | None = None
    for order, (run_id, slot) in enumerate(tree.active.items()):
        if slot.paused or run_id in keep or slot.priority >= priority:
            continue
        # Lowest priority first; among equals the latest admitted (largest order, hence -order smallest).
        key = (slot.priority, -order, run_id)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def admit(
    tree: TreeRecord, run_id: str, agent_id: str, priority: int, protected: Iterable[str] = ()
) -> Admission:
    """Give ``run_id`` a slot if the budget allows, preempting if allowed; mutates ``tree``."""
    if run_id in tree.active:  # a retried spawn of an admitted child: same answer, no second slot
        return Admission(admitted=True)
    if running_count(tree) < tree.max_agents:
        _occupy(tree, run_id, agent_id, priority)
        return Admission(admitted=True, changed=True)
    if not tree.allow_preempt or priority < PREEMPT_FLOOR:
        return Admission(admitted=False)
    victim = choose_victim(tree, priority, protected)
    if victim is None:
        return Admission(admitted=False)
    paused = tree.active[victim]
    paused.paused = True
    paused.preempted_by = run_id
    _occupy(tree, run_id, agent_id, priority)
    return Admission(admitted=True, preempted=victim, changed=True)


def _occupy(tree: TreeRecord, run_id: str, agent_id: str, priority: int) -> None:
    tree.active[run_id] = Slot(agent_id=agent_id, priority=priority)
    tree.spawned_total += 1
    namespace = namespace_of(agent_id)
    if namespace not in tree.namespaces:  # its spend keeps counting after the run ends
        tree.namespaces.append(namespace)


def release(tree: TreeRecord, run_ids: Iterable[str]) -> tuple[bool, list[str]]:
    """Free the slots of ``run_ids`` (finished runs) and resume paused runs while slots are free.

    Returns ``(changed, resumed run ids)``; mutates ``tree``.
    """
    changed = False
    for run_id in run_ids:
        if tree.active.pop(run_id, None) is not None:
            changed = True
    resumed: list[str] = []
    while running_count(tree) < tree.max_agents:
        candidates = [
            (-slot.priority, order, rid)
            for order, (rid, slot) in enumerate(tree.active.items())
            if slot.paused
        ]
        if not candidates:
            break
        _, _, rid = min(candidates)
        slot = tree.active[rid]
        slot.paused = False
        slot.preempted_by = None
        resumed.append(rid)
        changed = True
    return changed, resumed
