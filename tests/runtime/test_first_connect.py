"""A first connection to a URL where no NATS server answers: clients fail with one typed line, services wait
and still stop on SIGTERM / Ctrl-C (they once ignored both until SIGKILL), and a command never hangs."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plexus.runtime import NatsUnreachableError, Runtime
from tests.processes import REPO, plexus_process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PLEXUS_")}


@pytest.fixture
async def not_nats() -> AsyncIterator[str]:
    """A loopback TCP port that answers like an HTTP server, not a NATS one (a mistyped port)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.close()


async def test_a_client_gets_a_typed_error_naming_the_url_and_why() -> None:
    url = f"nats://127.0.0.1:{_free_port()}"
    with pytest.raises(NatsUnreachableError) as caught:
        await Runtime.connect(url, connect_wait_s=1.0)
    assert isinstance(caught.value, ConnectionError)
    assert caught.value.servers == [url]
    assert f"cannot connect to {url} within 1 s: " in str(caught.value)
    assert "Connect call failed" in str(caught.value), str(caught.value)


async def test_a_port_that_is_not_nats_is_named_too(not_nats: str) -> None:
    with pytest.raises(NatsUnreachableError) as caught:
        await Runtime.connect(not_nats, connect_wait_s=1.0)
    why = str(caught.value).split(" s: ", 1)[1]
    assert why.strip(), str(caught.value)  # nats-py's error here has no text of its own


async def test_a_bad_wait_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="connect wait"):
        await Runtime.connect(f"nats://127.0.0.1:{_free_port()}", connect_wait_s=0)


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), "PYTHONPATH": str(REPO)},
        cwd=REPO,
        check=False,
    )


async def test_client_commands_end_with_one_line_instead_of_hanging() -> None:
    url = f"nats://127.0.0.1:{_free_port()}"
    commands = [("types", "--nats", url), ("runs", "ls", "--nats", url), ("topology", "--nats", url)]
    done = await asyncio.gather(*(asyncio.to_thread(_command, *argv) for argv in commands))
    for argv, result in zip(commands, done, strict=True):
        assert result.returncode == 1, (argv, result.stdout, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, result.stderr[-2000:]
        [line] = [ln for ln in result.stderr.splitlines() if "error:" in ln]
        assert f"cannot connect to {url} within 10 s" in line, line


@pytest.mark.parametrize(
    ("service", "sig", "status"),
    [
        (["orchestrator"], signal.SIGTERM, -signal.SIGTERM),
        (["gateway", "--dev", "--port", "0"], signal.SIGINT, 130),
    ],
)
def test_a_service_waits_for_its_server_and_still_stops_on_a_signal(
    tmp_path: Path, service: list[str], sig: signal.Signals, status: int
) -> None:
    url = f"nats://127.0.0.1:{_free_port()}"
    log = tmp_path / "service.log"
    with plexus_process([*service, "--nats", url], log, _env()) as proc:
        deadline = time.monotonic() + 60
        while "Connect call failed" not in log.read_text(errors="replace"):  # it is trying, not gone
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        os.kill(proc.pid, sig)
        assert proc.wait(timeout=30) == status, log.read_text(errors="replace")[-2000:]
