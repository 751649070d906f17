"""Fixtures for the orchestrator service tests: a client `Runtime`, in-process replicas, typed calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.js.api import DeliverPolicy

from plexus.core import KernelError
from plexus.orchestrator import VERBS, Orchestrator, OrchestratorConfig, SweeperConfig
from plexus.runtime import NatsServer, Runtime
from plexus.runtime.kernel import AgentTypeInfo
from plexus.runtime.wire._orchestration import (
    RunRecord,
    TreeRecord,
    cancel_subject,
    orch_subject,
    pause_subject,
    run_key,
    tree_key,
)
from plexus.runtime.wire._subjects import Subjects, escape_token

T = TypeVar("T")

#: Short periods so deadline, retry and repair tests finish quickly.
FAST = SweeperConfig(
    tick_s=0.05, budget_recheck_s=0.5, repair_s=0.3, start_grace_s=0.5, spawn_grace_s=1.0, close_grace_s=0.3
)


#: The agent types these tests start runs of (no worker hosts them: a run waits, as for a late worker).
TEST_TYPES = ("echo", "boss", "w", "other")


async def register_test_types(runtime: Runtime) -> None:
    """Register `TEST_TYPES` as a worker would: `start` refuses a type the registry has never seen."""
    for name in TEST_TYPES:
        await runtime.registry.register_type(
            AgentTypeInfo(namespace="default", type=name, durable=True, partitions=runtime.partitions)
        )


@pytest.fixture
async def rt(nats_server: NatsServer) -> AsyncIterator[Runtime]:
    runtime = await Runtime.connect(nats_server.url)
    await register_test_types(runtime)
    try:
        yield runtime
    finally:
        await runtime.close()


StartReplica = Callable[..., Awaitable[Orchestrator]]


@pytest.fixture
async def replicas(nats_server: NatsServer, rt: Runtime) -> AsyncIterator[StartReplica]:
    """Start in-process orchestrator replicas (each on its own connection); all stopped at teardown."""
    started: list[Orchestrator] = []

    async def start(**config: Any) -> Orchestrator:
        config.setdefault("sweeper", FAST)
        orch = await Orchestrator.connect(nats_server.url, OrchestratorConfig(**config))
        await orch.start()
        started.append(orch)
        await until_serving(rt.nc)
        return orch

    try:
        yield start
    finally:
        for orch in started:
            await orch.stop()


@pytest.fixture
async def orch(replicas: StartReplica) -> Orchestrator:
    return await replicas()


async def until_serving(nc: Client, namespace: str = "default", timeout: float = 10.0) -> None:
    """Wait until every endpoint answers on ``nc``.

    nats-server 2.15.1 occasionally answers the first request to a subject just after a *wildcard*
    subscription to it was flushed with "no responders" (measured: 2-3 in 1,500 fresh subscriptions; never
    with literal subjects), so a test's first request could fail for a reason that is not ours.
    """
    async with asyncio.timeout(timeout):
        for verb in VERBS:
            while True:
                try:
                    await nc.request(orch_subject("px", namespace, verb), b"{}", timeout=timeout)
                    break
                except NoRespondersError:
                    await asyncio.sleep(0.01)


async def call(rt: Runtime, verb: str, body: Any, reply_type: type[T] = dict) -> T:  # type: ignore[assignment]
    """A typed request through the client's own orchestrator client (errors re-raised as KernelError)."""
    return await rt.orchestrator.call(verb, body, reply_type)


async def raw_call(nc: Client, subject: str, data: bytes) -> tuple[Msg, dict[str, Any] | None]:
    """A raw request: the reply and, for an error reply, its decoded wire error."""
    msg = await nc.request(subject, data, timeout=5)
    if msg.headers and "Nats-Service-Error-Code" in msg.headers:
        return msg, json.loads(msg.data)
    return msg, None


class Broadcasts:
    """Collects cancel and pause notices of the default namespace as they arrive."""

    def __init__(self) -> None:
        self.cancels: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pauses: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def next_cancel(self, timeout: float = 5.0) -> dict[str, Any]:
        return await asyncio.wait_for(self.cancels.get(), timeout)

    async def next_pause(self, timeout: float = 5.0) -> dict[str, Any]:
        return await asyncio.wait_for(self.pauses.get(), timeout)


@pytest.fixture
async def broadcasts(rt: Runtime) -> AsyncIterator[Broadcasts]:
    seen = Broadcasts()

    async def on_cancel(msg: Msg) -> None:
        await seen.cancels.put(json.loads(msg.data))

    async def on_pause(msg: Msg) -> None:
        await seen.pauses.put(json.loads(msg.data))

    subs = [
        await rt.nc.subscribe(cancel_subject("px", "default", "*"), cb=on_cancel),
        await rt.nc.subscribe(pause_subject("px", "default", "*"), cb=on_pause),
    ]
    await rt.nc.flush()
    try:
        yield seen
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def wait_status(rt: Runtime, run_id: str, *statuses: str, timeout: float = 10.0) -> RunRecord:
    """Wait (on the run's KV key, event-driven) until the run has one of ``statuses``."""
    return await rt.wait_run(run_id, timeout=timeout, until=statuses)


def wire_error(exc: KernelError) -> dict[str, Any]:
    return exc.to_wire()


async def wait_key(rt: Runtime, key: str, done: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    """Wait (event-driven, on one KV key) until ``done(entry)`` holds; returns that entry."""
    watcher = await rt.topology.runs.watch(key)
    try:
        async with asyncio.timeout(timeout):
            while True:
                entry = await watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
                if entry is not None and done(entry):
                    return entry
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]


async def wait_tree(rt: Runtime, root_id: str, done: Callable[[TreeRecord], bool]) -> TreeRecord:
    def check(entry: Any) -> bool:
        return bool(entry.value) and done(msgspec.json.decode(entry.value, type=TreeRecord))

    entry = await wait_key(rt, tree_key(escape_token(root_id)), check)
    return msgspec.json.decode(entry.value, type=TreeRecord)


async def wait_deleted(rt: Runtime, run_id: str) -> None:
    await wait_key(rt, run_key(escape_token(run_id)), lambda e: e.operation in ("DEL", "PURGE"))


async def decisions(rt: Runtime, root_id: str) -> list[str]:
    """The `decision` metadata of the tree's orchestrator progress events, in order."""
    out: list[str] = []
    sub = await rt.js.subscribe(Subjects().progress_tree(root_id), ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except Exception:
                return out
            out.append(json.loads(msg.data)["metadata"]["decision"])
    finally:
        await sub.unsubscribe()


async def all_runs(rt: Runtime) -> list[RunRecord]:
    """Every run record in the bucket, read from its stream (KV `keys()` can miss keys while the server is
    still pushing its snapshot)."""
    sub = await rt.js.subscribe(
        "$KV.plexus_runs.run.>",
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        headers_only=False,
    )
    records: list[RunRecord] = []
    try:
        while True:
            msg = await sub.next_msg(timeout=5)
            if msg.data:
                records.append(msgspec.json.decode(msg.data, type=RunRecord))
            if msg.metadata.num_pending == 0:
                return records
    finally:
        await sub.unsubscribe()
