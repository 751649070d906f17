"""The lean hot path (issue 12): what a message does NOT cost, observed on the wire of a real nats-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, TextBlock

from .apps_misc import DEADLINE, Served, serving

PING: list[BaseBlock] = [TextBlock(text="ping")]

shared = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    async with serving(tmp_path_factory.mktemp("nats")) as served:
        yield served


@shared
async def test_stateless_types_touch_no_checkpoint_and_no_event_log(served: Served) -> None:
    """A `durable=False` type loads no checkpoint and reads no EventLog sequence: every JetStream API request
    made while 20 new keys are served is seen (a core subscription on `$JS.API.>` sees all clients')."""
    rt = served.rt
    requests: list[str] = []

    async def seen(msg: Msg) -> None:
        requests.append(msg.subject)

    sub = await rt.nc.subscribe("$JS.API.>", cb=seen)
    try:
        await rt.nc.flush()
        for _ in range(20):
            key = f"k-{uuid.uuid4().hex[:12]}"
            assert await rt.send_message(PING, AgentId("echo-eph", key), timeout=DEADLINE) == PING
        await asyncio.sleep(0.2)
    finally:
        await sub.unsubscribe()
    touched = [s for s in requests if "plexus_checkpoints" in s or "PLEXUS_EVENTS" in s]
    assert touched == []


@shared
async def test_durable_types_still_load_their_checkpoint(served: Served) -> None:
    """The observation above can see checkpoint reads: a durable type's first message of a key loads one."""
    rt = served.rt
    requests: list[str] = []

    async def seen(msg: Msg) -> None:
        requests.append(msg.subject)

    sub = await rt.nc.subscribe("$JS.API.>", cb=seen)
    try:
        await rt.nc.flush()
        key = f"k-{uuid.uuid4().hex[:12]}"
        assert await rt.send_message(PING, AgentId("echo", key), timeout=DEADLINE) == PING
        await asyncio.sleep(0.2)
    finally:
        await sub.unsubscribe()
    assert any("plexus_checkpoints" in s for s in requests), requests
