"""Issue 36 item 3: every documented client command (docs/gateway.md's `plexus runs`, `plexus agents`,
`plexus types`, `plexus schedules`) works as the tenant's `client` user, with no permission violation in the
server log; time travel's `plexus runs export/fork` are the operator's and fail as the client in one line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from plexus.runtime import Runtime

from .conftest import APP, REPO, Secured, operator_topology

pytestmark = pytest.mark.timeout(240)


def _plexus(sec: Secured, role: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """`plexus ARGS` as `role` (its env file only), to completion."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLEXUS_NATS")}
    env.update(sec.layout.env("acme", role))
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", *args, "--nats", sec.url],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


async def test_every_client_command_works_as_the_client(secured: Secured) -> None:
    await operator_topology(secured, "acme")
    secured.spawn("acme", "worker", "worker", APP)
    secured.spawn("acme", "orchestrator", "orchestrator")
    client = await Runtime.connect(secured.url, auth=secured.auth("acme", "client"))
    try:
        async with asyncio.timeout(60):
            while not await client.workers("tree"):  # noqa: ASYNC110 - another process's state
                await asyncio.sleep(0.2)
    finally:
        await client.close()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = _plexus(secured, "client", *args)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
        return done

    started = await asyncio.to_thread(run, "runs", "start", "tree/t1", "go", "--watch")
    run_id = started.stdout.splitlines()[0].strip()
    for args in (
        ("runs", "ls"),
        ("runs", "ls", "--all", "--json"),
        ("runs", "show", run_id),
        ("runs", "show", run_id, "--json"),
        ("runs", "watch", run_id),
        ("runs", "watch", run_id, "--json"),
        ("runs", "start", "ledger/solo", "hello"),
        ("agents",),
        ("agents", "--json"),
        ("types",),
        # Schedules are client commands too (docs/schedules.md).
        ("schedules", "create", "nightly", "ledger/cron", "tick", "--cron", "0 3 * * *"),
        ("schedules", "ls"),
        ("schedules", "pause", "nightly"),
        ("schedules", "resume", "nightly"),
        ("schedules", "rm", "nightly"),
    ):
        await asyncio.to_thread(run, *args)
    second = (await asyncio.to_thread(run, "runs", "start", "tree/t2", "x")).stdout.strip()
    await asyncio.to_thread(run, "runs", "cancel", second)
    assert secured.violations() == []

    # Time travel reads every agent's EventLog and checkpoints, which the client role may not: it is the
    # operator's (or the gateway's HTTP routes'). As the client it fails at once, in one line naming what.
    for args in (("runs", "export", run_id), ("runs", "fork", run_id)):
        denied = await asyncio.to_thread(_plexus, secured, "client", *args)
        assert denied.returncode == 1, (args, denied.stdout, denied.stderr)
        (line,) = denied.stderr.strip().splitlines()
        assert "PermissionDeniedError: user 'acme-client' may not publish to" in line, line
    exported = await asyncio.to_thread(_plexus, secured, "operator", "runs", "export", run_id)
    assert exported.returncode == 0, exported.stderr
    assert '"plexus-run-recording"' in exported.stdout.splitlines()[0]
    forked = await asyncio.to_thread(_plexus, secured, "operator", "runs", "fork", run_id)
    assert forked.returncode == 0, forked.stderr
    # The refusals above are the only violations: what they tried to read, nothing else.
    violations = secured.violations()
    assert all("acme-client" in v and "PLEXUS_EVENTS" in v for v in violations), violations
