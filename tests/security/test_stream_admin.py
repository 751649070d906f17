"""Issue 36 item 1: only the operator creates or changes streams. A role that could create one could give it
any subjects (`_INBOX.>`: every identity's replies, kept and readable with STREAM.MSG.GET), so every stream
and bucket, the gateway's included, is the topology's; and the inbox partitions' consumers are created only
by workers, inside their own types, and deleted by no other role."""

from __future__ import annotations

import json

import pytest
from nats.js.errors import NotFoundError

from plexus.runtime import Runtime

from .conftest import Secured, connect_as, operator_topology

pytestmark = pytest.mark.timeout(120)

#: Subjects a capturing stream would take: every reply, everything, and other roles' subjects.
_CAPTURES = [["_INBOX.>"], [">"], ["px.*.ctl.>", "$KV.plexus_runs.>", "px.*.evlog.>"]]
_NAMES = ["KV_plexus_sessions", "KV_plexus_gateway_tokens", "CAPTURE"]


@pytest.mark.parametrize("role", ["worker", "orchestrator", "gateway", "client"])
async def test_no_role_but_the_operator_may_create_or_change_a_stream(secured: Secured, role: str) -> None:
    async with connect_as(secured, "acme", role) as user:
        # Before any topology exists (the moment the first gateway used to create its buckets) ...
        for name in _NAMES:
            for subjects in _CAPTURES:
                body = json.dumps({"name": name, "subjects": subjects, "storage": "memory"}).encode()
                assert await user.refused(f"$JS.API.STREAM.CREATE.{name}", body), (name, subjects)
        await operator_topology(secured, "acme")
        # ... and after: no bucket may be widened to other subjects.
        for name in _NAMES[:2]:
            body = json.dumps({"name": name, "subjects": ["_INBOX.>"]}).encode()
            assert await user.refused(f"$JS.API.STREAM.UPDATE.{name}", body), name
    async with connect_as(secured, "acme", "worker") as worker:
        await worker.nc.publish("_INBOX.acme_client.x", b"a reply for the client only")
        await worker.nc.flush()
    operator = await Runtime.connect(secured.url, auth=secured.auth("acme", "operator"))
    try:
        with pytest.raises(NotFoundError):
            await operator.js.find_stream_name_by_subject("_INBOX.acme_client.x")  # nothing kept it
        with pytest.raises(NotFoundError):
            await operator.js.stream_info("CAPTURE")
        for name in _NAMES[:2]:  # the topology's buckets, with their own subjects only
            info = await operator.js.stream_info(name)
            assert info.config.subjects == [f"$KV.{name.removeprefix('KV_')}.>"]
    finally:
        await operator.close()


async def test_inbox_partition_consumers_are_a_workers_own_types_only(secured: Secured) -> None:
    await operator_topology(secured, "acme")
    victim = "px__default__ledger__0"
    for role in ("orchestrator", "gateway", "client"):
        async with connect_as(secured, "acme", role) as user:
            assert await user.refused(f"$JS.API.CONSUMER.DELETE.PLEXUS_INBOX.{victim}"), role
            assert await user.refused(f"$JS.API.CONSUMER.DELETE.PLEXUS_PROGRESS.{victim}"), role
            assert await user.refused(f"$JS.API.CONSUMER.DURABLE.CREATE.PLEXUS_INBOX.{victim}"), role
    # acme's workers may serve `ledger` and `tree`: not `billing`'s partitions, nor any unfiltered consumer.
    async with connect_as(secured, "acme", "worker") as worker:
        other = {"durable_name": "steal", "name": "steal", "filter_subject": "px.default.inp.billing.0.>"}
        body = json.dumps({"stream_name": "PLEXUS_INBOX", "config": other}).encode()
        assert await worker.refused(
            "$JS.API.CONSUMER.CREATE.PLEXUS_INBOX.steal.px.default.inp.billing.0.>", body
        )
        assert await worker.refused("$JS.API.CONSUMER.DURABLE.CREATE.PLEXUS_INBOX.steal", body)
        assert await worker.refused("$JS.API.CONSUMER.CREATE.PLEXUS_INBOX", body)
        own = {**other, "filter_subject": "px.default.inp.ledger.0.>", "ack_policy": "explicit"}
        body = json.dumps({"stream_name": "PLEXUS_INBOX", "config": own}).encode()
        answer = await worker.nc.request(
            "$JS.API.CONSUMER.CREATE.PLEXUS_INBOX.steal.px.default.inp.ledger.0.>", body, timeout=5
        )
        assert "error" not in json.loads(answer.data), answer.data
        # Consumer names are secret (a nonce, found in their records): it may not list them in any form.
        assert await worker.refused("$JS.API.CONSUMER.NAMES.PLEXUS_INBOX")
        assert await worker.refused("$JS.API.CONSUMER.LIST.PLEXUS_INBOX")
