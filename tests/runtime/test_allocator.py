"""Issue 42, item 4: `plexus worker --allocator jemalloc` (``PLEXUS_ALLOCATOR``) restarts the worker on
jemalloc, which gives memory back after a burst of activations is passivated (the figure is `make bench`'s),
and every way it can fail says so at start with exit status 2 instead of running on the wrong allocator."""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from plexus.runtime import NatsServer
from plexus.runtime.cli import main
from plexus.runtime.kernel import AllocatorError, allocator_in_use, use_allocator
from tests.debian import ensure_debian_package
from tests.processes import plexus_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="preloading is Linux's")

REPO = Path(__file__).resolve().parents[2]
APP = "tests.runtime.apps_misc:app"
JEMALLOC = f"/usr/lib/{sysconfig.get_config_var('MULTIARCH')}/libjemalloc.so.2"
#: A real shared library that is not jemalloc (this process's C library): a preload of it loads, and leaves
#: CPython's allocator in place.
NOT_JEMALLOC = next(
    line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in line
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONMALLOC", "MALLOC_CONF")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _plexus(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plexus.runtime.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(**env),
        cwd=REPO,
        check=False,
    )


def _worker(
    argv: list[str], log: Path, **env: str
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    return plexus_process(["worker", APP, *argv], log, _env(**env))


def _serving_line(log: Path, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"^plexus worker .* serving .*$", log.read_text(errors="replace"), flags=re.M)
        if found:
            return found.group(0)
        time.sleep(0.1)
    raise AssertionError(f"the worker never served: {log.read_text(errors='replace')[-2000:]}")


def test_the_worker_restarts_itself_on_jemalloc_keeping_its_pid(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    ensure_debian_package("libjemalloc2", JEMALLOC)
    log = tmp_path / "worker.log"
    with _worker(["--nats", nats_server.url], log, PLEXUS_ALLOCATOR="jemalloc") as proc:
        assert _serving_line(log, proc).endswith("; allocator jemalloc")
        # The process that serves is the one started (exec, not a child), and it runs on jemalloc with
        # CPython's small-object allocator off and jemalloc's decay configured.
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libjemalloc" in maps
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{proc.pid}/environ").read_text().split("\0")
            if "=" in item
        )
        assert environ["PYTHONMALLOC"] == "malloc"
        assert "dirty_decay_ms:1000" in environ["MALLOC_CONF"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]


def test_the_default_allocator_is_cpythons_and_changes_nothing(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with _worker(["--nats", nats_server.url], log) as proc:
        assert "allocator" not in _serving_line(log, proc)
        assert "libjemalloc" not in Path(f"/proc/{proc.pid}/maps").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["--allocator", "tcmalloc"], {}, "invalid choice: 'tcmalloc'"),
        ([], {"PLEXUS_ALLOCATOR": "tcmalloc"}, "PLEXUS_ALLOCATOR"),
        (
            ["--allocator", "jemalloc"],
            {"PLEXUS_ALLOCATOR_LIBRARY": "/nonexistent/libjemalloc.so.2"},
            "the jemalloc library '/nonexistent/libjemalloc.so.2' does not exist",
        ),
        # A preload that loads but is not jemalloc: reported after the one restart, not restarted forever.
        (
            ["--allocator", "jemalloc"],
            {"PLEXUS_ALLOCATOR_LIBRARY": NOT_JEMALLOC},
            "but jemalloc is not loaded",
        ),
    ],
)
def test_an_allocator_that_cannot_be_had_stops_the_worker_at_start(
    argv: list[str], env: dict[str, str], said: str
) -> None:
    done = _plexus("worker", APP, "--nats", "nats://127.0.0.1:1", *argv, **env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr


def test_a_program_calling_main_is_not_replaced_by_a_restart(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", APP, "--allocator", "jemalloc"]) == 2
    assert "only for the `plexus` command itself" in capsys.readouterr().err


def test_jemalloc_missing_from_the_loader_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLEXUS_ALLOCATOR_REEXEC", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert allocator_in_use() == "python"
    with pytest.raises(AllocatorError, match="apt-get install libjemalloc2"):
        use_allocator("jemalloc")
    use_allocator("default")  # changes nothing, so never fails
