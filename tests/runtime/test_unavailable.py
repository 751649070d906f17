"""A message whose commit fails because the cluster does not answer (a leader election, a lost node, here a
frozen nats-server) waits in place and completes once the cluster is back: it is neither dead-lettered nor
overtaken. Before, three quick attempts (under a second apart) ran out during the outage and the message
was dead-lettered as `commit_failed`: seen on a 3-node cluster whose node was killed mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import nats.js.errors
import pytest

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context, NatsServer, Runtime, Worker, WorkerConfig

from .conftest import StartWorker


def _text(blocks: list[BaseBlock]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)


async def _long_leases(server: NatsServer) -> None:
    """The operator sets a 60 s lease TTL (workers adopt the bucket's): the outage must not cost the lease."""
    operator = await Runtime.connect(server.url, lease_ttl_s=60.0, heartbeat_ttl_s=3.0, replicas=1)
    await operator.close()


async def test_a_commit_during_an_outage_waits_for_the_cluster_and_is_not_dead_lettered(
    runtime: Runtime, start_worker: StartWorker, nats_server: NatsServer
) -> None:
    rt = runtime
    entered = asyncio.Event()
    app = App()

    @app.agent("patient")
    class Patient(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            self.state["seen"] = [*self.state.get("seen", []), _text(blocks)]
            entered.set()
            await asyncio.sleep(0.3)  # the server freezes before this handler commits
            return [TextBlock(text=",".join(self.state["seen"]))]

    await _long_leases(nats_server)
    await start_worker(app, lease_ttl_s=60.0)
    agent = AgentId("patient", "k")
    assert _text(await rt.send_message([TextBlock(text="warm")], agent, timeout=20)) == "warm"
    entered.clear()
    first = asyncio.ensure_future(rt.send_message([TextBlock(text="a")], agent, timeout=90))
    await asyncio.wait_for(entered.wait(), 20)
    assert nats_server.pid is not None
    # Frozen for longer than three commit timeouts (5 s each) plus the old backoff: the old worker gave up.
    os.kill(nats_server.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(17)
    finally:
        os.kill(nats_server.pid, signal.SIGCONT)
    second = await rt.send_message([TextBlock(text="b")], agent, timeout=60)
    assert _text(await first) == "warm,a"  # committed once, answered after the outage
    assert _text(second) == "warm,a,b"  # and not overtaken by the next message of its key
    with pytest.raises(nats.js.errors.NotFoundError):
        await rt.js.get_last_msg(rt.topology.names.dlq_stream, rt.subjects.dlq("patient"))


async def test_a_handler_that_meets_an_outage_through_its_context_runs_again_instead_of_failing(
    runtime: Runtime, start_worker: StartWorker, nats_server: NatsServer
) -> None:
    """Its progress publish gets no answer while the server is frozen: before, the handler's nats timeout
    was committed as its answer (a HandlerError the caller could not tell from a bug in the handler)."""
    rt = runtime
    entered = asyncio.Event()
    runs: list[str] = []
    app = App()

    @app.agent("reporter")
    class Reporter(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            runs.append(_text(blocks))
            entered.set()
            await asyncio.sleep(0.5)  # the server freezes here
            await ctx.emit_progress("thinking", [TextBlock(text="half way")])
            return [TextBlock(text="reported " + _text(blocks))]

    await _long_leases(nats_server)
    await start_worker(app, lease_ttl_s=60.0)
    agent = AgentId("reporter", "k")
    assert _text(await rt.send_message([TextBlock(text="warm")], agent, timeout=20)) == "reported warm"
    entered.clear()
    pending = asyncio.ensure_future(rt.send_message([TextBlock(text="x")], agent, timeout=90))
    await asyncio.wait_for(entered.wait(), 20)
    assert nats_server.pid is not None
    os.kill(nats_server.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(8)
    finally:
        os.kill(nats_server.pid, signal.SIGCONT)
    assert _text(await pending) == "reported x"
    assert runs.count("x") >= 2  # it ran again after the outage: the first run's failure was not its answer


async def test_a_worker_started_while_the_cluster_does_not_answer_waits_for_it_instead_of_dying(
    runtime: Runtime, nats_server: NatsServer
) -> None:
    """The server is frozen across `Worker.start` for longer than a JetStream request's timeout (5 s): the
    type registration, heartbeat and first lease creates time out. Before, `start` raised (a worker process
    died at start on a loaded CI machine, leaving its partitions unserved); now it waits for the cluster, as
    every other step of a worker does, and serves once it answers."""
    app = App()

    @app.agent("late")
    class Late(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            return [TextBlock(text="served " + _text(blocks))]

    await _long_leases(nats_server)
    worker_rt = await Runtime.connect(nats_server.url, lease_ttl_s=60.0, heartbeat_ttl_s=3.0)
    worker = Worker(app, worker_rt, WorkerConfig(lease_ttl_s=60.0, heartbeat_s=0.5))
    assert nats_server.pid is not None
    os.kill(nats_server.pid, signal.SIGSTOP)
    try:
        starting = asyncio.ensure_future(worker.start())
        await asyncio.sleep(7)
    finally:
        os.kill(nats_server.pid, signal.SIGCONT)
    try:
        await asyncio.wait_for(starting, 60)
        reply = await runtime.send_message([TextBlock(text="x")], AgentId("late", "k"), timeout=30)
        assert _text(reply) == "served x"
    finally:
        with contextlib.suppress(Exception):
            await worker.stop(drain_timeout=5)
        await worker_rt.close()


async def test_a_slow_first_round_renews_the_leases_it_already_took(
    runtime: Runtime, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`start`'s first round takes one type's partitions, then the second type's rebalance takes longer than
    a lease TTL (3 s here; consumer creations during an election can). The leases already taken are renewed
    meanwhile (`_keep_leases` runs from before the round): once started, the worker still holds them, fresh,
    and serves their keys at once. Before, renewals began after the round and those leases had lapsed."""
    from plexus.runtime.worker._partitions import PartitionOwner

    app = App()

    @app.agent("first")
    class First(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            return [TextBlock(text="first " + _text(blocks))]

    @app.agent("second")
    class Second(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            return [TextBlock(text="second " + _text(blocks))]

    real_rebalance = PartitionOwner.rebalance
    slowed: list[float] = []

    async def rebalance(self: PartitionOwner) -> None:
        await real_rebalance(self)
        if self.agent_type == "second" and not slowed:
            slowed.append(time.monotonic())
            await asyncio.sleep(5.0)  # > the 3 s lease TTL, after both types' first acquisitions

    monkeypatch.setattr(PartitionOwner, "rebalance", rebalance)
    worker = await start_worker(app)
    assert slowed, "the second type's first rebalance did not run in start"
    first = worker._owners["first"]
    assert first.owned, "the first type took no partition"
    now = time.monotonic()
    stale = sorted(p for p in first.owned if not first.may_start(p))
    assert stale == [], (
        f"leases of partitions {stale} lapsed during the slow first round ({now - slowed[0]:.1f} s)"
    )
    reply = await runtime.send_message([TextBlock(text="x")], AgentId("first", "k"), timeout=10)
    assert _text(reply) == "first x"
