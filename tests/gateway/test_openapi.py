"""What /openapi.json says is what the server does (issue 36 item 8), one defect at a time; test_schema fuzzes
the whole document. And how a browser resumes a session run, which `EventSource` cannot reconnect (a POST)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from .conftest import TOKEN, Stack, read_sse


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def _doc(gw: Stack) -> dict[str, Any]:
    response = await gw.client.get("/openapi.json")
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    return doc


def _problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    return body


async def test_a_body_that_is_not_utf8_is_a_documented_422_with_a_detail(gw: Stack) -> None:
    for path in ("/v1/sessions", "/v1/runs", "/v1/runs/r1/cancel"):
        response = await gw.client.post(
            path, content=b'{"agent_type": "\xff\xfe"}', headers={"content-type": "application/json"}
        )
        body = _problem(response, 422)
        assert "UTF-8" in body["detail"]
        assert body["errors"][0]["loc"] == ["body"]
    doc = await _doc(gw)
    statuses = {
        status for path in doc["paths"].values() for op in path.values() for status in op["responses"]
    }
    assert "400" not in statuses


async def test_429_is_documented_on_every_operation_with_retry_after(gw: Stack) -> None:
    doc = await _doc(gw)
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert "429" in op["responses"], f"{method} {path}"
            assert "Retry-After" in op["responses"]["429"]["headers"]


async def test_the_schema_of_a_content_block_requires_its_type(gw: Stack) -> None:
    doc = await _doc(gw)
    schemas = doc["components"]["schemas"]
    for model in ("StartRun", "MessageIn", "SessionRunIn"):
        block = schemas[model]["properties"]["input"]["items"]
        assert block["required"] == ["type"], model
        assert block["properties"]["type"] == {"type": "string"}
    _problem(await gw.client.post("/v1/runs", json={"agent_id": "echo/b1", "input": [{"text": "x"}]}), 422)
    created = await gw.client.post("/v1/runs", json={"agent_id": "echo/b1", "input": [{"type": "x-custom"}]})
    assert created.status_code == 201, created.text


async def test_last_event_id_is_documented_as_the_id_scheme_and_taken_as_exactly_that(gw: Stack) -> None:
    doc = await _doc(gw)
    params = {p["name"]: p for p in doc["paths"]["/v1/runs/{run_id}/events"]["get"]["parameters"]}
    for name in ("last-event-id", "last_event_id"):
        schema = params[name]["schema"]
        assert "anyOf" not in schema, "a header or query parameter is absent, never null"
        pattern = re.compile(schema["pattern"])
        for good in ("", "0", "17", "17.3", "9999999999999999999"):
            assert pattern.search(good), good
        for bad in ("abc", "017", "17.", "17.0", "1.2.3", "-1", "99999999999999999999", "null", "١٢"):
            assert not pattern.search(bad), bad
    assert "<seq>.<n>" in params["last-event-id"]["description"]
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "echo/l1", "input": text("x")})).json()[
        "run_id"
    ]
    for bad in ("abc", "017", "17.0", "١٢", "99999999999999999999"):
        _problem(
            await gw.client.get(f"/v1/runs/{run_id}/events", headers=[(b"last-event-id", bad.encode())]), 422
        )
        _problem(await gw.client.get(f"/v1/runs/{run_id}/events", params={"last_event_id": bad}), 422)
    resumed = await read_sse(gw.client, f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "1.4"})
    assert resumed[-1].data == "[DONE]"


async def test_json_types_are_what_the_schema_says(gw: Stack) -> None:
    """`"priority": false` was taken as 0 (and budgets took `true` for a number, but not `3.0` for 3)."""
    doc = await _doc(gw)
    assert doc["components"]["schemas"]["StartRun"]["properties"]["priority"]["enum"] == [0, 1, 2, 4, 8]
    base: dict[str, Any] = {"agent_id": "echo/t1", "input": text("x")}
    for bad in (
        {"priority": False},
        {"priority": True},
        {"priority": 2.5},
        {"budget": {"max_cost_usd": True}},
        {"budget": {"deadline_s": "60"}},
        {"spawn_budget": {"allow_preempt": 1}},
    ):
        _problem(await gw.client.post("/v1/runs", json={**base, **bad}), 422)
    ok = await gw.client.post("/v1/runs", json={**base, "priority": 4, "budget": {"max_tokens": 1000.0}})
    assert ok.status_code == 201, ok.text
    _problem(await gw.client.post("/v1/runs/r1/approve", json={"decision_id": "d", "approved": 1}), 422)


async def test_a_method_not_allowed_names_every_method_of_the_path(gw: Stack) -> None:
    for path, methods in (
        ("/v1/sessions", {"GET", "POST"}),
        ("/v1/sessions/s1/memory/k1", {"GET", "PUT", "DELETE"}),
    ):
        response = await gw.client.request("OPTIONS", path)
        _problem(response, 405)
        allowed = {m.strip() for m in response.headers["allow"].split(",")}
        assert allowed - {"HEAD"} == methods, path


async def test_a_browser_resumes_a_session_run_on_the_run_events_route(gw: Stack) -> None:
    """`POST /v1/sessions/{id}/run` streams the run, but `EventSource` cannot reconnect a POST: after a drop
    the page opens `GET /v1/runs/{root_id}/events?last_event_id=<last id>&access_token=<token>` (the snapshot
    names root_id), as an `EventSource` would, without headers."""
    session = (await gw.client.post("/v1/sessions", json={"agent_type": "streamer"})).json()["session_id"]
    first = await read_sse(
        gw.client,
        f"/v1/sessions/{session}/run",
        method="POST",
        body={"input": text(json.dumps({"rounds": 20}))},
        stop=lambda e: e.event == "token",
    )
    assert first[0].event == "snapshot"
    root_id = first[0].json()["root_id"]
    last = first[-1].id
    assert last is not None
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0) as browser:  # no Authorization header
        rest = await read_sse(browser, f"/v1/runs/{root_id}/events?last_event_id={last}&access_token={TOKEN}")
    assert rest[0].event != "snapshot"
    assert rest[-1].data == "[DONE]"
    ids = [e.id for e in first + rest]
    assert len(set(ids)) == len(ids)
    whole = await read_sse(gw.client, f"/v1/runs/{root_id}/events")
    durable = [e.id for e in whole if e.id is not None and e.id.isdigit() and e.event != "snapshot"]
    assert [e.id for e in first[1:] + rest if e.id is not None and e.id.isdigit()] == durable
