"""docs/quickstart.md works as written: its app is saved as the page says, and its commands run from that
directory (`plexus dev`; nats-server, two workers, the orchestrator and the gateway as separate processes;
the CLI; the real-provider variant against a fake OpenAI server on loopback) and print what the page
shows. Blocks are found by their info string (```` ```sh dev ````); every expected line must appear in a line
of the output (``<...>``: any word), so the CLI may add columns."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.llm.fake_providers import FakeProvider, Sse, openai_frames

DOC = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"
BLOCK = re.compile(r"^```(\w+)(?: ([\w.-]+))?\n(.*?)^```$", re.DOTALL | re.MULTILINE)
RUN_ID = re.compile(r"run_[0-9A-Z]{26}")
NATS_URL = re.compile(r"nats://127\.0\.0\.1:\d+")


def _blocks() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for lang, tag, body in BLOCK.findall(DOC.read_text()):
        if tag:
            assert (lang, tag) not in found, f"two ```{lang} {tag} blocks"
            found[lang, tag] = body
    return found


BLOCKS = _blocks()


def _commands(tag: str) -> list[str]:
    return [line for line in BLOCKS["sh", tag].splitlines() if line.strip()]


def _assert_shown(tag: str, output: str) -> None:
    """Every line of the ```text <tag> block appears in a line of ``output`` (``<...>``: any word)."""
    lines = [line.strip() for line in output.splitlines()]
    for expected in BLOCKS["text", tag].splitlines():
        parts = re.split(r"<[^>]+>", expected.strip())
        pattern = re.compile(r"\S+".join(re.escape(p) for p in parts))
        assert any(pattern.search(line) for line in lines), f"not shown: {expected!r}\n{output[-4000:]}"


def _env(**extra: str) -> dict[str, str]:
    """The reader's shell after `source .venv/bin/activate`: this venv's `plexus` and `nats-server` first
    on PATH, no provider key, no Plexus settings (the gateway on a free port: `make run` may be running)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLEXUS_", "OPENAI_", "ANTHROPIC_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PLEXUS_GATEWAY_PORT"] = "0"
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "quickstart.py").write_text(BLOCKS["python", "quickstart.py"])
    return tmp_path


class Processes:
    """Long-running commands started in ``cwd``, each logging to a file; stopped by PID at teardown."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, command: str, env: dict[str, str]) -> Path:
        log = self.cwd / f"proc{len(self.procs)}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(shlex.split(command), cwd=self.cwd, env=env, stdout=sink, stderr=sink)
        self.procs.append((proc, log))
        return log

    def wait_for(self, log: Path, text: str, timeout: float = 150) -> str:
        proc = next(p for p, path in self.procs if path == log)
        deadline = time.monotonic() + timeout
        while text not in log.read_text():
            assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout} s: {log.read_text()[-4000:]}"
            time.sleep(0.2)
        return log.read_text()

    def stop(self) -> None:
        for proc, _ in reversed(self.procs):  # nats-server last
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


@pytest.fixture
def processes(workdir: Path) -> Iterator[Processes]:
    procs = Processes(workdir)
    try:
        yield procs
    finally:
        procs.stop()


def _run(command: str, cwd: Path, env: dict[str, str]) -> str:
    out = subprocess.run(shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{command}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out.stdout


def _dashboard(output: str) -> str:
    found = re.search(r"dashboard at (http://[0-9.:]+)/", output)
    assert found is not None, output[-3000:]
    return found.group(1)


def _check_dashboard(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=10) as client:
        assert "<html" in client.get("/").text.lower()
        runs = client.get("/v1/runs", params={"roots_only": "true"}).json()["runs"]
        assert [(r["status"], r["agent_id"]) for r in runs] == [("completed", "assistant/me")], runs


def _dev_until_serving(processes: Processes, command: str, env: dict[str, str]) -> str:
    log = processes.start(command, env)
    return processes.wait_for(log, "plexus dev: serving on")


def test_plexus_dev_then_the_cli(workdir: Path, processes: Processes) -> None:
    [dev] = _commands("dev")
    output = _dev_until_serving(processes, dev, _env())
    _assert_shown("dev", output)
    _check_dashboard(_dashboard(output))
    served = re.search(r"plexus dev: serving on (nats://\S+);", output)
    started = re.search(r"^run (run_\w+)$", output, re.MULTILINE)
    assert served is not None, output
    assert started is not None, output
    url, run_id = served.group(1), started.group(1)
    cli = ""
    for command in _commands("dev-cli"):  # with the URL and run id plexus dev printed, as the page says
        cli += _run(RUN_ID.sub(run_id, NATS_URL.sub(url, command)), workdir, _env())
    _assert_shown("dev-cli", cli)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_separate_processes_then_the_cli(workdir: Path, processes: Processes) -> None:
    nats, *services = _commands("processes")
    assert nats.startswith("nats-server ")
    assert " -p 4222" in nats
    port = _free_port()  # the page's 4222 may be in use on a test machine
    env = _env(PLEXUS_NATS=f"nats://127.0.0.1:{port}")
    log = processes.start(nats.replace(" -p 4222", f" -p {port}"), env)
    processes.wait_for(log, "Server is ready")
    assert (workdir / "nats-data" / "jetstream").is_dir()
    logs = [processes.start(command, env) for command in services]
    announced = "".join(processes.wait_for(log, " serving ") for log in logs)
    assert announced.count("serving assistant, writer on") == 2  # two workers
    cli = "".join(_run(command, workdir, env) for command in _commands("cli"))
    _assert_shown("cli", cli)
    _check_dashboard(_dashboard(announced))


def _fake_openai(body: dict[str, Any]) -> Sse:
    """A real model's part, as the wire has it: the assistant asks the writer, then answers; the writer
    writes."""
    tools = {t["function"]["name"] for t in body.get("tools", [])}
    last = body["messages"][-1]
    content = last["content"]
    text = content if isinstance(content, str) else " ".join(p["text"] for p in content)
    if not tools:
        return Sse(openai_frames(f"{text.capitalize()} survive crashes."))
    if last["role"] == "user":
        return Sse(openai_frames(tool_calls=[("call_1", "ask_writer", json.dumps({"topic": text}))]))
    return Sse(openai_frames(f"From the model: {text}"))


async def test_the_same_app_on_a_real_provider(workdir: Path, processes: Processes) -> None:
    export, dev = _commands("real")
    name, _, value = export.removeprefix("export ").partition("=")
    assert name == "OPENAI_API_KEY"
    async with FakeProvider(_fake_openai, keep_alive=True) as fake:
        env = _env(**{name: value}, OPENAI_BASE_URL=fake.base_url)  # the SDK's own setting
        try:
            output = await asyncio.to_thread(_dev_until_serving, processes, dev, env)
        finally:
            await asyncio.to_thread(processes.stop)  # before the fake goes: the SDK keeps connections
        assert "answer: From the model: Durable agents survive crashes." in output.splitlines(), output
        assert {body["model"] for body in fake.requests} == {"gpt-4o-mini"}
        assert {t["function"]["name"] for t in fake.requests[0]["tools"]} == {"ask_writer", "word_count"}
