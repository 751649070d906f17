"""End-to-end failover: real nats-server, real `plexus worker` processes, SIGKILL / SIGTERM.

What is checked is the delivery contract of docs/architecture.md ("Delivery and single activation"):
no message is lost when a worker dies; a key's checkpointed state only ever holds committed messages, each
once, in the order they were sent; a handler runs twice only when the worker running it died; a graceful
stop finishes its in-flight work; a long handler is kept alive instead of redelivered; partitions spread
over the live workers and come back to the survivor.

Every invocation of a test handler is recorded durably before it does anything (see `apps_failover`), so
the test can tell "ran twice" from "answered twice". Waits are deadline-bound polls of the lease and worker
buckets, or awaited replies; nothing asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.js import api as js_api

from plexus.core import AgentId, AgentProgress, MessageId, RunMessageReceived, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.client._supervisor import new_root_run
from plexus.runtime.store._consumer_records import ConsumerRecords
from plexus.runtime.store._leases import LeaseManager
from plexus.runtime.wire._envelope import RunInfo
from plexus.runtime.wire._subjects import consumer_name, inbox_partition, lease_key
from plexus.runtime.worker._partitions import _Puller

from .apps_failover import KILL_FILE_ENV
from .apps_failover import app as ledger_app
from .conftest import StartWorker, WorkerProcess

APP = "tests.runtime.apps_failover:app"
SLOW_APP = "tests.runtime.apps_failover:slow_app"
#: The fixture's workers use a 3 s lease TTL; their liveness TTL must match the test client's (conftest FAST).
FAST_WORKER = ("--heartbeat-ttl", "3")
#: Generous: failover takes a lease TTL plus a maintenance round, on a shared 2-core machine.
SEND_TIMEOUT_S = 60.0
WAIT_S = 30.0


# -- helpers ------------------------------------------------------------------------------------------


def _reply(blocks: list[Any]) -> dict[str, Any]:
    assert len(blocks) == 1, blocks
    decoded: dict[str, Any] = json.loads(blocks[0].text)
    return decoded


def _logs(tmp_path: Path) -> str:
    parts = [
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("worker*.log"))
    ]
    return "\n".join(parts)


async def _eventually(
    probe: Callable[[], Awaitable[tuple[bool, Any]]],
    what: str,
    procs: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    timeout: float = WAIT_S,
) -> Any:
    """Poll `probe` (-> (done, observed)) until done; fail with the last observation and worker logs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        done, observed = await probe()
        if done:
            return observed
        for proc in procs:
            assert proc.poll() is None, f"worker {proc.pid} exited ({proc.returncode})\n{_logs(tmp_path)}"
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last seen {observed!r}\n{_logs(tmp_path)}")
        await asyncio.sleep(0.1)


async def _owners(rt: Runtime, agent_type: str) -> dict[int, str]:
    """partition -> worker id of every held lease of `agent_type`."""
    holders = await LeaseManager(rt.topology.leases, "test-observer", 3.0).holders()
    keys = {lease_key(rt.namespace, agent_type, p): p for p in range(rt.partitions)}
    return {keys[k]: owner for k, owner in holders.items() if k in keys}


def _spread(rt: Runtime, agent_type: str, *expected: str) -> Callable[[], Awaitable[tuple[bool, Any]]]:
    """Probe: every partition is held, by exactly the workers `expected`, in fair shares (±1)."""

    async def probe() -> tuple[bool, Any]:
        owners = await _owners(rt, agent_type)
        counts = Counter(owners.values())
        done = (
            len(owners) == rt.partitions
            and set(counts) == set(expected)
            and max(counts.values()) - min(counts.values()) <= 1
        )
        return done, dict(counts)

    return probe


async def _invocations(rt: Runtime, run: RunInfo) -> list[AgentProgress]:
    """Every handler invocation recorded under `run` (its progress events), in stream order."""
    stream = rt.topology.names.progress_stream
    sub = await rt.js.pull_subscribe(
        rt.subjects.progress_tree(run.root_id),
        stream=stream,
        config=js_api.ConsumerConfig(
            ack_policy=js_api.AckPolicy.NONE, deliver_policy=js_api.DeliverPolicy.ALL, inactive_threshold=10.0
        ),
    )
    try:
        remaining = (await sub.consumer_info()).num_pending or 0
        events: list[AgentProgress] = []
        while remaining > 0:
            msgs = await sub.fetch(min(remaining, 500), timeout=10.0)
            events += [AgentProgress.model_validate_json(m.data) for m in msgs]
            remaining -= len(msgs)
        return events
    finally:
        await sub.unsubscribe()


