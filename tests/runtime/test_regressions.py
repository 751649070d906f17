"""Regression tests for runtime bugs found in review (each was reproduced by a script, then fixed).

1. A partition that leaves a worker and comes back must not find that worker's cached, stale activation.
2. A commit that fails (checkpoint over max_payload) keeps per-key FIFO and ends as a typed error after a
   bounded number of attempts, instead of letting the key's next message overtake it and looping forever.
3. A message id holding '.' gets its reply (the id must not leak unescaped into a subject).
4. Spawning a type nobody hosts never takes a spawn slot: AgentNotFoundError each time, never SpawnDenied.

Waits are deadline-bound polls of cross-process state (leases, consumers, streams) or awaited replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from plexus.core import AgentId, BaseBlock, KernelError, SpawnBudget, TextBlock
from plexus.runtime import Agent, App, Context, NatsServer, PayloadTooLargeError, Runtime
from plexus.runtime.client._cluster import ServiceUnavailableError
from plexus.runtime.store._consumer_records import ConsumerRecords
from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.wire._subjects import inbox_partition, lease_key

from .conftest import REPO, StartWorker

WAIT_S = 20.0
SEND_TIMEOUT_S = 20.0


async def _eventually(probe: Callable[[], Awaitable[bool]], what: str, timeout: float = WAIT_S) -> None:
    """Poll cross-process state that has no event to await, until `probe` holds or the deadline passes."""
    try:
        async with asyncio.timeout(timeout):
            while not await probe():  # noqa: ASYNC110 - state lives in other connections/processes
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


async def _owners(rt: Runtime, agent_type: str) -> dict[int, str]:
    """partition -> worker id of every held lease of `agent_type`."""
    holders = await LeaseManager(rt.topology.leases, "test-observer", 3.0).holders()
    keys = {lease_key(rt.namespace, agent_type, p): p for p in range(rt.partitions)}
    return {keys[k]: owner for k, owner in holders.items() if k in keys}


async def _all_partitions_held(rt: Runtime, agent_type: str) -> None:
    async def held() -> bool:
        return len(await _owners(rt, agent_type)) == rt.partitions

    await _eventually(held, f"every {agent_type} partition leased")


async def _inbox_last_seq(rt: Runtime) -> int:
    info = await rt.js.stream_info(rt.topology.names.inbox_stream)
    assert info.state is not None
    return info.state.last_seq


async def _send_in_order(rt: Runtime, first: Awaitable[list[BaseBlock]]) -> asyncio.Task[list[BaseBlock]]:
    """Start the send `first`; return once its message is in the inbox stream, so a later send follows it."""
    before = await _inbox_last_seq(rt)
    task = asyncio.ensure_future(first)

    async def published() -> bool:
        if task.done():
            return True  # answered (or failed) already: surely published
        return await _inbox_last_seq(rt) > before

    await _eventually(published, "the first message to reach the inbox stream")
    return task


def _text(blocks: list[BaseBlock]) -> str:
    assert len(blocks) == 1, blocks
    return str(getattr(blocks[0], "text", ""))


# -- 1. stale activation after a partition comes back ---------------------------------------------------


async def test_partition_returning_to_a_worker_reloads_state_instead_of_using_its_stale_cache(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Old behaviour: wa kept key's activation (n=1) cached while wb ran message 2; when the partition came
    back, message 3 ran on n=1 (handler saw n=2), its commit was fenced, message 4 was answered first and
    message 3 ran again after a redelivery."""
    rt = runtime
    runs: list[tuple[str, int]] = []
    app = App()

    @app.agent("ctr")
    class Ctr(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            n = int(self.state.get("n", 0)) + 1
            self.state["n"] = n
            runs.append((_text(blocks), n))
            return [TextBlock(text=str(n))]

    await start_worker(app, worker_id="wa")
    await _all_partitions_held(rt, "ctr")
    # One key per partition, all activated on wa: whichever partitions wb takes, one of these moves.
    keys: dict[int, str] = {}
    for i in range(1000):
        keys.setdefault(inbox_partition(f"k{i}", rt.partitions), f"k{i}")
        if len(keys) == rt.partitions:
            break

    def send(key: str, text: str) -> Awaitable[list[BaseBlock]]:
        return rt.send_message([TextBlock(text=text)], AgentId("ctr", key), timeout=SEND_TIMEOUT_S)

    firsts = await asyncio.gather(*(send(k, "1") for k in keys.values()))
    assert [_text(r) for r in firsts] == ["1"] * rt.partitions

    wb = await start_worker(app, worker_id="wb")

    async def wb_holds_some() -> bool:
        return "wb" in (await _owners(rt, "ctr")).values()

    await _eventually(wb_holds_some, "wb to take partitions")
    partition = next(p for p, owner in sorted((await _owners(rt, "ctr")).items()) if owner == "wb")
    key = keys[partition]
    runs.clear()
    assert _text(await send(key, "2")) == "2"
    assert runs == [("2", 2)]  # wb ran it (state reloaded from wa's checkpoint)

    await wb.stop(drain_timeout=5)

    async def back_on_wa() -> bool:
        return (await _owners(rt, "ctr")).get(partition) == "wa"

    await _eventually(back_on_wa, f"partition {partition} back on wa")
    t3 = await _send_in_order(rt, send(key, "3"))
    r4 = await send(key, "4")
    assert _text(await t3) == "3"
    assert _text(r4) == "4"
    # Each message ran exactly once, in order, on the state committed by the other worker.
    assert runs == [("2", 2), ("3", 3), ("4", 4)]


# -- 2. a failed commit keeps FIFO and ends --------------------------------------------------------------


async def test_failed_commit_keeps_fifo_and_ends_as_typed_error_after_bounded_attempts(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Old behaviour: 'big' (whose checkpoint exceeds max_payload) stayed unacked, 'second' overtook it and
    was acked first, then 'big' was redelivered forever (max_deliver=-1), re-running the handler each time."""
    rt = runtime
    calls: list[str] = []
    app = App()

    @app.agent("acc")
    class Acc(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            text = _text(blocks)
            calls.append(text)
            if text == "big":
                self.state["blob"] = "x" * 2_000_000  # the checkpoint cannot fit: the commit fails
            seen = self.state.setdefault("seen", [])
            seen.append(text)
            return [TextBlock(text=",".join(seen))]

    await start_worker(app, ack_wait_s=1.0)
    await _all_partitions_held(rt, "acc")
    agent = AgentId("acc", "k")

    def send(text: str) -> Awaitable[list[BaseBlock]]:
        return rt.send_message([TextBlock(text=text)], agent, timeout=SEND_TIMEOUT_S)

    big = await _send_in_order(rt, send("big"))
    second = await send("second")
    with pytest.raises(PayloadTooLargeError):
        await big
    assert _text(second) == "second"  # 'big' never committed
    attempts = calls.count("big")
    assert 1 <= attempts <= 5, calls
    assert calls == ["big"] * attempts + ["second"], calls  # every attempt of 'big' ran before 'second'

    # Both messages end acked: nothing left to redeliver, so the handler never runs again.
    stream = rt.topology.names.inbox_stream
    partition = inbox_partition("k", rt.partitions)
    durable, _ = await ConsumerRecords(rt.topology.consumers, rt.namespace).read("acc", partition)
    assert durable is not None

    async def drained() -> bool:
        info = await rt.js.consumer_info(stream, durable)
        return (info.num_ack_pending, info.num_pending) == (0, 0)

    await _eventually(drained, "the acc consumer to have nothing pending")
    dead = await rt.js.get_last_msg(rt.topology.names.dlq_stream, rt.subjects.dlq("acc"))
    assert dead.headers is not None
    assert dead.headers["Plexus-Dlq-Reason"] == "commit_failed"
    assert calls == ["big"] * attempts + ["second"], calls


# -- 3. message ids with '.' ------------------------------------------------------------------------------


async def test_message_id_with_dot_gets_its_reply(runtime: Runtime, start_worker: StartWorker) -> None:
    """Old behaviour: 'order.42' was handled but its reply never reached the caller (a timeout)."""
    rt = runtime
    ran: list[str] = []
    app = App()

    @app.agent("echo")
    class Echo(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            ran.append(ctx.message_id)
            return [TextBlock(text=ctx.message_id)]

    await start_worker(app)
    await _all_partitions_held(rt, "echo")
    for mid in ("order-42", "order.42", "a.b.c"):
        reply = await rt.send_message(
            [TextBlock(text="x")], AgentId("echo", "k"), timeout=SEND_TIMEOUT_S, message_id=mid
        )
        assert _text(reply) == mid
    assert ran == ["order-42", "order.42", "a.b.c"]


# -- 4. spawning an unhosted type ------------------------------------------------------------------------


@pytest.fixture
def orchestrator_process(nats_server: NatsServer, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`plexus orchestrator` as a real process (killed by PID at teardown)."""
    log = (tmp_path / "orchestrator.log").open("wb")
    cmd = [sys.executable, "-m", "plexus.runtime.cli", "orchestrator", "--nats", nats_server.url]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()


async def test_spawning_an_unhosted_type_never_takes_a_spawn_slot(
    runtime: Runtime, orchestrator_process: subprocess.Popen[bytes], start_worker: StartWorker
) -> None:
    """Old behaviour: each spawn of 'nohost' was admitted (a slot taken) before the child message failed
    with AgentNotFoundError; the slot was never given back, so the 4th spawn (max_agents=3) was denied
    (SpawnDenied) with nothing running."""
    pytest.importorskip("plexus.orchestrator")
    rt = runtime
    app = App()

    @app.agent("parent")
    class Parent(Agent):
        async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
            out: list[str] = []
            for i in range(4):
                # Short: a send to an unhosted type waits this long for a host before AgentNotFoundError.
                try:
                    await ctx.spawn(AgentId("nohost", f"c{i}"), [TextBlock(text="hi")], timeout=1.0)
                    out.append("ok")
                except KernelError as exc:
                    out.append(type(exc).__name__)
            return [TextBlock(text=json.dumps(out))]

    await start_worker(app)
    await _all_partitions_held(rt, "parent")

    async def orchestrator_answers() -> bool:
        assert orchestrator_process.poll() is None, "orchestrator exited"
        try:
            await rt.get_run("run_probe")
        except ServiceUnavailableError:
            return False
        except KernelError:
            return True  # a typed "unknown run" answer: the service is up
        return True

    await _eventually(orchestrator_answers, "the orchestrator to answer")
    run_id = await rt.start_run(
        AgentId("parent", "p"),
        [TextBlock(text="go")],
        spawn_budget=SpawnBudget(max_agents=3, allow_preempt=False),
    )
    result = await rt.run_result(run_id, timeout=30.0)
    assert json.loads(_text(result)) == ["AgentNotFoundError"] * 4
