"""How an ended tree's records catch up with usage reported after its end.

Ending a tree writes the root's record at once and broadcasts the cancellation; agents already mid-turn
keep reporting usage until it reaches them, and that usage is counted (it was spent). A tree has *settled*
once its root has ended and its counters stop moving. Every later increment still reaches the budget
watchers (`BudgetWatcher`), which call `settle_usage`; the sweeper calls it once more `settle_s` after the
root ended, for deliveries a watcher missed. Each call is screened: only when the tree's counters exceed
the root's record are all the tree's records rewritten (the root: the tree's totals and its own counters;
every other run: its own counters), by CAS and never downwards, so replicas doing it at once agree.
"""

from __future__ import annotations

import asyncio

from plexus.runtime.orchestration import TERMINAL, RunNotFoundError, RunRecord, UsageTotals

from ._budget import DIMENSIONS, grown
from ._endings import EngineCore

__all__ = ["catch_up_run", "settle_usage"]


def _exceeds(read: UsageTotals, recorded: UsageTotals) -> bool:
    return any(getattr(read, d) > getattr(recorded, d) for d in DIMENSIONS)


async def settle_usage(
    core: EngineCore, root_id: str, force: bool = False, ended: RunRecord | None = None
) -> RunRecord | None:
    """Catch the records of the ended tree ``root_id`` up with its counters (see the module docstring).

    Returns the root's record (None when unknown); a live root is returned untouched. ``force``: rewrite the
    runs' own figures even when the tree's totals match the root's record (an ending that read a child's
    counters before its last increment landed). ``ended``: the ended root as an index last saw it (agent and
    usage): the screen reads the counters only, and the record only when they passed that usage."""
    if ended is not None and not force and not _exceeds((await core.read_tree(ended)).usage, ended.usage):
        return ended
    found = await core.store.get_run(root_id)
    if found is None or found[0].parent_id is not None:
        return None
    root = found[0]
    if root.status not in TERMINAL:
        return root
    reading = await core.read_tree(root)
    if not force and not _exceeds(reading.usage, root.usage):
        return root
    runs = await _tree_runs(core, root)
    owns = await asyncio.gather(*(core.own_usage(run.agent_id, run.run_id) for run in runs))
    for run, own in zip(runs, owns, strict=True):
        if run.run_id != root_id:
            await _catch_up(core, run.run_id, own, None)
    return await _catch_up(core, root_id, owns[0], reading.usage) or root


async def catch_up_run(core: EngineCore, run: RunRecord) -> RunRecord:
    """Catch one ended child's record up with its own counters (its agent reported after the tree's end
    had been written into it); a root is settled as a whole."""
    if run.parent_id is None:
        return await settle_usage(core, run.run_id) or run
    own = await core.own_usage(run.agent_id, run.run_id)
    return await _catch_up(core, run.run_id, own, None) or run


async def _tree_runs(core: EngineCore, root: RunRecord) -> list[RunRecord]:
    """The root and every run under it (breadth first, from each record's ``children``)."""
    out = [root]
    frontier: list[str] = list(root.children)
    while frontier:
        found = await asyncio.gather(*(core.store.get_run(run_id) for run_id in frontier))
        level = [f[0] for f in found if f is not None]
        out.extend(level)
        frontier = [child for run in level for child in run.children]
    return out


async def _catch_up(
    core: EngineCore, run_id: str, own: UsageTotals, tree: UsageTotals | None
) -> RunRecord | None:
    def mutate(rec: RunRecord) -> bool:
        before = (rec.usage, rec.own_usage)
        rec.own_usage = grown(rec.own_usage, own)
        rec.usage = grown(rec.usage, tree) if tree is not None else rec.own_usage
        return (rec.usage, rec.own_usage) != before

    try:
        return (await core.store.update_run(run_id, mutate)).record
    except RunNotFoundError:
        return None  # a child slot whose record was never written
