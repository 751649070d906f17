"""Issue 36 item 4: a permission the identity lacks is a typed `PermissionDeniedError` (subject, operation,
user) raised at once, and a CLI says it in one line with a non-zero status; it is not waited out as an
outage (a worker started with the client's credentials retried for ~130 s, then died with a traceback)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys

import pytest

from plexus.core import PermissionDeniedError
from plexus.runtime import Runtime
from plexus.runtime.kernel import raise_on_denial

from .conftest import APP, REPO, Secured, operator_topology

pytestmark = pytest.mark.timeout(180)


def _plexus(sec: Secured, role: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLEXUS_NATS")}
    env.update(sec.layout.env("acme", role))
    env["PYTHONPATH"] = str(REPO)
    # Generous: before the fix these took 10 s (tokens) and ~130 s (worker).
    return subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", *args, "--nats", sec.url],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )


async def test_connecting_without_a_needed_permission_raises_it_typed(secured: Secured) -> None:
    # No topology yet, and the client may not create one: the stream creation is refused, typed.
    with pytest.raises(PermissionDeniedError) as denied:
        await Runtime.connect(secured.url, auth=secured.auth("acme", "client"), replicas=1)
    err = denied.value
    assert err.user == "acme-client"
    assert err.operation == "publish to"
    assert err.subject.startswith("$js.api.stream.create.")  # nats-py lower-cases the server's text


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("worker", APP), "may not "),  # a worker as the client: a worker's first subscription or write
        (("tokens", "create", "ci"), "may not publish to '$js.api.consumer."),  # the operator's bucket
        (("sessions", "ls"), "may not publish to '$js.api.consumer."),  # sessions are the gateway's
    ],
)
async def test_a_cli_run_without_a_permission_fails_in_one_line(
    secured: Secured, args: tuple[str, ...], fragment: str
) -> None:
    await operator_topology(secured, "acme")
    done = _plexus(secured, "client", *args)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "PermissionDeniedError" in line]
    assert len(errors) == 1, done.stderr
    assert "user 'acme-client'" in errors[0], errors[0]
    assert fragment in errors[0], errors[0]


async def test_an_orchestrator_started_without_a_permission_fails_in_one_line(secured: Secured) -> None:
    # The worker's credentials lack the orchestrator's permissions (the runs bucket is the orchestrator's):
    # before the fix the replica waited for answers that never come instead of saying which one it lacks.
    await operator_topology(secured, "acme")
    done = _plexus(secured, "worker", "orchestrator")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "PermissionDeniedError" in line]
    assert len(errors) == 1, done.stderr
    assert "user 'acme-worker'" in errors[0], errors[0]
    assert re.search(r"may not (publish|subscribe) to '[^']+'", errors[0]), errors[0]  # names the subject


async def test_a_denial_stops_work_that_dropped_a_cancellation(secured: Secured) -> None:
    # nats-py drops a cancellation that lands in a publish's flush; `raise_on_denial` used to wait for such
    # work to end on its own (an orchestrator's start retried for a minute) instead of raising.
    await operator_topology(secured, "acme")
    rt = await Runtime.connect(secured.url, auth=secured.auth("acme", "client"))
    stopped = asyncio.Event()

    async def stubborn() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    try:
        work = asyncio.ensure_future(raise_on_denial(stubborn(), rt.nc))
        await asyncio.sleep(0.1)  # the work is waiting
        await rt.nc.publish("$JS.API.STREAM.CREATE.NOT_YOURS", b"{}")  # the client may not create streams
        # Not wait_for: cancelling `raise_on_denial` at the bound would itself stop the work.
        await asyncio.wait({work}, timeout=30)
        assert work.done(), "the denial was not raised within 30 s"
        with pytest.raises(PermissionDeniedError) as denied:
            work.result()
        assert denied.value.subject == "$js.api.stream.create.not_yours"
        assert stopped.is_set()
    finally:
        await rt.close()