async def _send(rt: Runtime, agent_type: str, key: str, text: str, run: RunInfo) -> dict[str, Any]:
    blocks = await rt.send_message(
        [TextBlock(text=text)], AgentId(agent_type, key), timeout=SEND_TIMEOUT_S, run=run
    )
    return _reply(blocks)


async def _start_workers(
    worker_process: WorkerProcess,
    rt: Runtime,
    tmp_path: Path,
    app: str,
    agent_type: str,
    *ids: str,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start one worker per id, one after the other, and wait until they share the partitions fairly."""
    procs: list[subprocess.Popen[bytes]] = []
    for n, worker_id in enumerate(ids):
        procs.append(worker_process(app, "--worker-id", worker_id, *FAST_WORKER, *extra, env=env))
        live = ids[: n + 1]
        await _eventually(_spread(rt, agent_type, *live), f"fair spread over {live}", procs, tmp_path)
    return procs


def _keys_of_both(rt: Runtime, owners: dict[int, str], n: int) -> list[str]:
    """`n` keys covering the partitions of every owner (so a kill always strands some keys)."""
    keys = [f"k{i:03d}" for i in range(n)]
    hit = {owners[inbox_partition(k, rt.partitions)] for k in keys}
    assert hit == set(owners.values()), f"keys {keys} miss a worker: {hit}"
    return keys


# -- 1. SIGKILL mid-handler -----------------------------------------------------------------------------

KEYS = 20
PER_KEY = 50


@pytest.mark.parametrize("mode", ["fifo", "all_in_flight"])
async def test_sigkill_mid_handler_loses_nothing_and_keeps_per_key_order(
    mode: str, runtime: Runtime, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    """1,000 messages over 20 keys; one of two workers is SIGKILLed inside its invocation ~30 % into its own.

    ``fifo``: each key's messages are sent one after the other (the per-key FIFO contract: a sender awaits
    a send before the next one to the same key; 20 sends in flight), so each key's state must be exactly
    1..n in order after every reply. ``all_in_flight``: all 1,000 sends at once. Two concurrent sends to one
    key have no defined order between them, so only "every seq exactly once" is asserted per key there.
    """
    rt = runtime
    kill_file = tmp_path / "kill"
    env = {KILL_FILE_ENV: str(kill_file)}
    procs = await _start_workers(worker_process, rt, tmp_path, APP, "ledger", "wa", "wb", env=env)
    victim, survivor = procs
    owners = await _owners(rt, "ledger")
    keys = _keys_of_both(rt, owners, KEYS)
    # The victim kills itself inside its own invocation number ~30 % of its share (apps_failover): timed
    # by the replies this process reads, the kill could come after the victim had answered all of its keys.
    victim_share = PER_KEY * sum(owners[inbox_partition(k, rt.partitions)] == "wa" for k in keys)
    kill_file.write_text(f"{victim.pid} {max(1, victim_share * 3 // 10)}")
    run = new_root_run()
    replies: dict[tuple[str, int], dict[str, Any]] = {}

    async def one(key: str, seq: int) -> None:
        reply = await _send(rt, "ledger", key, str(seq), run)
        replies[key, seq] = reply
        if mode == "fifo":
            # Whoever answered (the first handler, or the checkpoint after a redelivery), the state it
            # reports holds each earlier message exactly once and in send order.
            assert reply["state"]["seen"] == list(range(1, seq + 1)), (key, seq, reply)

    async def sequential(key: str) -> None:
        for seq in range(1, PER_KEY + 1):
            await one(key, seq)

    if mode == "fifo":
        senders = [sequential(k) for k in keys]
    else:
        senders = [one(k, s) for s in range(1, PER_KEY + 1) for k in keys]
    try:
        async with asyncio.timeout(SEND_TIMEOUT_S + 30):
            await asyncio.gather(*senders)  # every send returns: none lost
    except Exception as exc:
        raise AssertionError(f"{len(replies)} answered\n{_logs(tmp_path)}") from exc
    assert len(replies) == KEYS * PER_KEY
    assert await asyncio.to_thread(victim.wait, 10) == -signal.SIGKILL

    # The survivor took every partition over and answers from the checkpointed state.
    await _eventually(_spread(rt, "ledger", "wb"), "survivor owning all", [survivor], tmp_path)
    for key in keys:
        state = (await _send(rt, "ledger", key, "read", run))["state"]
        if mode == "fifo":
            assert state["seen"] == list(range(1, PER_KEY + 1)), key
        else:
            assert sorted(state["seen"]) == list(range(1, PER_KEY + 1)), key

    # Failover happened: the victim answered some keys before the kill, the survivor finished them.
    pids_of = defaultdict(set)
    for (key, _), reply in replies.items():
        pids_of[key].add(reply["pid"])
    assert any(pids == {victim.pid, survivor.pid} for pids in pids_of.values()), dict(pids_of)

    # At least once, and twice only where the first run died with the victim.
    runs: dict[tuple[str, int], list[int]] = defaultdict(list)
    for event in await _invocations(rt, run):
        seq, pid = event.metadata["seq"], event.metadata["pid"]
        assert isinstance(seq, int), event.metadata
        assert isinstance(pid, int), event.metadata
        runs[AgentId.parse(event.agent_id).key, seq].append(pid)
    assert set(runs) == {(k, s) for k in keys for s in range(1, PER_KEY + 1)}
    for message, pids in runs.items():
        assert all(pid == victim.pid for pid in pids[:-1]), (message, pids)


# -- 2. graceful SIGTERM --------------------------------------------------------------------------------


async def test_sigterm_finishes_in_flight_work_and_hands_over(
    runtime: Runtime, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    """In-flight handlers (one of them longer than the lease TTL) complete on the stopping worker, which
    exits 0; messages sent meanwhile are handled once, by the next worker."""
    rt = runtime
    (first,) = await _start_workers(worker_process, rt, tmp_path, SLOW_APP, "slow", "wa")
    run = new_root_run()
    durations = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "long": 6.5}  # "long" outlives two 3 s lease TTLs
    before = [asyncio.create_task(_send(rt, "slow", k, f"sleep {s}", run)) for k, s in durations.items()]

    async def all_started() -> tuple[bool, Any]:
        started = await _invocations(rt, run)
        return len(started) >= len(durations), len(started)

    await _eventually(all_started, "every handler running", [first], tmp_path)
    first.send_signal(signal.SIGTERM)
    second = worker_process(SLOW_APP, "--worker-id", "wb", *FAST_WORKER)
    async with asyncio.timeout(SEND_TIMEOUT_S):
        # The short handlers end ~1 s after the SIGTERM, long after "wa" stopped pulling (which it does
        # first, within milliseconds), so whatever is sent from here on cannot have been fetched by "wa".
        short = await asyncio.gather(*before[:-1])
        after = [asyncio.create_task(_send(rt, "slow", k, "sleep 0.1", run)) for k in (*durations, "e", "f")]
        finished = [*short, await before[-1]]
        later = await asyncio.gather(*after)
    assert [r["pid"] for r in finished] == [first.pid] * len(durations), _logs(tmp_path)
    assert await asyncio.to_thread(first.wait, 30) == 0, _logs(tmp_path)
    assert [r["pid"] for r in later] == [second.pid] * len(after)
    for key, reply in zip((*durations, "e", "f"), later, strict=True):
        assert reply["state"]["runs"] == (2 if key in durations else 1), key
    # Nothing ran twice: a graceful stop hands over only work it has not started.
    started = Counter(str(e.metadata["message"]) for e in await _invocations(rt, run))
    assert len(started) == len(before) + len(after)
    assert set(started.values()) == {1}, started


# -- 3. a long handler is kept alive, not redelivered ----------------------------------------------------


async def test_handler_longer_than_ack_wait_runs_once(
    runtime: Runtime, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    rt = runtime
    ack_wait = 1.0
    (proc,) = await _start_workers(
        worker_process, rt, tmp_path, SLOW_APP, "slow", "wa", extra=("--ack-wait", str(ack_wait))
    )
    run = new_root_run()
    long = await _send(rt, "slow", "long", f"sleep {3 * ack_wait}", run)
    assert long["state"]["runs"] == 1
    # The same key's mailbox is FIFO: any redelivered copy of the long message was fetched while it ran,
    # so it is handled before this one is answered.
    after = await _send(rt, "slow", "long", "read", run)
    assert after["state"]["runs"] == 1
    assert len(await _invocations(rt, run)) == 1
    partition = inbox_partition("long", rt.partitions)
    stream = rt.topology.names.inbox_stream
    name, _ = await ConsumerRecords(rt.topology.consumers, rt.namespace).read("slow", partition)
    assert name is not None
    info = await rt.js.consumer_info(stream, name)
    assert info.delivered is not None
    # Two messages, two deliveries: without keep-alives the long one is delivered again every ack_wait
    # (the redelivered copy is then answered from the checkpoint, so only this count shows it).
    assert info.delivered.consumer_seq == 2, info
    assert proc.poll() is None


# -- 4. rebalancing ------------------------------------------------------------------------------------


async def test_partitions_spread_on_join_and_return_to_the_survivor(
    runtime: Runtime, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    rt = runtime
    run = new_root_run()
    keys = [f"r{i:03d}" for i in range(64)]
    # Few handler slots (--concurrency 1): had the pullers of the partitions "wa" releases kept theirs,
    # it could stall on the partitions it keeps (checked deterministically by the slot test below).
    (a,) = await _start_workers(
        worker_process, rt, tmp_path, APP, "ledger", "wa", extra=("--concurrency", "1")
    )
    async with asyncio.timeout(SEND_TIMEOUT_S):
        first = await asyncio.gather(*(_send(rt, "ledger", k, "1", run) for k in keys))
    assert {r["pid"] for r in first} == {a.pid}

    b = worker_process(APP, "--worker-id", "wb", *FAST_WORKER)
    await _eventually(_spread(rt, "ledger", "wa", "wb"), "fair spread over wa, wb", [a, b], tmp_path)
    workers = {w.worker_id for w in await rt.workers("ledger")}
    assert workers == {"wa", "wb"}
    owners = await _owners(rt, "ledger")
    # Both serve their share: every key is answered by the owner of its partition.
    async with asyncio.timeout(SEND_TIMEOUT_S):
        second = await asyncio.gather(*(_send(rt, "ledger", k, "2", run) for k in keys))
    pid_of = {"wa": a.pid, "wb": b.pid}
    for key, reply in zip(keys, second, strict=True):
        assert reply["pid"] == pid_of[owners[inbox_partition(key, rt.partitions)]], key
        assert reply["state"]["seen"] == [1, 2], key

    os.kill(a.pid, signal.SIGKILL)
    await _eventually(_spread(rt, "ledger", "wb"), "wb owning all partitions", [b], tmp_path)
    async with asyncio.timeout(SEND_TIMEOUT_S):
        third = await asyncio.gather(*(_send(rt, "ledger", k, "3", run) for k in keys))
    assert {r["pid"] for r in third} == {b.pid}
    assert all(r["state"]["seen"] == [1, 2, 3] for r in third)
    # No crash happened while work was in flight, so nothing ran twice.
    runs = Counter((e.agent_id, e.metadata["seq"]) for e in await _invocations(rt, run))
    assert set(runs.values()) == {1}


async def test_released_partition_gives_its_handler_slots_back(runtime: Runtime, tmp_path: Path) -> None:
    """A partition's puller stopped mid-fetch (released on rebalance, or lost) returns the handler slots
    it reserved; leaked slots shrank a worker's capacity at every rebalance until it stopped pulling."""
    rt = runtime
    stream = rt.topology.names.inbox_stream
    durable = consumer_name(rt.namespace, "slow", 0)
    await rt.js.add_consumer(
        stream,
        js_api.ConsumerConfig(
            durable_name=durable,
            filter_subject=rt.subjects.inbox_partitioned_filter("slow", 0),
            ack_policy=js_api.AckPolicy.EXPLICIT,
        ),
    )
    slots = asyncio.Semaphore(4)

    async def dispatch(partition: int, msg: Any) -> None:
        raise AssertionError("nothing was published")

    puller = _Puller(rt.nc, stream, durable, 0, dispatch, slots)
    puller.start()

    async def fetching() -> tuple[bool, Any]:
        info = await rt.js.consumer_info(stream, durable)
        return bool(info.num_waiting) and slots.locked(), (info.num_waiting, slots.locked())

    # The server holds the puller's pull request: it sits in its fetch, with every slot reserved.
    await _eventually(fetching, "the puller waiting in a fetch", [], tmp_path, timeout=10)
    await puller.stop()
    async with asyncio.timeout(1):
        for _ in range(4):
            await slots.acquire()


