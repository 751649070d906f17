"""What every replica enforces without being asked: deadlines, crash-retry backoffs, budget crossings that
arrived while no one watched, operations a killed replica left half done, and ended trees' records caught
up with usage reported after their end (once, ``settle_s`` after it: see _settle.py).

`RunIndex` mirrors the live part of `plexus_runs` (runs that are not terminal, trees that still hold slots)
from a KV watch, so it is rebuilt from JetStream on start and any replica can die. It is only an index:
every action re-reads the record and decides by compare-and-swap, so all replicas may act on the same
run at the same moment and exactly one write wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import OrderedDict
from typing import Any

from nats.js.kv import KeyValue

from plexus.core import AgentNotFoundError
from plexus.runtime.kernel import unescape_token
from plexus.runtime.orchestration import TERMINAL, RunRecord, RunStatus, TreeRecord

from ._budget import budget_error
from ._endings import Ending
from ._engine import Engine
from ._hosts import HostCheck
from ._store import decode_run, decode_tree

__all__ = ["RunIndex", "Sweeper", "SweeperConfig"]

log = logging.getLogger("plexus.orchestrator")

_DELETE_OPS = ("DEL", "PURGE")


#: How many ended roots `RunIndex.ended` remembers.
ENDED_MEMORY = 10_000


class RunIndex:
    """Non-terminal runs and slot-holding trees, kept current from a KV watch of the runs bucket, and the ids
    of the roots seen ended most recently."""

    def __init__(self, kv: KeyValue, settle_s: float = 5.0) -> None:
        self.kv = kv
        self.settle_s = settle_s
        self.runs: dict[str, RunRecord] = {}
        self.trees: dict[str, TreeRecord] = {}
        self.deadlines: list[tuple[float, str]] = []  # heap of (deadline, root id)
        self.retries: list[tuple[float, str]] = []  # heap of (retry_at, run id)
        self.settles: list[tuple[float, str]] = []  # heap of (end + settle_s, root id)
        # What the heaps hold, so the many updates of one run do not push it again and again.
        self._scheduled: set[tuple[str, float, str]] = set()
        #: Roots last seen terminal (the newest `ENDED_MEMORY`) with the usage their record holds: a terminal
        #: status is final, so a budget counter that moves after its tree ended (a watcher's delayed check)
        #: needs no read of the record unless the counters passed that usage (see _settle.py).
        self.ended: OrderedDict[str, RunRecord] = OrderedDict()
        self.ready = asyncio.Event()
        self._watchers: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, timeout: float = 30.0) -> None:
        # Two watches, not ">": the bucket also holds root inputs, which the index never needs.
        snapshots: list[asyncio.Event] = []
        for pattern in ("run.>", "tree.>"):
            watcher = await self.kv.watch(pattern, inactive_threshold=30.0)
            done = asyncio.Event()
            self._watchers.append(watcher)
            snapshots.append(done)
            self._tasks.append(asyncio.create_task(self._consume(watcher, done), name=f"index-{pattern}"))
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in snapshots)), timeout)
        self.ready.set()

    async def stop(self) -> None:
        for watcher in self._watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _consume(self, watcher: Any, snapshot_done: asyncio.Event) -> None:
        async for entry in watcher:
            if entry is None:  # the end of the initial snapshot
                snapshot_done.set()
                continue
            try:
                self.apply(entry.key, entry.value, entry.operation)
            except Exception:
                # An unreadable record (a newer version, or garbage put there) is skipped, never fatal.
                log.warning("ignoring unreadable %s in the runs bucket", entry.key, exc_info=True)

    def apply(self, key: str, value: bytes | None, operation: str | None) -> None:
        kind, _, token = key.partition(".")
        deleted = operation in _DELETE_OPS or not value
        if kind == "run":
            if deleted:
                self._drop_run_by_key(token)
                return
            assert value is not None
            record = decode_run(value)
            if record.status in TERMINAL:
                self.runs.pop(record.run_id, None)
                if record.parent_id is None:  # budgets are the roots': only their ids are looked up
                    # Kept without its output (which may be large): only the screen's fields are read.
                    self.ended[record.run_id] = RunRecord(
                        run_id=record.run_id,
                        root_id=record.root_id,
                        agent_id=record.agent_id,
                        status=record.status,
                        usage=record.usage,
                    )
                    self.ended.move_to_end(record.run_id)
                    if len(self.ended) > ENDED_MEMORY:
                        self.ended.popitem(last=False)
                    settle_at = record.updated_at + self.settle_s
                    if settle_at >= time.time() - self.settle_s:  # not the history a restart reads
                        self._schedule(self.settles, "settle", settle_at, record.run_id)
                return
            self.runs[record.run_id] = record
            if record.parent_id is None and record.deadline is not None:
                self._schedule(self.deadlines, "deadline", record.deadline, record.run_id)
            if record.status == RunStatus.PENDING and record.retry_at is not None:
                self._schedule(self.retries, "retry", record.retry_at, record.run_id)
        elif kind == "tree":
            if deleted:
                return
            assert value is not None
            tree = decode_tree(value)
            if tree.active:
                self.trees[tree.root_id] = tree
            else:
                self.trees.pop(tree.root_id, None)

    def _schedule(self, heap: list[tuple[float, str]], kind: str, at: float, run_id: str) -> None:
        if (kind, at, run_id) not in self._scheduled:
            self._scheduled.add((kind, at, run_id))
            heapq.heappush(heap, (at, run_id))

    def _drop_run_by_key(self, token: str) -> None:
        try:
            self.runs.pop(unescape_token(token), None)
        except ValueError:
            return

    def due_deadlines(self, now: float) -> list[str]:
        due: list[str] = []
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, root_id = heapq.heappop(self.deadlines)
            self._scheduled.discard(("deadline", deadline, root_id))
            record = self.runs.get(root_id)
            if record is not None and record.deadline == deadline:
                due.append(root_id)
        return due

    def due_settles(self, now: float) -> list[str]:
        due: list[str] = []
        while self.settles and self.settles[0][0] <= now:
            at, root_id = heapq.heappop(self.settles)
            self._scheduled.discard(("settle", at, root_id))
            due.append(root_id)
        return due

    def due_retries(self, now: float) -> list[str]:
        due: list[str] = []
        while self.retries and self.retries[0][0] <= now:
            retry_at, run_id = heapq.heappop(self.retries)
            self._scheduled.discard(("retry", retry_at, run_id))
            record = self.runs.get(run_id)
            if record is not None and record.retry_at == retry_at and record.status == RunStatus.PENDING:
                due.append(run_id)
        return due


class SweeperConfig:
    """Periods of the sweeper's duties (seconds)."""

    def __init__(
        self,
        tick_s: float = 0.1,
        budget_recheck_s: float = 5.0,
        repair_s: float = 2.0,
        start_grace_s: float = 2.0,
        spawn_grace_s: float = 30.0,
        close_grace_s: float = 2.0,
        no_host_grace_s: float = 30.0,
        settle_s: float = 5.0,
    ) -> None:
        for name, value in locals().items():
            if name != "self" and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.tick_s = tick_s
        self.budget_recheck_s = budget_recheck_s
        self.repair_s = repair_s
        self.start_grace_s = start_grace_s
        self.spawn_grace_s = spawn_grace_s
        self.close_grace_s = close_grace_s
        #: How long a root run may wait for any live worker to host its type before it fails.
        self.no_host_grace_s = no_host_grace_s
        #: When, after a tree ended, its records are caught up with its counters once more (see _settle.py).
        self.settle_s = settle_s


