"""`delivery_count`: a JetStream message's delivery count read from its ack subject, as nats-py's
`Msg.metadata` reads it, for both ack subject formats and for a real redelivery."""

from __future__ import annotations

import nats
import pytest
from nats.aio.msg import Msg

from plexus.runtime.ops._server import NatsServer
from plexus.runtime.worker._work import delivery_count


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
    assert delivery_count(msg) == msg.metadata.num_delivered


def test_a_subject_that_is_no_ack_subject_fails_as_nats_py_does() -> None:
    msg = Msg(_client=None, subject="s", reply="_INBOX.abc")  # type: ignore[arg-type]
    with pytest.raises(Exception) as ours:
        delivery_count(msg)
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
        assert delivery_count(first) == 1 == first.metadata.num_delivered
        await first.nak()
        again = (await sub.fetch(1, timeout=5))[0]
        assert delivery_count(again) == 2 == again.metadata.num_delivered
    finally:
        await nc.close()