async def test_rebalancing_drains_a_released_partition_before_handing_it_over(
    runtime: Runtime, worker_process: WorkerProcess, tmp_path: Path
) -> None:
    rt = runtime
    (a,) = await _start_workers(worker_process, rt, tmp_path, SLOW_APP, "slow", "wa")
    # With two workers "wa" keeps partitions 0-7 and hands 8-15 to "wb" (fair share, highest released).
    key = next(k for k in (f"m{i}" for i in range(100)) if inbox_partition(k, rt.partitions) >= 8)
    run = new_root_run()
    running = asyncio.create_task(_send(rt, "slow", key, "sleep 6", run))

    async def started() -> tuple[bool, Any]:
        count = len(await _invocations(rt, run))
        return count == 1, count

    await _eventually(started, "the long handler running on wa", [a], tmp_path)
    b = worker_process(SLOW_APP, "--worker-id", "wb", *FAST_WORKER)
    await _eventually(_spread(rt, "slow", "wa", "wb"), "fair spread over wa, wb", [a, b], tmp_path)
    async with asyncio.timeout(SEND_TIMEOUT_S):
        reply = await running
    assert reply["pid"] == a.pid
    assert len(await _invocations(rt, run)) == 1


async def test_crash_between_eventlog_append_and_checkpoint_does_not_wedge_the_agent(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """A worker that dies after appending a message's EventLog entries but before saving the checkpoint
    leaves the log ahead of the checkpoint. The next owner must carry on (at least once), not fence itself
    on every later message of that key forever."""
    rt = runtime
    run = new_root_run()
    agent = AgentId("ledger", "wedge")
    first = await start_worker(ledger_app, worker_id="wa")
    assert (await _send(rt, "ledger", "wedge", "1", run))["state"]["seen"] == [1]
    await first.stop(drain_timeout=5)
    # What the dead worker's commit of message "2" had written before the crash: the EventLog batch only.
    log = rt.event_log(agent)
    orphan = RunMessageReceived(run_id=run.run_id, agent_id=str(agent), message_id="msg-lost-at-crash")
    await log.append([orphan], expected_seq=await log.last_seq())
    await start_worker(ledger_app, worker_id="wb")
    async with asyncio.timeout(20):
        reply = await _send(rt, "ledger", "wedge", "2", run)
    assert reply["state"]["seen"] == [1, 2]


async def test_message_logged_before_a_crash_is_not_logged_again_when_redelivered(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Issue 9: a worker killed between its EventLog append and its checkpoint save left the message in the
    log; the redelivery ran it again and logged it a second time. The next owner recognises the entries."""
    rt = runtime
    run = new_root_run()
    agent = AgentId("ledger", "twice")
    first = await start_worker(ledger_app, worker_id="wa")
    assert (await _send(rt, "ledger", "twice", "1", run))["state"]["seen"] == [1]
    await first.stop(drain_timeout=5)
    # The dead worker's commit of message M had written its EventLog batch, then the process died: no
    # checkpoint, no ack. M is still in the inbox and comes back to the next owner.
    message_id = str(MessageId.new())
    log = rt.event_log(agent)
    logged = RunMessageReceived(run_id=run.run_id, agent_id=str(agent), message_id=message_id)
    await log.append([logged], expected_seq=await log.last_seq())
    sending = asyncio.create_task(
        rt.send_message([TextBlock(text="2")], agent, timeout=SEND_TIMEOUT_S, run=run, message_id=message_id)
    )
    await start_worker(ledger_app, worker_id="wb")
    async with asyncio.timeout(20):
        reply = _reply(await sending)
    assert reply["state"]["seen"] == [1, 2]
    received = [str(r.entry.message_id) for r in await log.read() if isinstance(r.entry, RunMessageReceived)]
    assert received.count(message_id) == 1
    # And the agent goes on logging new messages as before.
    assert (await _send(rt, "ledger", "twice", "3", run))["state"]["seen"] == [1, 2, 3]
    received = [str(r.entry.message_id) for r in await log.read() if isinstance(r.entry, RunMessageReceived)]
    assert len(received) == 3
