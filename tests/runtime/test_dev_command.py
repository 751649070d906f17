"""`plexus dev` as a user runs it: a taken dashboard port falls back to a free one (never no dashboard), a
part that cannot start fails the command with one line, and the JetStream store goes away on exit
unless --keep."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
DEV = [sys.executable, "-m", "plexus.runtime.cli", "dev", "tests.gateway.apps:app"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLEXUS_")}
    env["PYTHONPATH"] = str(REPO)
    return {**env, **extra}


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=sink, stderr=subprocess.STDOUT)


def _read(log: Path) -> str:
    return log.read_text()


def _store_of(text: str) -> Path:
    found = re.search(r"\(JetStream store (\S+)\)", text)
    assert found is not None, text[-3000:]
    return Path(found.group(1))


async def _serving(proc: subprocess.Popen[bytes], log: Path) -> str:
    async with asyncio.timeout(120):
        while "plexus dev: serving on" not in _read(log):
            assert proc.poll() is None, _read(log)[-3000:]
            await asyncio.sleep(0.2)
    return _read(log)


async def _interrupt(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return await asyncio.to_thread(proc.wait, 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


async def test_a_taken_gateway_port_falls_back_to_a_free_one_and_the_store_is_removed(
    tmp_path: Path, taken_port: int
) -> None:
    log = tmp_path / "dev.log"
    proc = _start([*DEV, "--gateway-port", str(taken_port)], log)
    try:
        text = await _serving(proc, log)
        assert f"plexus dev: port {taken_port} is taken; the gateway takes a free port" in text
        found = re.search(r"dashboard at (http://127\.0\.0\.1:(\d+))/", text)
        assert found is not None, text[-3000:]
        assert int(found.group(2)) != taken_port
        async with httpx.AsyncClient(base_url=found.group(1), timeout=10) as client:
            assert (await client.get("/")).status_code == 200
        store = _store_of(text)
        assert store.is_dir()
        assert await _interrupt(proc) == 0
        assert not store.exists()  # removed on exit (no --keep)
        assert "plexus dev: stopped" in _read(log)
    finally:
        if proc.poll() is None:
            await _interrupt(proc)


async def test_keep_leaves_the_store(tmp_path: Path) -> None:
    log = tmp_path / "dev.log"
    proc = _start([*DEV, "--keep", "--gateway-port", "0"], log)
    try:
        store = _store_of(await _serving(proc, log))
        assert await _interrupt(proc) == 0
        assert store.is_dir()
        assert f"plexus dev: the JetStream store is kept in {store} (--keep)" in _read(log)
    finally:
        if proc.poll() is None:
            await _interrupt(proc)
        if "JetStream store" in _read(log):
            shutil.rmtree(_store_of(_read(log)), ignore_errors=True)


def test_a_part_that_cannot_start_fails_dev_with_one_line() -> None:
    # The gateway cannot listen on an address that does not exist: it exits 1 while starting.
    env = _env(PLEXUS_GATEWAY_HOST="256.0.0.1")
    out = subprocess.run(
        [*DEV, "--gateway-port", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=150
    )
    assert out.returncode == 1, out.stdout[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("plexus dev: error:")]
    assert errors == [
        "plexus dev: error: the gateway exited with status 1 (its output is above); all stopped"
    ]
    assert "plexus gateway: error: cannot listen on 256.0.0.1:0" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    assert "plexus dev: serving on" not in out.stdout
    assert not _store_of(out.stdout).exists()
