"""The micro-service surface: typed error replies for bad input, and $SRV discovery and stats."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from plexus.core import AgentId, ExecutionBudget, KernelError, TextBlock
from plexus.orchestrator import VERBS, Orchestrator
from plexus.runtime import Runtime
from plexus.runtime.wire._orchestration import (
    ORCH_SERVICE_NAME,
    RunStatus,
    orch_subject,
)

from .conftest import StartReplica, raw_call

BLOCKS = [{"type": "text", "text": "hi"}]


def subject(verb: str) -> str:
    return orch_subject("px", "default", verb)


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


BAD_REQUESTS: list[tuple[str, bytes, str, str]] = [
    # verb, body, error type, a fragment of the message
    ("start", b"\x00\xffnot json", "InvalidRunRequest", "not JSON"),
    ("start", b"[1, 2]", "InvalidRunRequest", "Expected `object`"),
    ("start", body(agent_id="echo/k"), "InvalidRunRequest", "payload"),
    ("start", body(agent_id="no-slash", payload=BLOCKS), "InvalidRunRequest", "not an agent id"),
    ("start", body(agent_id="echo/k", payload={"a": 1}), "InvalidRunRequest", "JSON array"),
    ("start", body(agent_id="echo/k", payload=[{"type": "text"}]), "InvalidRunRequest", "payload"),
    (
        "start",
        body(agent_id="echo/k", payload=BLOCKS, budget={"max_tokens": -5}),
        "InvalidRunRequest",
        "max_tokens",
    ),
    (
        "start",
        body(agent_id="echo/k", payload=BLOCKS, budget={"deadline_s": 0}),
        "InvalidRunRequest",
        "deadline_s",
    ),
    ("start", body(agent_id="echo/k", payload=BLOCKS, budget={"bogus": 1}), "InvalidRunRequest", "bogus"),
    (
        "start",
        body(agent_id="echo/k", payload=BLOCKS, spawn_budget={"max_agents": 0}),
        "InvalidRunRequest",
        "max_agents",
    ),
    ("start", body(agent_id="echo/k", payload=BLOCKS, priority=3), "InvalidRunRequest", "priority"),
    ("start", body(agent_id="echo/k", payload=BLOCKS, run_id="att"), "InvalidRunRequest", "reserved"),
    ("start", body(agent_id="echo/k", payload=BLOCKS, run_id="has space"), "InvalidRunRequest", "run_id"),
    ("get", body(run_id="run-nope"), "RunNotFoundError", "unknown run"),
    ("get", body(), "InvalidRunRequest", "run_id"),
    ("cancel", body(run_id="run-nope"), "RunNotFoundError", "unknown run"),
    ("finished", body(run_id="run-nope", status="completed"), "RunNotFoundError", "unknown run"),
    ("finished", body(run_id="run-nope", status="exploded"), "InvalidRunRequest", "status"),
    (
        "crashed",
        body(run_id="run-nope", agent_id="echo/k", message_id="m", attempt=2, decision="retry"),
        "RunNotFoundError",
        "unknown run",
    ),
    (
        "spawn",
        body(parent_run_id="run-nope", root_id="run-nope", parent_agent="a/b", child_agent="c/d"),
        "RunNotFoundError",
        "unknown run",
    ),
]


@pytest.mark.parametrize(("verb", "data", "error_type", "fragment"), BAD_REQUESTS)
async def test_bad_requests_get_typed_error_replies(
    orch: Orchestrator, rt: Runtime, verb: str, data: bytes, error_type: str, fragment: str
) -> None:
    msg, error = await raw_call(rt.nc, subject(verb), data)
    assert error is not None, msg.data
    assert error["error_type"] == error_type
    assert fragment in error["message"]
    assert msg.headers is not None
    code = msg.headers["Nats-Service-Error-Code"]
    assert code == ("404" if error_type == "RunNotFoundError" else "400")
    assert KernelError.from_wire(error).error_type == error_type
    # The service is still there and answers the next request normally.
    run_id = await rt.start_run(AgentId("echo", "k"), [TextBlock(text="after")])
    assert (await rt.get_run(run_id)).status == RunStatus.RUNNING


async def test_reports_that_contradict_the_stored_run_are_refused_and_change_nothing(
    orch: Orchestrator, rt: Runtime
) -> None:
    root = await rt.start_run(
        AgentId("boss", "1"), [TextBlock(text="go")], budget=ExecutionBudget(max_tokens=99)
    )
    other = await rt.start_run(AgentId("boss", "2"), [TextBlock(text="go")])
    before = await rt.get_run(root)
    cases = [
        # claims a tree the parent is not part of
        ("spawn", body(parent_run_id=root, root_id=other, parent_agent="boss/1", child_agent="w/1")),
        # claims to be another agent than the one running the parent
        ("spawn", body(parent_run_id=root, root_id=root, parent_agent="boss/2", child_agent="w/1")),
        # a crash report from an agent that does not run the run
        ("crashed", body(run_id=root, agent_id="boss/2", message_id="m", attempt=2, decision="retry")),
        ("crashed", body(run_id=root, agent_id="boss/1", message_id="m", attempt=0, decision="retry")),
        # an error that is not a wire error
        ("finished", body(run_id=root, status="failed", error={"nope": True})),
        ("finished", body(run_id=root, status="completed", output={"not": "blocks"})),
    ]
    for verb, data in cases:
        _, error = await raw_call(rt.nc, subject(verb), data)
        assert error is not None
        assert error["error_type"] == "InvalidRunRequest", (verb, error)
    after = await rt.get_run(root)
    assert msgspec.structs.replace(after, usage=before.usage) == before
    assert after.children == []


async def test_a_request_without_a_reply_subject_does_not_hurt_the_service(
    orch: Orchestrator, rt: Runtime
) -> None:
    await rt.nc.publish(subject("get"), b"garbage")
    await rt.nc.publish(subject("start"), body(agent_id="echo/k", payload=BLOCKS))
    await rt.nc.flush()
    run_id = await rt.start_run(AgentId("echo", "k"), [TextBlock(text="still here")])
    assert (await rt.get_run(run_id)).status == RunStatus.RUNNING


# -- discovery --------------------------------------------------------------------------------------------
async def gather_replies(
    rt: Runtime, subject: str, expect: int, timeout: float = 3.0
) -> list[dict[str, Any]]:
    """Every instance answers a $SRV request: collect replies until ``expect`` have arrived."""
    inbox = rt.nc.new_inbox()
    sub = await rt.nc.subscribe(inbox)
    await rt.nc.publish(subject, b"", reply=inbox)
    replies: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(timeout):
            while len(replies) < expect:
                msg = await sub.next_msg(timeout=timeout)
                replies.append(json.loads(msg.data))
    finally:
        await sub.unsubscribe()
    return replies


async def test_replicas_are_discoverable_and_report_stats(replicas: StartReplica, rt: Runtime) -> None:
    a, b = await replicas(), await replicas()
    pings = await gather_replies(rt, f"$SRV.PING.{ORCH_SERVICE_NAME}", 2)
    assert {p["id"] for p in pings} == {a.id, b.id}
    assert all(
        p["name"] == ORCH_SERVICE_NAME and p["type"] == "io.nats.micro.v1.ping_response" for p in pings
    )

    info = (await gather_replies(rt, f"$SRV.INFO.{ORCH_SERVICE_NAME}.{a.id}", 1))[0]
    endpoints = {e["name"]: e for e in info["endpoints"]}
    assert set(endpoints) == set(VERBS)
    assert endpoints["spawn"]["subject"] == "px.*.orch.spawn"
    assert {e["queue_group"] for e in endpoints.values()} == {"q"}

    async def get_stats() -> tuple[int, int]:
        stats = await gather_replies(rt, f"$SRV.STATS.{ORCH_SERVICE_NAME}", 2)
        gets = [e for s in stats for e in s["endpoints"] if e["name"] == "get"]
        requests = sum(e["num_requests"] for e in gets)
        invalid = sum(e["data"]["by_type"].get("InvalidRunRequest", 0) for e in gets)
        return requests, invalid

    before = await get_stats()
    await raw_call(rt.nc, subject("get"), b"garbage")
    await raw_call(rt.nc, subject("get"), b"garbage")
    after = await get_stats()
    assert (after[0] - before[0], after[1] - before[1]) == (2, 2)
