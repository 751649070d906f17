"""`delivery`: a JetStream message's delivery count and stream sequence read from its ack subject, as
nats-py's `Msg.metadata` reads them, for both ack subject formats and for a real redelivery."""

from __future__ import annotations

import nats
import pytest
from nats.aio.msg import Msg

from plexus.runtime.ops._server import NatsServer
from plexus.runtime.worker.pipeline._work import delivery


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.PLEXUS_INBOX.px-default-p3.1.123456.789.1732600000000000000.5",
        "$JS.ACK.PLEXUS_INBOX.px-default-p3.7.9.9.1732600000000000000.0",
        "$JS.ACK.hub.AAAAHASH.PLEXUS_INBOX.px-default-p3.3.10.2.1732600000000000000.0.rnd",
        "$JS.ACK.hub.AAAAHASH.PLEXUS_INBOX.px-default-p3.12.10.2.1732600000000000000.0",
    ],
)
def test_both_ack_subject_formats_read_as_nats_py_reads_them(reply: str) -> None:
    msg = Msg(_client=None, subject="px.default.inbox.t.k", reply=reply)  # type: ignore[arg-type]
    assert delivery(msg) == (msg.metadata.num_delivered, msg.metadata.sequence.stream)


def test_a_subject_that_is_no_ack_subject_fails_as_nats_py_does() -> None:
    msg = Msg(_client=None, subject="s", reply="_INBOX.abc")  # type: ignore[arg-type]
    with pytest.raises(Exception) as ours:
        delivery(msg)
    with pytest.raises(Exception) as theirs:
        _ = msg.metadata
    assert type(ours.value) is type(theirs.value)


async def test_a_redelivered_message_counts_two(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="DC", subjects=["dc.>"])
        await js.publish("dc.a", b"x")
        sub = await js.pull_subscribe("dc.a", durable="dc")
        first = (await sub.fetch(1, timeout=5))[0]
        assert delivery(first) == (1, 1) == (first.metadata.num_delivered, first.metadata.sequence.stream)
        await first.nak()
        again = (await sub.fetch(1, timeout=5))[0]
        assert delivery(again) == (2, 1) == (again.metadata.num_delivered, again.metadata.sequence.stream)
    finally:
        await nc.close()
