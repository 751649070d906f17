"""A passivation round that drops many activations rebuilds the activation table at its new size: a dict
never shrinks, and after a burst of keys it stayed sized for the peak."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.worker._upkeep import _COMPACT_AFTER
from tests.runtime.conftest import StartWorker


class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return blocks


async def test_a_large_passivation_round_shrinks_the_activation_table(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    app = App()
    app.register("echo", lambda _id: Echo(), durable=False)
    worker = await start_worker(app, idle_passivate_s=3600.0)
    n = _COMPACT_AFTER + 50
    sem = asyncio.Semaphore(100)

    async def send(i: int) -> None:
        async with sem:
            await runtime.send_message([TextBlock(text="hi")], AgentId("echo", f"k{i}"), timeout=30)

    await asyncio.gather(*(send(i) for i in range(n)))
    table = worker._activations
    assert len(table) == n
    peak_size = sys.getsizeof(table._live)

    worker._upkeep.config = dataclasses.replace(worker._upkeep.config, idle_passivate_s=0.0)
    await worker._upkeep.passivate()
    assert len(table) == 0
    # Sized for what is left (nothing), not for the n activations it held.
    assert sys.getsizeof(table._live) <= sys.getsizeof({}) < peak_size
