"""`DeferredAcks.publish_acked` against a real nats-server: the same answers and errors as ``js.publish``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import api as js_api

from plexus.runtime import PayloadTooLargeError
from plexus.runtime.store._acks import DeferredAcks

STREAM = "ACKS_TEST"


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    conn = await nats.connect(nats_url)
    await conn.jetstream().add_stream(js_api.StreamConfig(name=STREAM, subjects=["acks.>"]))
    try:
        yield conn
    finally:
        await conn.close()


async def _both(nc: Client, subject: str, data: bytes, headers: dict[str, str] | None) -> list[Any]:
    """What js.publish and publish_acked each return or raise (type and server error code)."""
    answers: list[Any] = []
    acks = DeferredAcks(nc)
    for publish in (nc.jetstream().publish, acks.publish_acked):
        try:
            ack = await publish(subject, data, headers=headers, timeout=2)
            answers.append(("ack", ack.stream, ack.duplicate))
        except nats.js.errors.APIError as exc:
            answers.append((type(exc), exc.err_code))
        except Exception as exc:
            answers.append((type(exc), None))
    return answers


async def test_an_ack_carries_the_stream_sequence_and_duplicate_flag(nc: Client) -> None:
    acks = DeferredAcks(nc)
    first = await acks.publish_acked("acks.a", b"1", headers={"Nats-Msg-Id": "m1"})
    again = await acks.publish_acked("acks.a", b"1", headers={"Nats-Msg-Id": "m1"})
    second = await acks.publish_acked("acks.a", b"2")
    assert (first.stream, first.seq, bool(first.duplicate)) == (STREAM, 1, False)
    assert (again.seq, again.duplicate) == (1, True)
    assert second.seq == 2


@pytest.mark.parametrize(
    ("subject", "headers"),
    [
        ("acks.b", None),
        ("acks.b", {"Nats-Expected-Last-Subject-Sequence": "7"}),  # a fenced append that lost
        ("acks.b", {"Nats-Expected-Stream": "ANOTHER"}),
        ("nowhere.b", None),  # no stream takes it: no responders
    ],
)
async def test_answers_and_errors_are_js_publishs(
    nc: Client, subject: str, headers: dict[str, str] | None
) -> None:
    answers = await _both(nc, subject, b"x", headers)
    assert answers[0] == answers[1]


async def test_too_large_is_refused_before_sending_and_silence_times_out(nc: Client) -> None:
    acks = DeferredAcks(nc)
    with pytest.raises(PayloadTooLargeError):
        await acks.publish_acked("acks.c", b"x" * (nc.max_payload + 1))
    await nc.subscribe("silent.c")  # a core subscriber that never answers
    with pytest.raises(nats.errors.TimeoutError):
        await acks.publish_acked("silent.c", b"x", timeout=0.2)
    assert acks._pending == {}  # nothing is left waiting


async def _swallowing_first(nc: Client, subject: str, seen: list[float]) -> None:
    """A responder on `subject` that drops the first copy of a request, as a stream electing its leader
    does, and answers the next ones as a stream would."""

    async def respond(msg: Any) -> None:
        seen.append(time.monotonic())
        if len(seen) > 1:
            await msg.respond(b'{"stream": "%s", "seq": 7}' % STREAM.encode())

    await nc.subscribe(subject, cb=respond)
    await nc.flush()


async def test_a_publish_the_stream_de_duplicates_is_sent_again_until_answered(nc: Client) -> None:
    """Sent while its stream elected a leader, a publish is never answered; one with a `Nats-Msg-Id` (the
    stream keeps one copy) is sent again every second, so it waits about as long as the election instead
    of its whole timeout."""
    seen: list[float] = []
    await _swallowing_first(nc, "elect.a", seen)
    acks = DeferredAcks(nc)
    started = time.monotonic()
    ack = await acks.publish_acked("elect.a", b"x", headers={"Nats-Msg-Id": "m-1"}, timeout=5)
    assert ack.seq == 7
    assert len(seen) == 2
    assert 0.8 < seen[1] - started < 2.0
    await asyncio.sleep(1.3)
    assert len(seen) == 2  # answered: no more copies


async def test_a_publish_without_a_message_id_is_never_sent_twice(nc: Client) -> None:
    """Without a `Nats-Msg-Id` a second copy could be stored twice: the publish waits for its timeout."""
    seen: list[float] = []
    await _swallowing_first(nc, "elect.b", seen)
    acks = DeferredAcks(nc)
    with pytest.raises(nats.errors.TimeoutError):
        await acks.publish_acked("elect.b", b"x", timeout=2.5)
    assert len(seen) == 1


async def test_a_publish_its_caller_makes_safe_to_repeat_is_sent_again_without_a_message_id(
    nc: Client,
) -> None:
    """`repeat=True`: a fenced EventLog append carries no message id but is safe to send again."""
    seen: list[float] = []
    await _swallowing_first(nc, "elect.c", seen)
    ack = await DeferredAcks(nc).publish_acked("elect.c", b"x", timeout=5, repeat=True)
    assert ack.seq == 7
    assert len(seen) == 2
