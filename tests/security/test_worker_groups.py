"""Issue 36: worker groups (`plexus security init --worker-group`): worker pools of one tenant, each its own
user permitted only its own agent types, proved on a real nats-server over TLS. Also: a type whose name
holds `_` (escaped `_5F` in subjects and keys) is served under its own permissions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import stat
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from plexus.core import AgentId, BaseBlock, PermissionDeniedError, TextBlock
from plexus.runtime import Agent, App, Context, NatsServer, Runtime, Worker
from plexus.runtime.cli import main
from plexus.runtime.kernel import raise_on_denial
from plexus.runtime.ops._security import security_init

from .conftest import Secured, connect_as, operator_topology

pytestmark = pytest.mark.timeout(180)

#: Pool `books` serves `ledger` and `audit_log`; pool `shapes` serves `tree` and the stateless `echo_fast`.
GROUPS = {"acme": {"books": ["ledger", "audit_log"], "shapes": ["tree", "echo_fast"]}}

books = App()
shapes = App()


class _Counter(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        await ctx.emit_progress("thinking", [TextBlock(text=f"message {self.state['n']}")])
        await ctx.stream("delta")
        return [TextBlock(text=str(self.state["n"]))]


books.agent("ledger")(type("Ledger", (_Counter,), {}))
books.agent("audit_log")(type("AuditLog", (_Counter,), {}))


@shapes.agent("tree")
class Tree(Agent):
    """Sends to another pool's type: sending to any type is every worker's."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        reply = await ctx.send(blocks, AgentId("ledger", f"{ctx.agent_id.key}-child"), timeout=60)
        return [TextBlock(text="tree:" + "".join(getattr(b, "text", "") for b in reply))]


