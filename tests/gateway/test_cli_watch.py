"""`plexus runs start --watch` / `runs watch` as a user sees them: the final answer at the end, plain lines
into a pipe, and a reader that goes away early ends the command quietly."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from .conftest import Stack


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def plexus(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "plexus.runtime.cli", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_start_watch_into_a_pipe_prints_plain_lines_and_the_final_answer(gw: Stack) -> None:
    code, out, err = await plexus("runs", "start", "echo/w1", "hello there", "--watch", "--nats", gw.nats_url)
    assert code == 0, err
    assert "\x1b" not in out  # stdout is a pipe: no clear-screen or cursor escapes
    lines = out.splitlines()
    assert lines[0].startswith("run_")
    assert "echo/w1  completed" in lines
    assert lines[-1] == "answer: echo #1: hello there"


async def test_watch_of_a_failed_run_ends_with_its_error(gw: Stack) -> None:
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "failing/w2", "input": text("x")})).json()[
        "run_id"
    ]
    code, out, err = await plexus("runs", "watch", run_id, "--nats", gw.nats_url)
    assert code == 1, err
    assert "\x1b" not in out
    last = out.splitlines()[-1]
    assert last.startswith("error: HandlerError: "), out
    assert "nope" in last


async def test_watch_json_into_head_exits_0_without_a_traceback(gw: Stack) -> None:
    slow = json.dumps({"children": 2, "leaf": {"steps": 30, "sleep": 0.05}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/w3", "input": text(slow)})).json()[
        "run_id"
    ]
    # A real shell pipe; pipefail makes the pipeline's status plexus's own, not head's.
    script = (
        f"set -o pipefail; {sys.executable} -m plexus.runtime.cli runs watch {run_id} --json "
        f"--nats {gw.nats_url} | head -1"
    )
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", script, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    # Quiet: no traceback, no broken-pipe report (a log line of the client's own, say a notice, may be there).
    assert "Traceback" not in err.decode()
    assert "BrokenPipe" not in err.decode()
    assert "Broken pipe" not in err.decode()
    (line,) = out.decode().splitlines()
    assert json.loads(line)["event"] == "snapshot"
    # head left while the tree was still running: the pipe really was closed under the writer.
    assert (await gw.rt.wait_run(run_id, timeout=30)).status == "completed"


async def test_watch_of_a_run_that_already_ended_prints_its_status_line(gw: Stack) -> None:
    # The snapshot is the first status of each run: a run that ended before the watch began still gets its
    # plain line (the line used to depend on whether the watch or the run came first).
    started = await gw.client.post("/v1/runs", json={"agent_id": "echo/w4", "input": text("done before")})
    run_id = started.json()["run_id"]
    assert (await gw.rt.wait_run(run_id, timeout=30)).status == "completed"
    code, out, err = await plexus("runs", "watch", run_id, "--nats", gw.nats_url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "echo/w4  completed", out
    assert lines[-1] == "answer: echo #1: done before"
