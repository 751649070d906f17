"""`make chaos`: a seeded fault schedule against a real 3-node R3 cluster under load, then an invariant check.

Load: `keys` ledger agents, each sent numbered messages one after another (a retry reuses the message id,
so the inbox stream keeps one copy), plus a forest of orchestrated run trees, some meant to exceed their
token budget. Faults: see `faults.py`, one at a time, every `fault_every_s`. The checker (`checker.py`)
then reads the agents' committed state, their EventLogs, their execution records and the run records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local.netns import Network

from plexus.core import AgentId, ExecutionBudget, KernelError, MessageId, SpawnBudget, TextBlock
from plexus.runtime import Runtime

from .checker import Report, check
from .faults import Fault, Fleet

TREE_LEAVES, TREE_STEPS, TREE_TOKENS = 3, 3, 10


@dataclass
class Load:
    """What the clients did: per key, when each numbered message was answered; the runs started."""

    answered: dict[str, dict[int, float]] = field(default_factory=dict)
    unanswered: dict[str, list[int]] = field(default_factory=dict)
    runs: dict[str, int | None] = field(default_factory=dict)  # run id -> its token budget (None: none)
    sends: int = 0
    #: Errors the clients saw (then retried), by type: what an application would have to handle.
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, exc: Exception) -> None:
        name = getattr(exc, "error_type", None) or type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


async def chaos(
    seed: int,
    duration_s: float,
    workdir: Path,
    *,
    keys: int = 20,
    fault_every_s: float = 8.0,
    schedule: list[str] | None = None,
    netns: bool = False,
) -> Report:
    """One run: load for `duration_s` with a fault every `fault_every_s` (kinds drawn with `seed`, or the
    given `schedule`), then the check."""
    rng = random.Random(seed)
    fleet = Fleet(workdir, network=Network("pxk", "10.77.2.0/24") if netns else None)
    load = Load()
    faults: list[Fault] = []
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(fleet.stop)  # also after a start that failed half way (hosts left behind otherwise)
        fleet.start()
        admin = await Runtime.connect(fleet.cluster.urls, replicas=3)
        stack.push_async_callback(admin.close)
        client = await Runtime.connect(fleet.cluster.urls)
        stack.push_async_callback(client.close)
        await _ready(client)
        stop_at = time.monotonic() + duration_s
        senders = [asyncio.create_task(_send_numbers(client, f"k{i}", stop_at, load)) for i in range(keys)]
        trees = asyncio.create_task(_start_trees(client, stop_at, load, rng))
        kinds = schedule or [rng.choice(fleet.kinds) for _ in range(int(duration_s // fault_every_s))]
        for kind in kinds:
            await asyncio.sleep(min(fault_every_s / 2, max(0.0, stop_at - time.monotonic())))
            if time.monotonic() >= stop_at:
                break
            faults.append(await fleet.inject(kind, rng, admin))
            await asyncio.sleep(max(0.0, min(fault_every_s / 2, stop_at - time.monotonic())))
        await asyncio.gather(*senders, trees)
        return await check(client, admin, workdir, load, faults, seed, duration_s)
    raise AssertionError("unreachable")  # AsyncExitStack may swallow exceptions as far as mypy knows


async def _ready(rt: Runtime) -> None:
    async with asyncio.timeout(60):
        while True:
            try:
                workers = await rt.workers("ledger")
                await rt.get_run("run_01ARZ3NDEKTSV4RRFFQ69G5FAV")
            except KernelError as exc:
                if exc.error_type == "ServiceUnavailableError":
                    await asyncio.sleep(0.2)
                    continue
                if len(workers) >= 3:
                    return
            await asyncio.sleep(0.2)


async def _send_numbers(rt: Runtime, key: str, stop_at: float, load: Load, timeout: float = 30) -> None:
    """Send 1, 2, 3... to ledger/key, each until answered (bounded), until `stop_at`. `timeout` is each
    message's deadline: one that a fault outlasts is answered CancellationError("deadline") on every retry
    of its id, so a fault longer than it needs a longer one."""
    answered = load.answered.setdefault(key, {})
    agent = AgentId("ledger", key)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        message_id = str(MessageId.new())
        give_up = time.monotonic() + 180
        while True:
            load.sends += 1
            try:
                await rt.send_message(
                    [TextBlock(text=json.dumps({"n": n}))], agent, timeout=timeout, message_id=message_id
                )
                answered[n] = time.time()
                break
            except Exception as exc:  # typed or not, the message is retried with its id
                load.error(exc)
                if time.monotonic() > give_up:
                    load.unanswered.setdefault(key, []).append(n)
                    return  # later numbers would be out of order behind it: stop this key
                await asyncio.sleep(0.2)


async def _start_trees(rt: Runtime, stop_at: float, load: Load, rng: random.Random) -> None:
    """A run tree every ~1.5 s; one in four with a token budget it must exceed."""
    i = 0
    while time.monotonic() < stop_at:
        i += 1
        over = rng.random() < 0.25
        budget = TREE_LEAVES * TREE_STEPS * TREE_TOKENS // 2 if over else None
        cmd = {"leaves": TREE_LEAVES, "leaf": {"steps": TREE_STEPS, "tokens": TREE_TOKENS}}
        run_id = f"run_{MessageId.new().split('_', 1)[1]}"
        for _ in range(100):
            try:
                await rt.start_run(
                    AgentId("forest", f"t{i}"),
                    [TextBlock(text=json.dumps(cmd))],
                    budget=ExecutionBudget(max_tokens=budget) if budget else None,
                    spawn_budget=SpawnBudget(max_agents=TREE_LEAVES + 1),
                    run_id=run_id,
                )
                load.runs[run_id] = budget
                break
            except KernelError:
                await asyncio.sleep(0.3)
        await asyncio.sleep(1.5)
