"""A passivation round that drops many activations rebuilds the activation table at its new size: a dict
never shrinks, and after a burst of keys it stayed sized for the peak. It also empties the per-key caches
(parsed ids, checkpoint keys), which otherwise kept the burst's last keys and, with them, the allocator's
arenas the burst filled."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.core._identity import _parse_agent_id
from plexus.core._ids import parsed_run_id
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.wire._subjects import checkpoint_key
from plexus.runtime.worker._upkeep import _COMPACT_AFTER
from tests.runtime.conftest import StartWorker


class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return blocks


async def _burst(runtime: Runtime, agent_type: str, n: int) -> None:
    sem = asyncio.Semaphore(100)

    async def send(i: int) -> None:
        async with sem:
            await runtime.send_message([TextBlock(text="hi")], AgentId(agent_type, f"k{i}"), timeout=30)

    await asyncio.gather(*(send(i) for i in range(n)))


async def test_a_large_passivation_round_shrinks_the_activation_table(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    app = App()
    app.register("echo", lambda _id: Echo(), durable=False)
    worker = await start_worker(app, idle_passivate_s=3600.0)
    n = _COMPACT_AFTER + 50
    await _burst(runtime, "echo", n)
    table = worker._activations
    assert len(table) == n
    peak_size = sys.getsizeof(table._live)

    worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=0.0)
    await worker._upkeep.passivate()
    assert len(table) == 0
    # Sized for what is left (nothing), not for the n activations it held.
    assert sys.getsizeof(table._live) <= sys.getsizeof({}) < peak_size


async def test_a_large_passivation_round_empties_the_per_key_caches_which_then_refill(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    caches = {"agent ids": _parse_agent_id, "checkpoint keys": checkpoint_key, "run ids": parsed_run_id}
    app = App()
    app.register("durable-echo", lambda _id: Echo())  # durable: its commits parse the run ids too
    worker = await start_worker(app, idle_passivate_s=3600.0)
    await _burst(runtime, "durable-echo", _COMPACT_AFTER + 50)
    assert all(c.cache_info().currsize > 0 for c in caches.values())

    worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=0.0)
    await worker._upkeep.passivate()
    assert len(worker._activations) == 0
    assert {name: c.cache_info().currsize for name, c in caches.items()} == dict.fromkeys(caches, 0)

    # A passivated key comes back from its checkpoint, and the caches fill again.
    worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=3600.0)
    reply = await runtime.send_message([TextBlock(text="again")], AgentId("durable-echo", "k7"), timeout=30)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["again"]
    assert all(c.cache_info().currsize > 0 for c in caches.values())
