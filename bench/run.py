"""`make bench` / `make bench-quick`: Plexus against raw nats-py and AutoGen's gRPC runtime, in one run.

Starts its own nats-server, then for each system starts the serving side and a client as separate processes
(each client does its own warm-up and repeats), prints one table with ratios computed from this run's
medians, writes ``bench/results/latest.json`` and refreshes the table in ``docs/benchmarks.md``.

AutoGen is installed by this script into ``.bench-venv/autogen`` with uv (never a dependency of Plexus);
if that fails its column reads ``n/a (reason)``. So are the LLM loop's peers (`PEERS`: the OpenAI
Agents SDK, pydantic-ai, LangGraph), each into ``.bench-venv/<peer>``, for their rows
(`bench.peer_bench`; a peer that does not install has no rows). ``--loop uvloop`` installs uvloop into
``.bench-venv/uvloop`` (again outside the project's environment) and runs raw and Plexus processes on it
(the orchestrator the budget scenario needs is started as ``plexus orchestrator`` runs it, on asyncio).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from bench import report
from bench.common import READY, RESULT
from plexus.runtime import NatsServer

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
VENVS = REPO / ".bench-venv"
AUTOGEN_PINS = ("autogen-core==0.7.5", "autogen-ext[grpc]==0.7.5")
#: LLM-loop peers measured as Plexus is (`bench.peer_bench`): name -> (pins, what must import)
PEERS = {
    "openai-agents": (("openai-agents==0.24.0",), "import agents, openai"),
    "pydantic-ai": (("pydantic-ai-slim[openai]==2.68.0",), "import pydantic_ai, openai"),
    "langgraph": (
        ("langgraph==1.2.22", "langchain-openai==1.7.4"),
        "import langgraph.prebuilt, langchain_openai",
    ),
}


class BenchError(RuntimeError):
    """A bench process failed; the message says which and where its log is."""


class Procs:
    """Bench processes of one phase: started with logs, stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs = logs
        self.env = env
        self.started: list[subprocess.Popen[str]] = []
        self._files: list[IO[str]] = []

    def _log(self, name: str) -> IO[str]:
        log = (self.logs / f"{name}.log").open("w")
        self._files.append(log)
        return log

    def serve(self, name: str, cmd: list[str], timeout: float = 60.0, ready: str = READY) -> None:
        """Start a serving process and wait for a line starting with `ready` (failing fast if it exits
        first)."""
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log(name), text=True, cwd=REPO, env=self.env
        )
        self.started.append(proc)
        seen = threading.Event()

        def watch() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip().startswith(ready):
                    seen.set()

        threading.Thread(target=watch, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not seen.wait(0.05):
            if proc.poll() is not None:
                raise BenchError(f"{name} exited {proc.returncode} (log: {self.logs / name}.log)")
            if time.monotonic() > deadline:
                raise BenchError(f"{name} not ready in {timeout:.0f}s (log: {self.logs / name}.log)")

    def client(self, name: str, cmd: list[str], timeout: float) -> dict[str, Any]:
        """Run a client to completion and return its RESULT."""
        try:
            done = subprocess.run(
                cmd,
                stdout=subprocess.PIPE,
                stderr=self._log(name),
                text=True,
                cwd=REPO,
                env=self.env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BenchError(
                f"{name} did not finish in {timeout:.0f}s (log: {self.logs / name}.log)"
            ) from None
        for line in done.stdout.splitlines():
            if line.startswith(RESULT):
                result: dict[str, Any] = json.loads(line[len(RESULT) :])
                return result
        raise BenchError(f"{name} exited {done.returncode} without a result (log: {self.logs / name}.log)")

    def stop(self) -> None:
        for proc in reversed(self.started):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in reversed(self.started):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.started.clear()
        for log in self._files:
            log.close()
        self._files.clear()


@contextlib.contextmanager
def phase(logs: Path, env: dict[str, str]) -> Iterator[Procs]:
    procs = Procs(logs, env)
    try:
        yield procs
    finally:
        procs.stop()


# -- isolated environments -----------------------------------------------------------------------------
def find_uv(explicit: str | None) -> str | None:
    """The uv the Makefile uses: the one passed in, else one on PATH, else the private copy in .tools."""
    for candidate in (explicit, shutil.which("uv"), str(REPO / ".tools" / "bin" / "uv")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def _quiet(cmd: list[str], timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def ensure_autogen(uv: str | None) -> tuple[str | None, str]:
    """(python of the AutoGen venv, "") or (None, reason)."""
    return ensure_venv(uv, "autogen", AUTOGEN_PINS, "import autogen_ext.runtimes.grpc, autogen_core")


def ensure_venv(uv: str | None, name: str, pins: tuple[str, ...], probe_code: str) -> tuple[str | None, str]:
    """(python of ``.bench-venv/<name>`` with ``pins`` installed, "") or (None, reason). Reuses the venv when
    ``probe_code`` already runs in it."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    probe = [str(python), "-c", probe_code]
    if python.exists() and _quiet(probe).returncode == 0:
        return str(python), ""
    if uv is None:
        return None, "uv not found"
    made = _quiet([uv, "venv", "--quiet", "--python", sys.executable, str(venv)])
    if made.returncode != 0:
        return None, "uv venv failed: " + _last_line(made.stderr)
    installed = _quiet([uv, "pip", "install", "--quiet", "--python", str(python), *pins])
    if installed.returncode != 0:
        return None, "install failed: " + _last_line(installed.stderr)
    if _quiet(probe).returncode != 0:
        return None, f"{' '.join(pins)} does not import"
    return str(python), ""


def ensure_uvloop(uv: str | None) -> str:
    """A directory holding uvloop, for PYTHONPATH (kept out of the project's venv on purpose)."""
    target = VENVS / "uvloop"
    if (target / "uvloop").is_dir():
        return str(target)
    if uv is None:
        raise BenchError("--loop uvloop needs uv to install uvloop into .bench-venv/uvloop")
    done = _quiet(
        [uv, "pip", "install", "--quiet", "--python", sys.executable, "--target", str(target), "uvloop"]
    )
    if done.returncode != 0:
        raise BenchError("installing uvloop failed: " + _last_line(done.stderr))
    return str(target)


def ensure_jemalloc() -> str:
    """ "" when the loader knows jemalloc (installing Debian's libjemalloc2 if it can), else why not."""
    if ctypes.util.find_library("jemalloc"):
        return ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "jemalloc is not installed (apt-get install libjemalloc2)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "libjemalloc2"]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=1200)
        if done.returncode != 0:
            return f"{' '.join(cmd)} failed: {_last_line(done.stderr)}"
    return "" if ctypes.util.find_library("jemalloc") else "libjemalloc2 installed but not found"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


# -- machine info --------------------------------------------------------------------------------------
def machine_info(nats_server_version: str) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    mem_gb = 0.0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem_gb = next((int(line.split()[1]) / 1e6 for line in f if line.startswith("MemTotal")), 0.0)
    commit = _quiet(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = bool(_quiet(["git", "-C", str(REPO), "status", "--porcelain"]).stdout.strip())
    versions = {}
    for dist in ("nats-py", "msgspec", "pydantic", "plexus-kernel-runtime", "plexus-kernel-core"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "nats_server": nats_server_version,
        "versions": versions,
        "git": commit + ("-dirty" if dirty else ""),
        "loadavg_start": os.getloadavg(),
    }


# -- the run -------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small counts, 3 repeats (under 2 minutes)")
    parser.add_argument("--uv", default=None, help="the uv binary (the Makefile passes its own)")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--only", default="raw,plexus,autogen", help="comma-separated systems to run")
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    parser.add_argument("--docs", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument(
        "--no-docs", action="store_true", help="do not refresh the table in docs/benchmarks.md"
    )
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    systems = set(args.only.split(","))
    client_timeout = 300.0 if args.quick else 3600.0
    started = time.monotonic()

    logs = RESULTS / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    uv = find_uv(args.uv)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if args.loop == "uvloop":
        env["PYTHONPATH"] = ensure_uvloop(uv) + os.pathsep + env["PYTHONPATH"]

    missing: dict[str, str] = {}
    autogen_python: str | None = None
    if "autogen" in systems:
        print("bench: preparing the isolated AutoGen venv (.bench-venv/autogen) …", flush=True)
        autogen_python, reason = ensure_autogen(uv)
        if autogen_python is None:
            missing["autogen"] = f"n/a ({reason})"
    else:
        missing["autogen"] = "n/a (not run)"
    for system in ("raw", "plexus"):
        if system not in systems:
            missing[system] = "n/a (not run)"

    store = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    server = NatsServer(store_dir=store / "nats")
    server.start()
    version = _quiet([str(Path(sys.executable).parent / "nats-server"), "--version"]).stdout.strip()
    info = machine_info(version)
    metrics: dict[str, dict[str, Any]] = {}
    client_info: dict[str, Any] = {}
    py = sys.executable
    common = ["--mode", mode, "--loop", args.loop]
    try:
        if "raw" in systems:
            print("bench: raw nats-py …", flush=True)
            with phase(logs, env) as procs:
                procs.serve("raw-serve", [py, "-m", "bench.raw", "serve", "--url", server.url, *common])
                result = procs.client(
                    "raw-client",
                    [py, "-m", "bench.raw", "client", "--url", server.url, *common],
                    client_timeout,
                )
            metrics.update(result["metrics"])
            client_info["raw"] = result["info"]
        if "plexus" in systems:
            # The keys app twice: its worker on CPython's allocator, then on jemalloc (as the image runs it).
            jemalloc_missing = ensure_jemalloc()
            if jemalloc_missing:
                print(f"bench: skipping the keys worker on jemalloc: {jemalloc_missing}", flush=True)
            for app, allocator in (("main", "default"), ("keys", "default"), ("keys", "jemalloc")):
                if allocator == "jemalloc" and jemalloc_missing:
                    continue
                label = app if allocator == "default" else f"{app}-{allocator}"
                print(f"bench: Plexus ({label}) …", flush=True)
                with phase(logs, {**env, "PLEXUS_ALLOCATOR": allocator}) as procs:
                    cmd = [py, "-m", "bench.plexus_bench"]
                    if app == "main":
                        # The real service, as `plexus orchestrator` runs it; it announces itself once its
                        # endpoints and budget watcher are up.
                        procs.serve(
                            "orchestrator",
                            [py, "-m", "plexus.runtime.cli", "orchestrator", "--nats", server.url],
                            ready="plexus orchestrator ",
                        )
                    procs.serve(
                        f"plexus-{label}-worker", [*cmd, "serve", "--app", app, "--url", server.url, *common]
                    )
                    result = procs.client(
                        f"plexus-{label}-client",
                        [*cmd, "client", "--app", app, "--url", server.url, *common],
                        client_timeout,
                    )
                metrics.update(result["metrics"])
                client_info[f"plexus-{label}"] = result["info"]
            print("bench: Plexus LLM loop (plexus.llm against a fake OpenAI provider) …", flush=True)
            with phase(logs, env) as procs:
                llm_cmd = [
                    py,
                    "-m",
                    "bench.llm_bench",
                    "--url",
                    server.url,
                    "--runs",
                    "50" if args.quick else "300",
                ]
                result = procs.client("plexus-llm", llm_cmd, client_timeout)
            metrics.update(result["metrics"])
            client_info["plexus-llm"] = result["info"]
            print("bench: one MCP tool call in the loop against the bare mcp client …", flush=True)
            with phase(logs, env) as procs:
                mcp_cmd = [
                    py,
                    "-m",
                    "bench.mcp_bench",
                    "--url",
                    server.url,
                    "--runs",
                    "50" if args.quick else "300",
                ]
                result = procs.client("plexus-mcp", mcp_cmd, client_timeout)
            metrics.update(result["metrics"])
            client_info["plexus-mcp"] = result["info"]
            for peer, (pins, probe) in PEERS.items():
                print(f"bench: the {peer} loop, the same way (.bench-venv/{peer}) …", flush=True)
                peer_python, reason = ensure_venv(uv, peer, pins, probe)
                if peer_python is None:
                    print(f"bench: {peer} not measured: {reason}", flush=True)
                    client_info[peer] = {"missing": reason}
                    continue
                with phase(logs, env) as procs:
                    runs = "50" if args.quick else "300"
                    peer_cmd = [peer_python, "-m", "bench.peer_bench", "--peer", peer, "--runs", runs]
                    result = procs.client(peer, peer_cmd, client_timeout)
                metrics.update(result["metrics"])
                client_info[peer] = result["info"]
            print("bench: Plexus scale-out (1, 2, 4 worker processes, 50 ms handlers) …", flush=True)
            with phase(logs, env) as procs:
                scale_cmd = [py, "-m", "bench.scale_bench", "--url", server.url, "--mode", mode]
                result = procs.client("plexus-scale", scale_cmd, client_timeout)
            metrics.update(result["metrics"])
            client_info["plexus-scale"] = result["info"]
            print("bench: gateway SSE (latency to a browser-like client, fan-out to many) …", flush=True)
            with phase(logs, env) as procs:
                result = procs.client(
                    "plexus-sse", [py, "-m", "bench.sse_bench", "--mode", mode], client_timeout
                )
            metrics.update(result["metrics"])
            client_info["plexus-sse"] = result["info"]
            print("bench: durability settings (R1/R3 x default/always fsync) …", flush=True)
            with phase(logs, env) as procs:
                dur_cmd = [py, "-m", "bench.durability_bench", "--mode", mode]
                result = procs.client("plexus-durability", dur_cmd, client_timeout)
            metrics.update(result["metrics"])
            client_info["plexus-durability"] = result["info"]
            print(
                "bench: durable timers (a burst due together, the cost of pending ones) …",
                flush=True,
            )
            with phase(logs, env) as procs:
                timers_cmd = [py, "-m", "bench.timers_bench", "--mode", mode]
                result = procs.client("plexus-timers", timers_cmd, client_timeout)
            metrics.update(result["metrics"])
            client_info["plexus-timers"] = result["info"]
        if autogen_python is not None:
            print("bench: AutoGen gRPC …", flush=True)
            address = f"127.0.0.1:{_free_port()}"
            ag_env = {**os.environ, "PYTHONPATH": str(REPO)}  # bench.common only: no Plexus in that venv
            try:
                with phase(logs, ag_env) as procs:
                    cmd = [autogen_python, "-m", "bench.autogen_bench"]
                    procs.serve("autogen-host", [*cmd, "host", "--url", address])
                    procs.serve("autogen-worker", [*cmd, "worker", "--url", address])
                    result = procs.client(
                        "autogen-client", [*cmd, "client", "--url", address, "--mode", mode], client_timeout
                    )
                metrics.update(result["metrics"])
                client_info["autogen"] = result["info"]
            except BenchError as exc:
                missing["autogen"] = f"n/a ({exc})"
    finally:
        server.cleanup()
        shutil.rmtree(store, ignore_errors=True)

    info["loadavg_end"] = os.getloadavg()
    summary = report.summary_of(metrics)
    keys_info = client_info.get("plexus-keys", {}).get("keys", {})
    rows = report.table_rows(summary, missing, keys_info.get("distinct_keys_per_repeat"))
    verdicts = [t.evaluate(summary) for t in report.TARGETS]
    elapsed = time.monotonic() - started
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print()
    where = f"{info['cpu']}, {info['cores']} cores"
    print(f"Plexus benchmark ({mode}, {args.loop} loop, {stamp}, {elapsed:.0f}s; {where})")
    print(report.render_text(rows, verdicts))

    document = {
        "mode": mode,
        "loop": args.loop,
        "timestamp": stamp,
        "elapsed_s": round(elapsed, 1),
        "machine": info,
        "missing": missing,
        "clients": client_info,
        "metrics": summary,
        "targets": verdicts,
        "table": {"header": report.HEADER, "rows": rows},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    print(f"\nwrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")
    if not args.no_docs:
        heading = (
            f"Latest run: `{'make bench-quick' if args.quick else 'make bench'}` ({mode}, {args.loop} loop), "
            f"{stamp}, commit {info['git']}, {info['cpu'] or 'unknown CPU'}, {info['cores']} cores, "
            f"nats-server {version.removeprefix('nats-server: ')}, Python {info['python']}; "
            f"load average {info['loadavg_start'][0]:.1f} at start."
        )
        if report.update_docs(args.docs, report.render_markdown(rows, verdicts, heading)):
            print(f"updated {args.docs.relative_to(REPO) if args.docs.is_relative_to(REPO) else args.docs}")
    return 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
