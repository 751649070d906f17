"""Issue 36's security papercuts: `plexus security init`'s closing hint is the documented command, the
system account's user is written down (server monitoring needs it), and TLS connections no longer make
asyncio warn about `eof_received()` on every process."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import nats
import pytest

from plexus.runtime import Runtime
from plexus.runtime.cli import main
from plexus.runtime.kernel import NatsAuth

from .conftest import REPO, Secured, operator_topology

pytestmark = pytest.mark.timeout(120)


def test_init_ends_with_the_documented_topology_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["security", "init", str(tmp_path / "sec"), "--tenant", "acme"]) == 0
    hint = capsys.readouterr().out.splitlines()[-1]
    assert "plexus topology --replicas 3" in hint
    assert "plexus topology --replicas 3" in (REPO / "docs" / "security.md").read_text()


async def test_the_system_accounts_user_can_monitor_the_servers(secured: Secured) -> None:
    sys_env = secured.layout.sys_env
    assert sys_env is not None
    assert stat.S_IMODE(sys_env.stat().st_mode) == 0o600
    env = {
        name: json.loads(value)
        for name, _, value in (line.partition("=") for line in sys_env.read_text().splitlines())
    }
    nc = await nats.connect(secured.url, allow_reconnect=False, **NatsAuth.from_env(env).connect_options())
    try:
        answer = await nc.request("$SYS.REQ.SERVER.PING", b"", timeout=5)
    finally:
        await nc.close()
    assert json.loads(answer.data)["server"]["id"]


async def test_tls_connections_do_not_warn_about_eof(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    await operator_topology(secured, "acme")
    rt = await Runtime.connect(secured.url, auth=secured.auth("acme", "client"))
    await rt.close()
    assert [r.getMessage() for r in caplog.records if "eof_received" in r.getMessage()] == []
