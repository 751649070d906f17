"""The lean hot path (issue 12): what a message does NOT cost, observed on the wire of a real nats-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio
from nats.aio.msg import Msg

from plexus.core import AgentId, BaseBlock, MessageId, ProtocolError, TextBlock
from plexus.runtime.wire._envelope import decode_reply, encode_envelope

from .apps_misc import DEADLINE, Served, envelope, reply_error, serving

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


@shared
async def test_a_duplicate_send_gets_the_stored_reply_instead_of_waiting_for_its_deadline(
    served: Served,
) -> None:
    """Issue 12 item 6: a `send_message` repeating a message id inside JetStream's dedupe window was dropped
    by the server and its caller waited for the deadline (ReplyTimeoutError). It now gets the stored reply,
    and the handler did not run twice (the counter agent counts its runs in durable state)."""
    rt = served.rt
    key = f"k-{uuid.uuid4().hex[:12]}"
    message_id = str(MessageId.new())
    first = await rt.send_message(PING, AgentId("counter", key), timeout=DEADLINE, message_id=message_id)
    again = await rt.send_message(PING, AgentId("counter", key), timeout=5, message_id=message_id)
    assert again == first == [TextBlock(text=f"{key}#1")]
    assert await rt.send_message(PING, AgentId("counter", key), timeout=DEADLINE) == [
        TextBlock(text=f"{key}#2")
    ]


@shared
async def test_a_resend_the_agent_cannot_answer_is_a_typed_error_not_a_second_run(served: Served) -> None:
    """A resend for a message the agent does not remember is refused with ProtocolError, never handled."""
    rt = served.rt
    key = f"k-{uuid.uuid4().hex[:12]}"
    env = envelope(f"counter/{key}", reply_to=rt.nc.new_inbox())
    env = msgspec.structs.replace(env, metadata={"plexus.resend": "1"})
    assert env.reply_to is not None
    sub = await rt.nc.subscribe(env.reply_to)
    try:
        headers = {"Nats-Msg-Id": f"{env.id}~resend~1", "Plexus-V": "1"}
        await rt.js.publish(rt.subjects.inbox("counter", key), encode_envelope(env), headers=headers)
        error = reply_error(await sub.next_msg(timeout=DEADLINE))
    finally:
        await sub.unsubscribe()
    assert isinstance(error, ProtocolError)
    assert await rt.send_message(PING, AgentId("counter", key), timeout=DEADLINE) == [
        TextBlock(text=f"{key}#1")
    ]


@shared
async def test_a_reply_probe_is_dropped_until_its_message_is_handled_then_answered_from_the_checkpoint(
    served: Served,
) -> None:
    """A client whose connection came back probes for the replies it awaits (`plexus.resend: probe`). A probe
    for a message the agent has not handled yet gets no answer (not ProtocolError: its own handling will
    answer) and does not count as handling it; once handled, a probe gets the stored reply."""
    rt = served.rt
    key = f"k-{uuid.uuid4().hex[:12]}"
    env = envelope(f"counter/{key}", reply_to=rt.nc.new_inbox())
    assert env.reply_to is not None
    sub = await rt.nc.subscribe(env.reply_to)

    async def probe(n: int) -> None:
        copy = msgspec.structs.replace(env, metadata={"plexus.resend": "probe"})
        headers = {"Nats-Msg-Id": f"{env.id}~resend~{n}", "Plexus-V": "1"}
        await rt.js.publish(rt.subjects.inbox("counter", key), encode_envelope(copy), headers=headers)

    try:
        await probe(1)
        # The key's next message is handled after the probe (FIFO): by then the probe was dropped unanswered.
        assert await rt.send_message(PING, AgentId("counter", key), timeout=DEADLINE) == [
            TextBlock(text=f"{key}#1")
        ]
        with pytest.raises(TimeoutError):
            await sub.next_msg(timeout=0.3)
        # The message itself, sent now, is handled (the probe did not mark it handled), once.
        headers = {"Nats-Msg-Id": env.id, "Plexus-V": "1"}
        await rt.js.publish(rt.subjects.inbox("counter", key), encode_envelope(env), headers=headers)
        first = await sub.next_msg(timeout=DEADLINE)
        await probe(2)
        again = await sub.next_msg(timeout=DEADLINE)
    finally:
        await sub.unsubscribe()
    assert first.data == again.data
    assert decode_reply(first.data).ok
    assert await rt.send_message(PING, AgentId("counter", key), timeout=DEADLINE) == [
        TextBlock(text=f"{key}#3")
    ]
