"""Issue 14: every denial of `plexus security init`'s config proved on a real nats-server, and the happy path
(a worker, an orchestrator and a client, each as its own least-privileged user over TLS) with no permission
violation at all."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl

import nats
import pytest
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from plexus.core import AgentId, SpawnBudget, TextBlock
from plexus.runtime import Runtime
from plexus.runtime.kernel import NatsAuth
from plexus.runtime.orchestration import RunStatus

from .conftest import APP, Secured, connect_as, operator_topology

pytestmark = pytest.mark.timeout(120)


async def _until_serving(rt: Runtime, agent_type: str) -> None:
    async with asyncio.timeout(60):
        while not await rt.workers(agent_type):  # noqa: ASYNC110 - another process's state
            await asyncio.sleep(0.2)


async def test_each_role_works_with_only_its_own_permissions(secured: Secured) -> None:
    await operator_topology(secured, "acme")
    secured.spawn("acme", "worker", "worker", APP)
    secured.spawn("acme", "orchestrator", "orchestrator")
    client = await Runtime.connect(secured.url, auth=secured.auth("acme", "client"))
    try:
        print("\n".join(secured.violations()))
        await _until_serving(client, "ledger")
        replies = [
            await client.send_message([TextBlock(text="x")], AgentId("ledger", "k1"), timeout=30)
            for _ in range(3)
        ]
        assert [r[0].text for r in replies if isinstance(r[0], TextBlock)] == ["1", "2", "3"]
        run_id = await client.start_run(
            AgentId("tree", "t1"), [TextBlock(text="go")], spawn_budget=SpawnBudget(max_agents=3)
        )
        record = await client.wait_run(run_id, timeout=60)
    finally:
        await client.close()
        print("\n".join(secured.violations()))
    assert record.status == RunStatus.COMPLETED, record
    assert secured.violations() == []  # nothing the happy path needs was refused


async def test_a_worker_may_not_write_another_types_state_or_decide_for_the_orchestrator(
    secured: Secured,
) -> None:
    await operator_topology(secured, "acme")
    async with connect_as(secured, "acme", "worker") as worker:
        # Its own types' state: allowed (a checkpoint write answered by JetStream).
        ack = await worker.nc.request("$KV.plexus_checkpoints.default.ledger.k", b"{}", timeout=5)
        assert json.loads(ack.data)["stream"] == "KV_plexus_checkpoints"
        # Another type's checkpoint, EventLog and lease: refused.
        assert await worker.refused("$KV.plexus_checkpoints.default.billing.k")
        assert await worker.refused("px.default.evlog.billing.k")
        assert await worker.refused("$KV.plexus_leases.default.billing.3")
        # Orchestrator decisions and run records; stream administration.
        assert await worker.refused("px.default.ctl.cancel.run_x")
        assert await worker.refused("$KV.plexus_runs.run.run_x")
        assert await worker.refused("$JS.API.STREAM.DELETE.PLEXUS_INBOX")


async def test_a_client_may_send_and_read_progress_and_nothing_else(secured: Secured) -> None:
    await operator_topology(secured, "acme")
    async with connect_as(secured, "acme", "client") as client:
        assert await client.refused("$JS.API.STREAM.DELETE.PLEXUS_INBOX")
        assert await client.refused("$JS.API.STREAM.PURGE.PLEXUS_EVENTS")
        assert await client.refused("$KV.plexus_checkpoints.default.ledger.k")
        assert await client.refused("px.default.evlog.ledger.k")
        assert await client.refused("px.default.ctl.cancel.run_x")
        # Another identity's replies: a shared `_INBOX.>` would leak them all.
        client.errors.clear()
        await client.nc.subscribe("_INBOX.>")
        await client.nc.flush()
        await asyncio.sleep(0.3)
        assert any("permissions violation for subscription" in e.lower() for e in client.errors), (
            client.errors
        )
    operator = await Runtime.connect(secured.url, auth=secured.auth("acme", "operator"))
    try:
        info = await operator.js.stream_info("PLEXUS_INBOX")  # still there
        assert info.config.name == "PLEXUS_INBOX"
    finally:
        await operator.close()


async def test_the_gateway_may_not_write_agent_state(secured: Secured) -> None:
    await operator_topology(secured, "acme")
    async with connect_as(secured, "acme", "gateway") as gateway:
        assert await gateway.refused("px.default.evlog.ledger.k")
        assert await gateway.refused("$KV.plexus_checkpoints.default.ledger.k")
        assert await gateway.refused("$KV.plexus_runs.run.run_x")
        assert await gateway.refused("$KV.plexus_leases.default.ledger.0")
        ack = await gateway.nc.request("px.default.in.ledger.k", b"", timeout=5)  # sending is allowed
        assert json.loads(ack.data)["stream"] == "PLEXUS_INBOX"


async def test_tenants_see_neither_each_others_streams_nor_their_progress(secured: Secured) -> None:
    await operator_topology(secured, "acme")
    async with connect_as(secured, "beta", "client") as beta, connect_as(secured, "acme", "worker") as acme:
        seen: list[str] = []

        async def on_msg(msg: Msg) -> None:
            seen.append(msg.subject)

        await beta.nc.subscribe("px.*.progress.>", cb=on_msg)
        await beta.nc.flush()
        await acme.nc.publish("px.default.progress.run_x.ledger.k", b"{}")
        await acme.nc.flush()
        await asyncio.sleep(0.5)
        assert seen == []
        with pytest.raises(NotFoundError):
            await beta.nc.jetstream().stream_info("PLEXUS_INBOX")


async def test_connections_without_tls_or_the_right_password_are_refused(secured: Secured) -> None:
    port = secured.server.client_port
    assert port is not None
    # A plain-TCP client: the server announces TLS as required and drops a plain CONNECT unanswered.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        info = sock.recv(4096)
        assert b'"tls_required":true' in info
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        answer = sock.recv(4096)
    assert b"PONG" not in answer, answer
    # TLS without trusting the Plexus CA: the server's certificate is refused by the client.
    with pytest.raises(ssl.SSLCertVerificationError):
        await nats.connect(secured.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5)
    # The CA but a wrong password.
    good = secured.auth("acme", "client")
    bad = NatsAuth(user=good.user, password="wrong", tls_ca=good.tls_ca)
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(
            secured.url, allow_reconnect=False, max_reconnect_attempts=0, **bad.connect_options()
        )
