"""A run's end the orchestrator did not take is reported again a short delay later (the worker naks the
message with that delay), not once JetStream's ack_wait (30 s by default) has run out."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
from nats.aio.msg import Msg

from plexus.core import KernelError, RunId
from plexus.runtime import Runtime
from plexus.runtime.wire._envelope import Reply, RunInfo, blocks_from_payload, decode_reply, encode_envelope
from plexus.runtime.wire._orchestration import orch_subject
from plexus.runtime.wire._subjects import escape_token

from .apps_misc import acked, build_app, envelope, good_headers, wait_until
from .conftest import StartWorker

ACK_WAIT_S = 30.0


async def test_a_run_end_report_that_failed_is_sent_again_after_a_short_delay_not_ack_wait(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Before: a run-end report the orchestrator failed left the message unacked, so the report (and the
    run's end for whoever waits on it) came again only after ack_wait; now it comes ≈ 2 s later."""
    rt = runtime
    # A stand-in for the orchestrator's `finished` endpoint: one replica fails the first report (a typed
    # error that is neither "unknown run" nor "no replica answered"), then the reports are taken.
    reports: list[tuple[float, str]] = []

    async def finished(msg: Msg) -> None:
        reports.append((time.monotonic(), json.loads(msg.data)["run_id"]))
        if len(reports) == 1:
            error = KernelError("the replica failed to store the run's end").to_wire()
            headers = {"Nats-Service-Error-Code": "500", "Nats-Service-Error": "store failed"}
            await rt.nc.publish(msg.reply, json.dumps(error).encode(), headers=headers)
        else:
            await rt.nc.publish(msg.reply, b"{}")

    orchestrator = await rt.nc.subscribe(
        orch_subject(rt.prefix, escape_token(rt.namespace), "finished"), cb=finished
    )
    await start_worker(build_app(), ack_wait_s=ACK_WAIT_S)
    run_id = str(RunId.new())
    inbox = rt.nc.new_inbox()
    replies: list[Msg] = []

    async def on_reply(msg: Msg) -> None:
        replies.append(msg)

    reply_sub = await rt.nc.subscribe(inbox, cb=on_reply)
    try:
        # A run's entry message (orchestrated, no sender): its handling ends with a run-end report.
        env = envelope("counter/rerun", reply_to=inbox)
        env = msgspec.structs.replace(env, run=RunInfo(run_id=run_id, root_id=run_id, orchestrated=True))
        ack = await rt.js.publish(
            rt.subjects.inbox("counter", "rerun"), encode_envelope(env), headers=good_headers(env)
        )

        async def reported_twice() -> bool:
            return len(reports) >= 2

        await wait_until(reported_twice, timeout=ACK_WAIT_S / 3)
        await acked(rt, ack.seq)  # the second report was taken: acked
        await asyncio.sleep(0.2)  # the redelivery's reply, published after its report
    finally:
        await reply_sub.unsubscribe()
        await orchestrator.unsubscribe()
    (first, first_run), (second, second_run) = reports[:2]
    assert first_run == second_run == run_id
    assert 1.5 <= second - first <= 6.0, second - first  # ≈ the nak's delay, far from ack_wait
    # The redelivery was answered from the checkpoint: the handler ran once, its reply sent twice.
    texts = [_text(decode_reply(r.data)) for r in replies]
    assert texts == ["rerun#1", "rerun#1"], texts


def _text(reply: Reply) -> str:
    assert reply.ok, reply
    assert reply.payload is not None
    return "".join(getattr(b, "text", "") for b in blocks_from_payload(reply.payload))
