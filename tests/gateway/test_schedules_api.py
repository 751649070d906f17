"""``/v1/schedules`` over the real stack (issue 40, item 3): create, list, get, pause, resume, trigger and
delete a scheduled run through the gateway; its fire starts a run the worker serves; bad input and the
per-tenant limit answer with typed problems."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from plexus.core import AgentId, TextBlock
from plexus.orchestrator import OrchestratorConfig
from plexus.runtime import InvalidScheduleError, NatsServer, Runtime
from tests.orchestrator.conftest import FAST

from .conftest import Stack, serving_cluster

#: This file's orchestrator allows 2 scheduled runs per tenant, so the limit is reached in a few calls.
LIMIT = 2


@pytest.fixture
async def cluster(nats_server: NatsServer) -> AsyncIterator[Runtime]:
    """The conftest's cluster, with a low per-tenant limit of scheduled runs."""
    config = OrchestratorConfig(sweeper=FAST, max_schedules=LIMIT)
    async with serving_cluster(nats_server.url, config) as rt:
        yield rt


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


def problem(response: httpx.Response, status: int, error_type: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    if error_type is not None:
        assert body["error_type"] == error_type, body
    return body


async def test_create_list_pause_resume_trigger_delete_a_scheduled_run(gw: Stack) -> None:
    created = await gw.client.post(
        "/v1/schedules",
        json={
            "id": "hourly-echo",
            "agent_id": "echo/sched",
            "input": text("tick"),
            "every_s": 3600,
            "budget": {"max_tokens": 5000},
        },
    )
    assert created.status_code == 201, created.text
    info = created.json()
    assert info["schedule"]["id"] == "hourly-echo"
    assert info["schedule"]["agent_id"] == "echo/sched"
    assert info["schedule"]["every_s"] == 3600
    assert [b["text"] for b in info["schedule"]["input"]] == ["tick"]
    assert info["schedule"]["budget"]["max_tokens"] == 5000
    assert len(info["next_fires"]) == 3
    assert info["state"]["fires"] == 0

    listed = (await gw.client.get("/v1/schedules")).json()
    assert [s["schedule"]["id"] for s in listed["schedules"]] == ["hourly-echo"]
    assert listed["limit"] == LIMIT

    paused = await gw.client.post("/v1/schedules/hourly-echo/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["schedule"]["paused"] is True
    assert paused.json()["next_fires"] == []

    # A trigger fires now, also while paused; the same fire_id fires once.
    fired = await gw.client.post("/v1/schedules/hourly-echo/trigger", params={"fire_id": "f1"})
    assert fired.status_code == 200, fired.text
    run_id = fired.json()["run_id"]
    assert fired.json()["events"] == f"/v1/runs/{run_id}/events"
    again = await gw.client.post("/v1/schedules/hourly-echo/trigger", params={"fire_id": "f1"})
    assert again.json()["run_id"] == run_id
    record = await gw.rt.wait_run(run_id, timeout=30)
    assert record.status == "completed"
    run = (await gw.client.get(f"/v1/runs/{run_id}")).json()["run"]
    assert run["agent_id"] == "echo/sched"

    got = (await gw.client.get("/v1/schedules/hourly-echo")).json()
    assert got["state"]["fires"] == 1
    (last,) = got["state"]["last_runs"]
    assert last["run_id"] == run_id
    assert last["manual"] is True
    assert last["outcome"] == "started"
    assert last["status"] == "completed"

    resumed = await gw.client.post("/v1/schedules/hourly-echo/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["schedule"]["paused"] is False
    assert len(resumed.json()["next_fires"]) == 3

    deleted = await gw.client.delete("/v1/schedules/hourly-echo")
    assert deleted.status_code == 204, deleted.text
    gone = problem(await gw.client.get("/v1/schedules/hourly-echo"), 404, "ScheduleNotFoundError")
    assert gone["fields"] == {"schedule_id": "hourly-echo"}
    problem(await gw.client.delete("/v1/schedules/hourly-echo"), 404, "ScheduleNotFoundError")
    problem(await gw.client.post("/v1/schedules/hourly-echo/trigger"), 404, "ScheduleNotFoundError")
    assert (await gw.client.get("/v1/schedules")).json()["schedules"] == []


@pytest.mark.parametrize("cron", ["0 5-2 * * *", "0 0 31 2 *", "0 0 30 2 *", "0 0 * * 7", "0 0 * * 0-7"])
async def test_a_cron_that_croniter_takes_and_the_server_refuses_is_invalid_and_nothing_is_written(
    gw: Stack, cron: str
) -> None:
    # Before the fix these reached nats-server, which refused them: a 502 HandlerError of sched_put.
    with pytest.raises(InvalidScheduleError, match="cron"):
        await gw.rt.schedule_run(AgentId("echo", "bad"), [TextBlock(text="x")], cron=cron, schedule_id="bad")
    problem(await gw.client.get("/v1/schedules/bad"), 404, "ScheduleNotFoundError")


async def test_a_cron_the_schema_allows_that_never_fires_is_a_422_invalid_schedule_error(gw: Stack) -> None:
    answer = await gw.client.post(
        "/v1/schedules", json={"agent_id": "echo/bad", "input": text("x"), "id": "bad", "cron": "0 0 31 2 *"}
    )
    found = problem(answer, 422, "InvalidScheduleError")
    assert "never fires" in found["fields"]["reason"], found


async def test_schema_refusals_unknown_agents_and_no_token(gw: Stack) -> None:
    base = {"agent_id": "echo/k", "input": text("x"), "every_s": 60}
    for bad in (
        {**base, "every_s": 0.5},  # under the server's 1 s
        {**base, "overlap": "queue"},
        {**base, "id": "-starts-with-dash"},
        {**base, "priority": 7},
        {**base, "unknown": 1},
        {**base, "cron": "@daily"},  # both cron and every_s
        {**base, "tz": "Europe/Paris"},  # tz with every_s
        {"agent_id": "echo/k", "input": text("x")},  # neither
        {"agent_id": "echo/k", "input": text("x"), "cron": "61 * * * *"},
        {"agent_id": "echo/k", "input": text("x"), "cron": "0 5-2 * * *"},  # backwards
        {"agent_id": "echo/k", "input": text("x"), "cron": "0 0 * * 7"},  # the server's days are 0-6
        {"agent_id": "echo/k", "input": text("x"), "cron": "0 9 * * *", "tz": "Mars/Olympus_Mons"},
    ):
        problem(await gw.client.post("/v1/schedules", json=bad), 422)
    problem(await gw.client.get("/v1/schedules/not%20an%20id"), 422)
    problem(
        await gw.client.post("/v1/schedules", json={**base, "agent_id": "nobody/k"}),
        404,
        "AgentNotFoundError",
    )
    problem(await httpx.AsyncClient(base_url=gw.url).get("/v1/schedules"), 401)


async def test_the_tenant_limit_is_a_409_and_replacing_is_not_one_more(gw: Stack) -> None:
    for i in range(LIMIT):
        body = {"id": f"s{i}", "agent_id": "echo/k", "input": text("x"), "cron": "@daily"}
        assert (await gw.client.post("/v1/schedules", json=body)).status_code == 201
    replaced = await gw.client.post(
        "/v1/schedules", json={"id": "s0", "agent_id": "echo/k", "input": text("y"), "every_s": 120}
    )
    assert replaced.status_code == 201, replaced.text
    assert replaced.json()["schedule"]["every_s"] == 120
    over = problem(
        await gw.client.post(
            "/v1/schedules", json={"id": "s9", "agent_id": "echo/k", "input": text("x"), "cron": "@daily"}
        ),
        409,
        "TooManySchedulesError",
    )
    assert over["fields"] == {"limit": LIMIT}
    assert len((await gw.client.get("/v1/schedules")).json()["schedules"]) == LIMIT
