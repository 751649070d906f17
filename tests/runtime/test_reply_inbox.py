"""The client's reply inbox against a real nats-server, and a send that finds nobody listening."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from plexus.core import AgentId, AgentNotFoundError, TextBlock
from plexus.runtime import NatsServer, Runtime
from plexus.runtime.client._replies import NoRespondersError, ReplyInbox
from plexus.runtime.kernel import AgentTypeInfo
from plexus.runtime.store._registry import WorkerInfo
from plexus.runtime.wire._envelope import Reply, decode_envelope, encode_reply
from tests.runtime.conftest import WorkerProcess
from tests.security.seeds import identity_auth


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    conn = await nats.connect(nats_url)
    try:
        yield conn
    finally:
        await conn.close()


async def test_a_reply_resolves_its_own_send_only(nc: Client) -> None:
    inbox = ReplyInbox(nc)
    await inbox.start()
    first_to, first = inbox.expect_reply("msg.with*odd>chars")  # escaped into one token
    second_to, second = inbox.expect_reply("m2")
    assert first_to.count(".") == second_to.count(".")
    await nc.publish(second_to, encode_reply(Reply(id="m2", ok=True)))
    assert (await inbox.answer(second, 5, TimeoutError)).id == "m2"
    assert not first.done()
    await nc.publish(first_to, b"not a reply")  # ignored: the send waits on for a real one
    await nc.publish(first_to, encode_reply(Reply(id="msg.with*odd>chars", ok=False)))
    assert (await inbox.answer(first, 5, TimeoutError)).ok is False
    assert inbox._pending == {}  # an answered send is no longer waited for


async def test_nobody_listening_fails_at_once_and_silence_times_out(nc: Client) -> None:
    inbox = ReplyInbox(nc)
    await inbox.start()
    reply_to, future = inbox.expect_reply("m1")
    started = time.monotonic()
    await nc.publish("nobody.listens.here", b"{}", reply=reply_to)
    with pytest.raises(NoRespondersError):
        await inbox.answer(future, 30, TimeoutError)
    assert time.monotonic() - started < 5  # the server's status, not the 30 s deadline
    listener = await nc.subscribe("someone.listens")  # and never answers
    reply_to, future = inbox.expect_reply("m2")
    await nc.publish("someone.listens", b"{}", reply=reply_to)
    with pytest.raises(TimeoutError):
        await inbox.answer(future, 0.2, TimeoutError)
    await listener.unsubscribe()


async def test_a_send_to_a_host_that_died_fails_with_agent_not_found_before_its_deadline(
    nats_server: NatsServer, worker_process: WorkerProcess
) -> None:
    # The registry still lists the killed worker (its heartbeat is young), so the message is published;
    # nobody is subscribed any more, and the server's "no responders" answers it at once.
    rt = await Runtime.connect(nats_server.url, auth=identity_auth(nats_server, "operator"))
    try:
        proc = worker_process("tests.runtime.apps_misc:app", "--heartbeat-ttl", "60")
        await rt.get("echo-eph", lazy=False, timeout=30)
        ping = [TextBlock(text="ping")]
        assert await rt.send_message(ping, AgentId("echo-eph", "k"), timeout=30) == ping
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        await asyncio.sleep(0.5)  # the server notices the closed connection and drops its subscriptions
        started = time.monotonic()
        with pytest.raises(AgentNotFoundError):
            await rt.send_message(ping, AgentId("echo-eph", "k"), timeout=30)
        assert time.monotonic() - started < 10
    finally:
        await rt.close()


async def test_a_host_whose_subscription_has_not_reached_this_server_yet_still_gets_the_message(
    runtime: Runtime,
) -> None:
    # In a cluster a new worker's heartbeat can reach a client before its subscription reaches the client's
    # server: "no responders" then means "not yet", and the send is asked again while the host is listed.
    await runtime.registry.register_type(
        AgentTypeInfo(namespace="default", type="late", durable=False, partitions=runtime.partitions)
    )
    now = time.time()
    await runtime.registry.heartbeat(
        WorkerInfo(
            worker_id="w-late", host="h", pid=1, started_at=now, heartbeat_at=now, types=["default/late"]
        )
    )
    await runtime.get("late", lazy=False, timeout=10)  # the client's registry view lists the host
    subject = runtime.subjects.ephemeral("late", "k")
    answered: list[str] = []

    async def answer(msg: Msg) -> None:  # the worker's subscription, arriving 120 ms late
        env = decode_envelope(msg.data, msg.headers)
        answered.append(env.id)
        await runtime.nc.publish(msg.reply, encode_reply(Reply(id=env.id, ok=True, payload=env.payload)))

    async def subscribe_late() -> None:
        await asyncio.sleep(0.12)
        await runtime.nc.subscribe(subject, cb=answer)

    late = asyncio.create_task(subscribe_late())
    ping = [TextBlock(text="ping")]
    assert await runtime.send_message(ping, AgentId("late", "k"), timeout=10) == ping
    await late
    assert len(answered) == 1  # nobody received the attempts that met no responders
