"""`plexus runs ls|show|watch|cancel` and `plexus gateway` as real processes against a real cluster."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import httpx

from plexus.gateway import hash_token

from .conftest import Stack


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def plexus(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "plexus.runtime.cli", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_runs_ls_show_watch_cancel(gw: Stack) -> None:
    cmd = json.dumps({"children": 2, "leaf": {"steps": 2, "tokens": 4}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/cli", "input": text(cmd)})).json()[
        "run_id"
    ]
    code, out, err = await plexus("runs", "watch", run_id, "--json", "--nats", gw.nats_url)
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["event"] == "snapshot"
    assert any(e["event"] == "status" and e["data"]["run"]["status"] == "completed" for e in events)

    code, out, err = await plexus("runs", "ls", "--json", "--nats", gw.nats_url)
    assert code == 0, err
    assert [r["run_id"] for r in json.loads(out)] == [run_id]

    code, out, err = await plexus("runs", "show", run_id, "--nats", gw.nats_url)
    assert code == 0, err
    assert "fanout/cli  completed" in out
    assert "  leaf/cli-0  completed" in out
    assert "tokens 16 (no limit)" in out

    slow = json.dumps({"children": 1, "leaf": {"steps": 200, "sleep": 0.1}})
    slow_id = (
        await gw.client.post("/v1/runs", json={"agent_id": "fanout/cli2", "input": text(slow)})
    ).json()["run_id"]
    await gw.rt.wait_run(slow_id, timeout=10, until=("running",))
    code, out, err = await plexus("runs", "cancel", slow_id, "--json", "--nats", gw.nats_url)
    assert code == 0, err
    assert json.loads(out)["run_id"] == slow_id
    assert (await gw.rt.wait_run(slow_id, timeout=30)).status == "cancelled"

    code, _, err = await plexus("runs", "show", "run_nope", "--nats", gw.nats_url)
    assert code == 1
    assert "unknown run" in err


async def test_gateway_command_without_a_token_hash_starts_closed_not_open(gw: Stack) -> None:
    """No --token-hash and no --dev: only tokens of `plexus tokens` are accepted (there are none here)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "plexus.runtime.cli", "gateway", "--nats", gw.nats_url, "--port", "0",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        notice = (await asyncio.wait_for(proc.stderr.readline(), timeout=30)).decode()
        assert "accepting only tokens made with `plexus tokens create`" in notice
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        url = line.split()[3]
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/v1/agents")).status_code == 401
            guess = await client.get("/v1/agents", headers={"Authorization": "Bearer anything"})
            assert guess.status_code == 401
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        await proc.wait()
    code, out, _ = await plexus("gateway", "--hash-token", "s3cret")
    assert code == 0
    assert out.strip() == hash_token("s3cret")


async def test_gateway_command_serves_with_a_hashed_token(gw: Stack) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "plexus.runtime.cli", "gateway", "--nats", gw.nats_url, "--port", "0",
        "--token-hash", hash_token("cli-token"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        assert line.startswith("plexus gateway serving http://127.0.0.1:"), line
        url = line.split()[3]
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/v1/agents")).status_code == 401
            ok = await client.get("/v1/agents", headers={"Authorization": "Bearer cli-token"})
            assert ok.status_code == 200
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0


async def test_runs_start_and_approve_agents_and_sessions(gw: Stack) -> None:
    nats = ("--nats", gw.nats_url)
    code, out, err = await plexus(
        "runs", "start", "echo/cli3", "hello", "--max-tokens", "100", "--json", *nats
    )
    assert code == 0, err
    run_id = json.loads(out)["run_id"]
    record = await gw.rt.wait_run(run_id, timeout=20)
    assert record.status == "completed"
    assert record.budget is not None
    assert record.budget["max_tokens"] == 100

    code, out, err = await plexus("runs", "start", "gatekeeper/cli", *nats)
    assert code == 0, err
    gated = out.strip()
    await gw.rt.wait_run(gated, timeout=20, until=("awaiting_approval",))
    code, _, err = await plexus("runs", "approve", gated, "door-9", *nats)
    assert code == 1
    assert "RunStateError" in err  # one line, no traceback
    assert "Traceback" not in err
    code, out, err = await plexus("runs", "approve", gated, "door-1", "--deny", "--wait", *nats)
    assert code == 0, err
    assert f"door-1 denied; run {gated} is completed" in out  # --wait: the outcome, not "running"
    assert (await gw.rt.get_run(gated)).status == "completed"
    code, _, err = await plexus("runs", "approve", gated, "door-1", "--wait", "--timeout", "0", *nats)
    assert code == 2
    assert "--timeout: must be a number of seconds above 0" in err

    code, _, err = await plexus("runs", "start", "not-an-agent-id", *nats)
    assert code == 2
    assert "TYPE/KEY" in err
    code, _, err = await plexus("runs", "start", "echo/x", "--max-tokens", "0", *nats)
    assert code == 2  # refused by the flag itself, in one line (it was a pydantic dump of the budget)
    assert "--max-tokens: must be at least 1" in err

    code, out, err = await plexus("agents", "--json", *nats)
    assert code == 0, err
    rows = {row["type"]: row for row in json.loads(out)}
    assert rows["default/echo"]["capabilities"] == ["chat"]
    assert rows["default/echo"]["durable"] is True
    (partitions,) = rows["default/echo"]["workers"].values()  # one worker owns every partition
    assert sorted(partitions) == list(range(gw.rt.partitions))
    # Leases are renewed in the background: on a loaded machine a late renewal can drop partitions for a
    # moment (the worker takes them back at its next rebalance), so the text view is read until it settles.
    expected = f"{gw.rt.partitions} partition(s) 0-{gw.rt.partitions - 1}"
    for _ in range(40):
        code, out, err = await plexus("agents", *nats)
        assert code == 0, err
        if expected in out:
            break
        await asyncio.sleep(0.5)
    assert expected in out

    session = (await gw.client.post("/v1/sessions", json={"agent_type": "echo", "title": "cli"})).json()
    code, out, err = await plexus("sessions", "ls", "--json", *nats)
    assert code == 0, err
    assert [s["session_id"] for s in json.loads(out)] == [session["session_id"]]
    code, out, err = await plexus("sessions", "show", session["session_id"], *nats)
    assert code == 0, err
    assert f"session {session['session_id']} with echo (0 items)" in out
    code, _, err = await plexus("sessions", "show", "nope", *nats)
    assert code == 1
    assert "unknown session" in err