class Sweeper:
    """The periodic duties (see the module docstring); one per replica, all replicas run them."""

    def __init__(
        self,
        engine: Engine,
        index: RunIndex,
        config: SweeperConfig | None = None,
        hosts: HostCheck | None = None,
    ) -> None:
        self.engine = engine
        self.index = index
        self.config = config or SweeperConfig()
        self.hosts = hosts
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.rounds = 0

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._loop(), name="orchestrator-sweeper")

    async def stop(self) -> None:
        # The flag as well as the cancel: a library call that swallows CancelledError (seen in nats-py
        # requests) would otherwise leave the loop running forever.
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        last_budget = last_repair = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(self.config.tick_s)
            now = time.time()
            for root_id in self.index.due_deadlines(now):
                await self._guard("deadline", root_id, self.engine.enforce_deadline(root_id))
            for run_id in self.index.due_retries(now):
                await self._guard("retry", run_id, self.engine.retry_started(run_id))
            for root_id in self.index.due_settles(now):
                await self._guard(
                    "settle", root_id, self.engine.settle_usage(root_id, ended=self.index.ended.get(root_id))
                )
            mono = time.monotonic()
            if mono - last_budget >= self.config.budget_recheck_s:
                last_budget = mono
                await self.recheck_budgets()
            if mono - last_repair >= self.config.repair_s:
                last_repair = mono
                await self.repair()
            self.rounds += 1

    async def _guard(self, what: str, run_id: str, work: Any) -> None:
        if self._stopping:
            work.close()  # never awaited: close the coroutine instead of leaking a warning
            return
        try:
            await work
        except Exception:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from None  # the failure was our own cancellation in disguise
            log.exception("sweeper: %s of run %s failed; next round retries", what, run_id)

    async def recheck_budgets(self) -> None:
        """The backstop for budget crossings whose counter deliveries this replica missed."""
        for record in list(self.index.runs.values()):
            if record.parent_id is None and record.budget:
                await self._guard("budget", record.run_id, self._recheck(record))

    async def _recheck(self, root: RunRecord) -> None:
        # Screen with the indexed records (counters only); the full, re-reading check runs on a crossing.
        usage = await self.engine.usage(root, self.index.trees.get(root.run_id))
        if budget_error(root.budget, usage) is not None:
            await self.engine.check_budget(root.run_id)

    async def repair(self) -> None:
        """Finish what a killed replica left half done."""
        now = time.time()
        for record in list(self.index.runs.values()):
            if record.status != RunStatus.PENDING or record.retry_at is not None:
                continue
            if record.parent_id is None:
                if record.attempts == 0 and now - record.created_at >= self.config.start_grace_s:
                    await self._guard("dispatch", record.run_id, self.engine.dispatch(record.run_id))
            elif now - record.created_at >= self.config.spawn_grace_s:
                await self._guard("stale spawn", record.run_id, self._stale_spawn(record))
        for root_id, tree in list(self.index.trees.items()):
            if root_id not in self.index.runs:  # the root is terminal (or unknown) but slots are held
                await self._guard("close", root_id, self._close(root_id, now))
                continue
            held = [run_id for run_id in tree.active if run_id != root_id and run_id not in self.index.runs]
            if held:  # slots of runs that ended (or were never written): free them
                await self._guard("release", root_id, self._release_ended(root_id, held, now))
        if self.hosts is not None:
            await self._guard("hosts", "*", self._fail_unhosted(now))

    async def _fail_unhosted(self, now: float) -> None:
        assert self.hosts is not None
        roots = [r for r in self.index.runs.values() if r.parent_id is None and r.status == RunStatus.RUNNING]
        for root in await self.hosts.unhosted(roots, now):
            error = AgentNotFoundError(root.agent_id, registered=True)
            ending = Ending(RunStatus.FAILED, "no_host", error.to_wire(), reason=str(error))
            await self._guard("no host", root.run_id, self.engine.end_tree(root.run_id, ending))

    async def _stale_spawn(self, child: RunRecord) -> None:
        """A spawn whose replica died before answering, and that its spawner never retried (a retry with
        the same child id would have finished the admission): nobody will ever send the child work, so
        an admitted one fails and frees its slot, an unadmitted one is removed."""
        tree = await self.engine.store.get_tree(child.root_id)
        found = await self.engine.store.get_run(child.run_id)
        if found is None or found[0].status != RunStatus.PENDING or found[0].retry_at is not None:
            return
        if tree is not None and child.run_id in tree[0].active:
            await self.engine.abandon_spawn(found[0])
        else:
            await self.engine.store.delete_run(child.run_id, found[1])

    async def _release_ended(self, root_id: str, run_ids: list[str], now: float) -> None:
        ended: list[str] = []
        for run_id in run_ids:
            found = await self.engine.store.get_run(run_id)
            if found is None or (
                found[0].status in TERMINAL and now - found[0].updated_at >= self.config.close_grace_s
            ):
                ended.append(run_id)
        if ended:
            await self.engine.release_slots(root_id, ended)

    async def _close(self, root_id: str, now: float) -> None:
        found = await self.engine.store.get_run(root_id)
        if found is None:
            return
        root = found[0]
        if root.status in TERMINAL and now - root.updated_at >= self.config.close_grace_s:
            await self.engine.close_tree(root)
