"""``POST /v1/runs/{id}/fork`` and ``GET /v1/runs/{id}/transcript`` over real HTTP, on the scripted LLM agent
of `tests.gateway.apps` (two turns, a tool call between them)."""

from __future__ import annotations

import json
from typing import Any

from .conftest import Stack
from .test_cli import plexus


async def _llm_run(gw: Stack, key: str) -> str:
    response = await gw.client.post(
        "/v1/runs", json={"agent_id": f"llm/{key}", "input": [{"type": "text", "text": "find plexus"}]}
    )
    assert response.status_code == 201, response.text
    run_id: str = response.json()["run_id"]
    assert (await gw.rt.wait_run(run_id, timeout=30)).status == "completed"
    return run_id


def _texts(item: dict[str, Any]) -> list[str]:
    return [b["text"] for b in item["blocks"] if b["type"] == "text"]


async def test_the_transcript_shows_every_turn_with_its_tools_usage_latency_and_finish(gw: Stack) -> None:
    run_id = await _llm_run(gw, "t1")
    response = await gw.client.get(f"/v1/runs/{run_id}/transcript")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["agent_id"], body["live"], body["status"]) == ("llm/t1", False, "completed")
    assert [b["text"] for b in body["input"]] == ["find plexus"]
    [message] = body["messages"]
    assert message["committed"] is True
    first, second = message["turns"]
    assert _texts(first["item"]) == ["Looking it up."]
    [call] = [b for b in first["item"]["blocks"] if b["type"] == "tool_use"]
    assert (call["tool_name"], call["arguments"]) == ("lookup", {"q": "plexus"})
    [result] = first["tools"]["blocks"]
    assert result["type"] == "tool_result"
    assert result["content"][0]["text"] == "found plexus"
    assert first["usage"]["input_tokens"] == 120
    assert first["finish_reason"]["kind"] == "tool_call"
    assert first["latency_s"] is not None
    assert first["model"] == "scripted"
    assert _texts(second["item"]) == ["Found it."]
    assert second["finish_reason"]["kind"] == "completed"
    assert second["tools"] is None

    missing = await gw.client.get("/v1/runs/run_01J0000000000000000000NOPE/transcript")
    assert missing.status_code == 404


async def test_fork_over_http_starts_a_new_tree_with_its_lineage(gw: Stack) -> None:
    run_id = await _llm_run(gw, "f1")
    response = await gw.client.post(
        f"/v1/runs/{run_id}/fork",
        json={"turn": 1, "edit": {"message": [{"type": "text", "text": "and again"}], "system": "Be brief."}},
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["forked_from"] == {"run_id": run_id, "agent_id": "llm/f1", "message": 0, "turn": 1}
    fork_id = created["run_id"]
    assert created["events"] == f"/v1/runs/{fork_id}/events"
    assert (await gw.rt.wait_run(fork_id, timeout=30)).status == "completed"
    fork = (await gw.client.get(f"/v1/runs/{fork_id}/transcript")).json()
    assert fork["forked_from"]["run_id"] == run_id
    assert fork["agent_id"].startswith("llm/f1.fork-")
    assert len(fork["messages"][0]["turns"]) == 2  # its own turns; turn 1 came from the source's record


async def test_bad_forks_are_problems_and_change_nothing(gw: Stack) -> None:
    run_id = await _llm_run(gw, "b1")
    before = (await gw.client.get(f"/v1/runs/{run_id}/transcript")).json()

    unknown = await gw.client.post("/v1/runs/run_01J0000000000000000000NOPE/fork", json={"turn": 1})
    assert unknown.status_code == 404
    no_turn = await gw.client.post(f"/v1/runs/{run_id}/fork", json={"turn": 9})
    assert no_turn.status_code == 404, no_turn.text
    assert no_turn.json()["error_type"] == "ForkPointNotFoundError"
    bad_settings = await gw.client.post(
        f"/v1/runs/{run_id}/fork", json={"turn": 1, "edit": {"settings": {"temperature": "hot"}}}
    )
    assert bad_settings.status_code == 422, bad_settings.text
    assert bad_settings.json()["error_type"] == "InvalidForkError"
    edits: list[dict[str, Any]] = [{"message": []}, {"message": [{"type": "text"}]}, {"message": "no blocks"}]
    for edit in edits:
        bad = await gw.client.post(f"/v1/runs/{run_id}/fork", json={"turn": 1, "edit": edit})
        assert bad.status_code == 422, (edit, bad.text)

    assert (await gw.client.get(f"/v1/runs/{run_id}/transcript")).json() == before


async def test_plexus_runs_fork_prints_the_new_run_and_its_lineage(gw: Stack) -> None:
    run_id = await _llm_run(gw, "c1")
    code, out, err = await plexus(
        "runs", "fork", run_id, "--turn", "1", "--text", "again", "--json", "--nats", gw.nats_url
    )
    assert code == 0, err
    created = json.loads(out)
    assert created["forked_from"] == {"run_id": run_id, "agent_id": "llm/c1", "message": 0, "turn": 1}
    assert (await gw.rt.wait_run(created["run_id"], timeout=30)).status == "completed"

    code, out, err = await plexus("runs", "fork", run_id, "--turn", "7", "--nats", gw.nats_url)
    assert code == 1
    assert "ForkPointNotFoundError" in err
    assert "turn 7" in err