@shapes.agent("echo_fast", durable=False)
class EchoFast(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return list(blocks)


@pytest.fixture
def pools(tmp_path: Path) -> Iterator[Secured]:
    layout = security_init(tmp_path / "security", ["acme"], worker_groups=GROUPS)
    server = NatsServer(store_dir=tmp_path / "nats", extra_config=layout.config.read_text())
    server.start()
    try:
        yield Secured(server, layout, tmp_path)
    finally:
        server.cleanup()


@contextlib.asynccontextmanager
async def _runtime(sec: Secured, identity: str) -> AsyncIterator[Runtime]:
    rt = await Runtime.connect(sec.url, auth=sec.auth("acme", identity))
    try:
        yield rt
    finally:
        await rt.close()


@contextlib.asynccontextmanager
async def _worker(sec: Secured, app: App, identity: str) -> AsyncIterator[Worker]:
    async with _runtime(sec, identity) as rt:
        worker = Worker(app, rt)
        await worker.start()
        try:
            yield worker
        finally:
            await worker.stop(drain_timeout=5)


def _text(blocks: list[BaseBlock]) -> str:
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


async def test_each_pool_serves_its_own_types_as_its_own_user(pools: Secured) -> None:
    await operator_topology(pools, "acme")
    async with (
        _worker(pools, books, "worker-books"),
        _worker(pools, shapes, "worker-shapes"),
        _runtime(pools, "client") as client,
    ):
        async with asyncio.timeout(60):
            for agent_type in ("ledger", "audit_log", "tree", "echo_fast"):
                while not await client.workers(agent_type):  # noqa: ASYNC110 - another connection's state
                    await asyncio.sleep(0.2)
        # `audit_log` is `audit_5Flog` in subjects and keys: its checkpoint must be its worker's to write.
        replies = [
            _text(await client.send_message([TextBlock(text="x")], AgentId("audit_log", "k"), timeout=30))
            for _ in range(2)
        ]
        assert replies == ["1", "2"]
        tree = await client.send_message([TextBlock(text="x")], AgentId("tree", "t"), timeout=60)
        assert _text(tree) == "tree:1"
        echo = await client.send_message([TextBlock(text="hi")], AgentId("echo_fast", "e"), timeout=30)
        assert _text(echo) == "hi"
    assert pools.violations() == []  # nothing either pool needs was refused


async def _denied(work: Awaitable[Any], rt: Runtime) -> PermissionDeniedError:
    with pytest.raises(PermissionDeniedError) as denied:
        await raise_on_denial(work, rt.nc)
    assert denied.value.user == "acme-worker-books"
    return denied.value


async def _subscribed(rt: Runtime, subject: str) -> None:
    await rt.nc.subscribe(subject)
    await rt.nc.flush()
    await asyncio.sleep(5)  # generous: the server's refusal arrives within it


async def test_a_pool_is_denied_another_pools_types(pools: Secured) -> None:
    await operator_topology(pools, "acme")
    async with _runtime(pools, "worker-books") as rt:
        # Hosting the other pool's types: its registration is refused, typed, at once.
        with pytest.raises(PermissionDeniedError) as hosting:
            await Worker(shapes, rt).start()
        assert hosting.value.subject == "$kv.plexus_registry.default.tree"  # nats-py lower-cases it
    async with _runtime(pools, "worker-books") as rt:
        checkpoints = await rt.js.key_value("plexus_checkpoints")
        leases = await rt.js.key_value("plexus_leases")
        # Its own types' state: acknowledged.
        await raise_on_denial(checkpoints.put("default.audit_5Flog.k", b"{}"), rt.nc)
        # The other pool's state: checkpoints, EventLogs, leases.
        await _denied(checkpoints.put("default.tree.k", b"{}"), rt)
        await _denied(checkpoints.put("default.echo_5Ffast.k", b"{}"), rt)
        await _denied(rt.js.publish("px.default.evlog.tree.k", b"{}"), rt)
        await _denied(leases.create("default.tree.0", b"{}"), rt)
        # The other pool's inbox partitions and stateless inbox.
        steal = ConsumerConfig(
            name="steal",
            durable_name="steal",
            filter_subject="px.default.inp.tree.0.>",
            ack_policy=AckPolicy.EXPLICIT,
        )
        denied = await _denied(rt.js.add_consumer("PLEXUS_INBOX", steal), rt)
        assert denied.subject.startswith("$js.api.consumer.create.plexus_inbox.steal.")
        denied = await _denied(_subscribed(rt, "px.default.eph.echo_5Ffast.*"), rt)
        assert denied.operation == "subscribe to"
    async with connect_as(pools, "acme", "worker-books") as books_user:
        # Progress and token deltas in the other pool's agents' name.
        assert await books_user.refused("px.default.progress.run_x.tree.k")
        assert await books_user.refused("px.default.stream.tree.k")
        assert await books_user.refused("$KV.plexus_registry.default.echo_5Ffast")
        # Sending to any type stays every worker's (a pool's agents call the others').
        ack = await books_user.nc.request("px.default.in.tree.k", b"", timeout=5)
        assert json.loads(ack.data)["stream"] == "PLEXUS_INBOX"


async def test_a_pool_can_neither_learn_nor_guess_another_pools_partition_consumers(pools: Secured) -> None:
    """Issue 36: names of inbox partition consumers were listable (``CONSUMER.NAMES``) and predictable
    (``…__<lease revision>``), and a name is all it takes to pull from, ack on or delete a consumer."""
    await operator_topology(pools, "acme")
    async with _worker(pools, shapes, "worker-shapes"), _runtime(pools, "operator") as operator:
        records = operator.topology.consumers
        async with asyncio.timeout(60):
            while len(await records.keys()) < operator.partitions:  # noqa: ASYNC110 - the worker's takes
                await asyncio.sleep(0.2)
        theirs = {((await records.get(key)).value or b"").decode() for key in await records.keys()}
        inbox = {info.name for info in await operator.js.consumers_info("PLEXUS_INBOX")}
        assert theirs <= inbox
        async with connect_as(pools, "acme", "worker-books") as books_user:
            # It cannot list the inbox's consumers, read their records, or watch them being made.
            assert await books_user.refused("$JS.API.CONSUMER.NAMES.PLEXUS_INBOX")
            assert await books_user.refused("$JS.API.CONSUMER.LIST.PLEXUS_INBOX")
            record = "$KV.plexus_consumers.default.tree.0"
            assert await books_user.refused(f"$JS.API.DIRECT.GET.KV_plexus_consumers.{record}")
            assert await books_user.refused("$JS.API.DIRECT.GET.KV_plexus_consumers")
            assert await books_user.refused("$JS.API.STREAM.MSG.GET.KV_plexus_consumers")
            assert await books_user.refused("$JS.API.CONSUMER.CREATE.KV_plexus_consumers")
            assert await books_user.refused(record)  # nor point the next owner at a consumer of its choice
            # A name as it used to be made (the lease revision) names no consumer: deleting it finds nothing.
            for partition in range(operator.partitions):
                for epoch in range(1, 40):
                    answer = await books_user.nc.request(
                        f"$JS.API.CONSUMER.DELETE.PLEXUS_INBOX.px__default__tree__{partition}__{epoch}",
                        b"",
                        timeout=5,
                    )
                    assert json.loads(answer.data)["error"]["err_code"] == 10014, answer.data  # not found
        async with _runtime(pools, "worker-books") as rt:
            for subject in ("$JS.EVENT.ADVISORY.CONSUMER.>", "$JS.EVENT.>", "$KV.plexus_consumers.>"):
                denied = await _denied(_subscribed(rt, subject), rt)
                assert denied.operation == "subscribe to"
        # Every consumer of the other pool is still there.
        assert theirs <= {info.name for info in await operator.js.consumers_info("PLEXUS_INBOX")}


def test_init_writes_an_identity_per_worker_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sec"
    args = ["security", "init", str(out), "--tenant", "acme", "--mtls"]
    assert main([*args, "--worker-group", "books:ledger,audit_log", "--worker-group", "tree"]) == 0
    printed = capsys.readouterr().out
    assert "acme/worker-books:" in printed
    for group in ("books", "tree"):
        env_file = out / "env" / "acme" / f"worker-{group}.env"
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        assert json.loads(env["PLEXUS_NATS_USER"]) == f"acme-worker-{group}"
        assert json.loads(env["PLEXUS_NATS_INBOX_PREFIX"]) == f"_INBOX.acme_worker_{group}"
        assert (out / "tls" / f"acme-worker-{group}.pem").exists()
    config = (out / "nats-security.conf").read_text()
    assert '"$KV.plexus_checkpoints.*.audit_5Flog.>"' in config  # the escaped token, as keys carry it
    assert '"px.*.eph.tree.*"' in config  # `tree` alone: the group's name is its type


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "a", "--tenant", "b", "--worker-group", "g:x"], "name its tenant (TENANT/NAME)"),
        (["--tenant", "a", "--worker-group", "c/g:x"], "worker groups of tenants not given"),
        (["--tenant", "a", "--worker-group", "g:x", "--worker-group", "a/g:y"], "a/g is given twice"),
        (["--tenant", "a", "--worker-group", "g:"], "--worker-group expects"),
        (["--tenant", "a", "--worker-group", "g:x,,y"], "agent type must match"),
        (["--tenant", "a", "--worker-group", "bad name:x"], "worker group must match"),
        (["--tenant", "a", "--worker-types", "a=x,"], "agent type must match"),
    ],
)
def test_bad_worker_groups_are_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["security", "init", str(tmp_path / "sec"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plexus: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_permissions_prints_a_worker_groups_user_for_nsc(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["security", "permissions", "worker", "--tenant", "acme", "--worker-types", "audit_log"]
    assert main([*args, "--group", "books", "--nsc"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("nsc add user --name acme_worker_books --account acme ")
    assert "_INBOX.acme_worker_books.>" in line
    assert "$KV.plexus_registry.*.audit_5Flog," in line
    assert main(["security", "permissions", "client", "--tenant", "acme", "--group", "books"]) == 2
    assert "--group is a worker group's" in capsys.readouterr().err
