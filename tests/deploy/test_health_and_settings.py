"""Issue 15, item 3: /healthz and /readyz on workers and orchestrators (for probes), and configuration by
PLEXUS_* environment variables (pydantic-settings) that `--help` documents and that refuse bad values."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from plexus.runtime import NatsServer
from plexus.runtime.kernel import HealthServer, NatsSettings, load_settings
from plexus.runtime.ops._settings import WorkerSettings
from tests.processes import plexus_process

REPO = Path(__file__).resolve().parents[2]
APP = "tests.runtime.apps_misc:app"
#: A `plexus dev --run` script that is never reached: the command is refused before it would run.
RUN = "tests.runtime.apps_misc:app"


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _plexus(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        cwd=REPO,
        check=False,
    )


# -- the server itself -----------------------------------------------------------------------------------
async def test_health_server_reports_readiness_checks_and_a_blocked_loop() -> None:
    state = {"nats": True, "serving": True}
    health = HealthServer(lambda: dict(state), stall_s=0.5)
    await health.start()
    base = f"http://127.0.0.1:{health.port}"
    try:
        assert await asyncio.to_thread(_get, f"{base}/readyz") == (200, {"ready": True, **state})
        state["nats"] = False
        status, body = await asyncio.to_thread(_get, f"{base}/readyz")
        assert (status, body["ready"], body["nats"]) == (503, False, False)
        status, body = await asyncio.to_thread(_get, f"{base}/healthz")
        assert (status, body["ok"]) == (200, True)
        # A handler that blocks the event loop: liveness fails while it lasts (asked from another thread,
        # as a probe would), and recovers afterwards.
        seen: list[tuple[int, dict[str, object]]] = []

        def ask_later() -> None:
            time.sleep(0.9)
            seen.append(_get(f"{base}/healthz"))

        probe = threading.Thread(target=ask_later)
        probe.start()
        time.sleep(1.5)  # noqa: ASYNC251 - blocks the loop on purpose
        probe.join()
        assert seen[0][0] == 503
        assert float(str(seen[0][1]["loop_lag_s"])) >= 0.5
        await asyncio.sleep(0.3)
        assert (await asyncio.to_thread(_get, f"{base}/healthz"))[0] == 200
        assert (await asyncio.to_thread(_get, f"{base}/nothing"))[0] == 404
    finally:
        await health.stop()


async def test_a_failing_readiness_check_is_not_ready() -> None:
    def broken() -> dict[str, bool]:
        raise RuntimeError("cannot tell")

    health = HealthServer(broken, alive=lambda: False)
    await health.start()
    try:
        status, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{health.port}/readyz")
        assert (status, body["ready"]) == (503, False)
        status, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{health.port}/healthz")
        assert (status, body["ok"]) == (503, False)  # alive() said the process is done for
    finally:
        await health.stop()


# -- real processes ------------------------------------------------------------------------------------
def _health_port(log: Path, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(r"health on port (\d+)", log.read_text(errors="replace"))
        if found:
            return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no health port announced: {log.read_text(errors='replace')[-2000:]}")


def _until(url: str, status: int, timeout_s: float = 20.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    last: tuple[int, dict[str, object]] | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            last = _get(url)
            if last[0] == status:
                return last[1]
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered {status}; last {last}")


def test_worker_probes_follow_its_nats_connection(nats_server: NatsServer, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    env = {"PLEXUS_NATS": nats_server.url, "PLEXUS_HEALTH_PORT": "0"}  # settings from the environment
    with plexus_process(["worker", APP, "--lease-ttl", "3"], log, {**os.environ, **env}) as proc:
        base = f"http://127.0.0.1:{_health_port(log)}"
        assert _until(f"{base}/readyz", 200) == {"ready": True, "nats": True, "serving": True}
        nats_server.port = nats_server.client_port or -1  # come back where the worker reconnects to
        nats_server.stop()
        # Reconnecting: not ready (send it no traffic), but alive (restarting would not help).
        body = _until(f"{base}/readyz", 503)
        assert body["nats"] is False
        assert _get(f"{base}/healthz")[0] == 200
        nats_server.start()
        _until(f"{base}/readyz", 200, timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]


def test_orchestrator_serves_probes(nats_server: NatsServer, tmp_path: Path) -> None:
    log = tmp_path / "orchestrator.log"
    with plexus_process(
        ["orchestrator", "--nats", nats_server.url, "--health-port", "0"], log, dict(os.environ)
    ) as proc:
        base = f"http://127.0.0.1:{_health_port(log)}"
        assert _until(f"{base}/readyz", 200) == {"ready": True, "nats": True, "serving": True}
        probe = _plexus("probe", f"{base}/readyz")
        assert probe.returncode == 0
        assert '"ready": true' in probe.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    refused = _plexus("probe", f"{base}/readyz", "--timeout", "2")
    assert refused.returncode == 1
    assert "plexus probe" in refused.stderr


# -- settings ------------------------------------------------------------------------------------------
def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLEXUS_NATS", "nats://a:4222, tls://b:4222")
    monkeypatch.setenv("PLEXUS_CONCURRENCY", "8")
    monkeypatch.setenv("PLEXUS_LEASE_TTL", "2.5")
    settings = load_settings(WorkerSettings)
    assert settings.nats == ["nats://a:4222", "tls://b:4222"]
    assert (settings.concurrency, settings.lease_ttl, settings.health_port) == (8, 2.5, None)
    monkeypatch.delenv("PLEXUS_NATS")
    assert load_settings(NatsSettings).nats == ["nats://127.0.0.1:4222"]


@pytest.mark.parametrize(
    ("command", "env", "named"),
    [
        (["worker", APP], {"PLEXUS_CONCURRENCY": "0"}, "PLEXUS_CONCURRENCY"),
        (["worker", APP], {"PLEXUS_NATS": "http://example:4222"}, "PLEXUS_NATS"),
        (["worker", APP], {"PLEXUS_HEALTH_PORT": "70000"}, "PLEXUS_HEALTH_PORT"),
        (["orchestrator"], {"PLEXUS_NATS": ""}, "PLEXUS_NATS"),
        (["gateway", "--dev"], {"PLEXUS_GATEWAY_PORT": "http"}, "PLEXUS_GATEWAY_PORT"),
        # `runs` and `agents` once said so with status 1 and their own prefix.
        (["runs", "ls"], {"PLEXUS_NATS_PASSWORD": "x"}, "a password needs a user"),
        (["agents"], {"PLEXUS_NATS": "http://example:4222"}, "PLEXUS_NATS"),
    ],
)
def test_a_bad_environment_variable_is_refused_by_name(
    command: list[str], env: dict[str, str], named: str
) -> None:
    done = _plexus(*command, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert named in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("command", "env", "named"),
    [
        (["worker", APP, "--ack-wait", "0"], {}, "--ack-wait: must be a number of seconds above 0"),
        (["worker", APP, "--lease-ttl", "0"], {}, "--lease-ttl: must be a number of seconds above 0"),
        (
            ["worker", APP, "--heartbeat-ttl", "-3"],
            {},
            "--heartbeat-ttl: must be a number of seconds above 0",
        ),
        (
            ["dev", APP, "--run", RUN],
            {"PLEXUS_GATEWAY_PORT": "abc"},
            "PLEXUS_GATEWAY_PORT: expected a TCP port",
        ),
        (["dev", APP, "--gateway-port", "99999"], {}, "--gateway-port: expected a TCP port"),
        (["gateway", "--dev", "--port", "99999"], {}, "--port: expected a TCP port"),
        (["mcp", "serve", "--http", "-1"], {}, "--http: expected a TCP port"),
        (["runs", "start", "assistant/", "hi"], {}, "agent key must not be empty"),
        (["runs", "start", "a/b", "hi", "--max-tokens", "-5"], {}, "--max-tokens: must be at least 1"),
        (["runs", "ls", "--status", "bogus"], {}, "--status: invalid choice: 'bogus'"),
        (["dev", APP, "--once"], {}, "--once stops plexus dev when its --run script ends"),
    ],
)
def test_a_bad_value_is_one_line_before_anything_starts(
    command: list[str], env: dict[str, str], named: str
) -> None:
    """Values that once failed far from their flag: a pydantic dump of several lines, an `OverflowError` from
    `bind()`, a `ValueError` from the topology, or (``--ack-wait 0``) nothing at all."""
    done = _plexus(*command, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = [ln for ln in done.stderr.splitlines() if "error:" in ln]
    assert named in line, line


def test_the_server_refusing_a_workers_replicas_is_one_line(nats_server: NatsServer) -> None:
    done = _plexus("worker", APP, "--replicas", "3", "--nats", nats_server.url, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "plexus: error: cannot create the topology with 3 replica(s): " in done.stderr


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["worker", APP, "--health-port", "{port}"], "the health endpoint cannot listen on 127.0.0.1:{port}"),
        (["orchestrator"], "the metrics endpoint cannot listen on 127.0.0.1:{port}"),
    ],
)
def test_a_taken_health_or_metrics_port_is_one_line(
    nats_server: NatsServer, command: list[str], named: str
) -> None:
    port = str(nats_server.client_port)  # taken: the server listens there
    argv = [arg.replace("{port}", port) for arg in command]
    env = {"PLEXUS_NATS": nats_server.url, "PLEXUS_METRICS_PORT": port if "orchestrator" in argv else ""}
    done = _plexus(*argv, env={k: v for k, v in env.items() if v}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert named.replace("{port}", port) in done.stderr, done.stderr[-2000:]


def test_help_documents_every_setting() -> None:
    shown = _plexus("worker", "--help").stdout
    for name in WorkerSettings.model_fields:
        assert f"PLEXUS_{name.upper()}" in shown
    assert "PLEXUS_HEALTH_PORT" in _plexus("orchestrator", "--help").stdout
    assert "PLEXUS_GATEWAY_TOKEN_HASHES" in _plexus("gateway", "--help").stdout


def test_topology_command_creates_the_streams(nats_server: NatsServer) -> None:
    done = _plexus("topology", "--replicas", "1", env={"PLEXUS_NATS": nats_server.url})
    assert done.returncode == 0, done.stderr
    assert "PLEXUS_INBOX\treplicas 1" in done.stdout
    assert "topology ready" in done.stdout
    # On a single node, three replicas cannot be placed: a clear error, not a traceback.
    refused = _plexus("topology", "--replicas", "3", "--nats", nats_server.url, timeout=120)
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr, refused.stderr[-2000:]


def test_a_bare_topology_run_keeps_the_ttls_it_finds(nats_server: NatsServer) -> None:
    """docs/operations.md's upgrade step is a bare ``plexus topology``: what its flags leave out is what the
    topology has, so it must not reset TTLs the operator chose (the flags' defaults once did)."""
    env = {"PLEXUS_NATS": nats_server.url}
    chosen = _plexus("topology", "--lease-ttl", "7", "--heartbeat-ttl", "6", env=env)
    assert "with 1 replica(s), lease TTL 7s, heartbeat TTL 6s" in chosen.stdout, chosen.stdout + chosen.stderr
    bare = _plexus("topology", env=env)
    assert bare.returncode == 0, bare.stderr
    assert "with 1 replica(s), lease TTL 7s, heartbeat TTL 6s" in bare.stdout, bare.stdout
    # Named, a flag still changes what it names (and only that).
    changed = _plexus("topology", "--lease-ttl", "12", env=env)
    assert "with 1 replica(s), lease TTL 12s, heartbeat TTL 6s" in changed.stdout, changed.stdout


def test_a_command_of_a_distribution_not_installed_says_which(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With only plexus-kernel-runtime installed, argparse alone said "invalid choice: 'orchestrator'"."""
    import plexus.runtime.cli as cli

    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    assert cli.main(["orchestrator", "--nats", "nats://127.0.0.1:4222"]) == 2
    assert (
        "comes with plexus-kernel-orchestrator (pip install plexus-kernel-orchestrator)"
        in capsys.readouterr().err
    )
    assert cli.main(["runs", "ls"]) == 2
    assert "plexus-kernel-gateway" in capsys.readouterr().err


def test_plexus_dev_says_which_services_it_cannot_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import plexus.runtime._dev as dev

    monkeypatch.setattr(dev, "entry_points", lambda group: [])
    assert dev._installed_services("nats://127.0.0.1:4222") == []
    err = capsys.readouterr().err
    assert "plexus dev: no orchestrator (orchestrated runs" in err
    assert "pip install plexus-kernel-orchestrator" in err
    assert "plexus dev: no gateway (the dashboard" in err
