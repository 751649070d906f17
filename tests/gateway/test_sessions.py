"""Sessions: created, run with SSE, transcript as seed 002 items, memory, surviving a gateway restart."""

from __future__ import annotations

import json

from .conftest import Stack, StartGateway, read_sse
from .test_cli import plexus


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def _session(gw: Stack, **body: str) -> str:
    response = await gw.client.post("/v1/sessions", json={"agent_type": "echo", **body})
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


async def test_session_run_streams_and_the_transcript_survives_a_gateway_restart(
    start_gateway: StartGateway,
) -> None:
    first = await start_gateway()
    sid = await _session(first, title="chat")
    events = await read_sse(
        first.client, f"/v1/sessions/{sid}/run", method="POST", body={"input": text("hello")}
    )
    assert events[0].event == "snapshot"
    assert events[-1].data == "[DONE]"
    second_events = await read_sse(
        first.client, f"/v1/sessions/{sid}/run", method="POST", body={"input": text("again")}
    )
    assert second_events[-1].data == "[DONE]"
    await first.gateway.stop()

    second = await start_gateway()  # a new gateway process-equivalent: nothing carried over in memory
    shown = (await second.client.get(f"/v1/sessions/{sid}")).json()
    assert shown["session"]["title"] == "chat"
    kinds = [(i["kind"], i["blocks"][0]["text"]) for i in shown["transcript"]]
    # The session's own agent instance (echo/<session id>) counts its turns: one conversation, one agent.
    assert kinds == [
        ("user", "hello"),
        ("assistant", "echo #1: hello"),
        ("user", "again"),
        ("assistant", "echo #2: again"),
    ]
    assert len(shown["runs"]) == 2
    runs = (await second.client.get("/v1/runs", params={"session_id": sid})).json()["runs"]
    assert sorted(r["run_id"] for r in runs) == sorted(shown["runs"])


async def test_memory_put_get_delete(gw: Stack) -> None:
    sid = await _session(gw)
    url = f"/v1/sessions/{sid}/memory/favourite"
    assert (await gw.client.get(url)).status_code == 404
    put = await gw.client.put(url, json={"value": {"colour": "green", "n": [1, 2]}})
    assert put.status_code == 200, put.text
    assert (await gw.client.get(url)).json()["value"] == {"colour": "green", "n": [1, 2]}
    assert (await gw.client.get(f"/v1/sessions/{sid}")).json()["memory_keys"] == ["favourite"]
    assert (await gw.client.delete(url)).status_code == 204
    assert (await gw.client.get(url)).status_code == 404
    assert (await gw.client.delete(url)).status_code == 404


async def test_child_sessions_are_listed_under_their_parent(gw: Stack) -> None:
    parent = await _session(gw)
    child = await _session(gw, parent_id=parent)
    shown = (await gw.client.get(f"/v1/sessions/{parent}")).json()
    assert shown["children"] == [child]
    listed = {s["session_id"] for s in (await gw.client.get("/v1/sessions")).json()}
    assert {parent, child} <= listed


async def test_session_errors_are_typed(gw: Stack) -> None:
    unknown_type = await gw.client.post("/v1/sessions", json={"agent_type": "nobody"})
    assert unknown_type.status_code == 404
    assert unknown_type.json()["error_type"] == "AgentNotFoundError"
    orphan = await gw.client.post("/v1/sessions", json={"agent_type": "echo", "parent_id": "ses_missing"})
    assert orphan.status_code == 404
    assert (await gw.client.get("/v1/sessions/ses_missing")).status_code == 404
    sid = await _session(gw)
    bad_key = await gw.client.put(f"/v1/sessions/{sid}/memory/a.b", json={"value": 1})
    assert bad_key.status_code == 422
    empty = await gw.client.post(f"/v1/sessions/{sid}/run", json={"input": []})
    assert empty.status_code == 422
    assert empty.headers["content-type"] == "application/problem+json"


async def test_a_failed_run_is_recorded_in_the_transcript_with_why(gw: Stack) -> None:
    response = await gw.client.post("/v1/sessions", json={"agent_type": "failing"})
    sid = response.json()["session_id"]
    events = await read_sse(gw.client, f"/v1/sessions/{sid}/run", method="POST", body={"input": text("x")})
    assert events[-1].data == "[DONE]"
    transcript = (await gw.client.get(f"/v1/sessions/{sid}")).json()["transcript"]
    assert [i["kind"] for i in transcript] == ["user", "custom"]
    assert transcript[1]["metadata"]["plexus.custom_type"] == "plexus.run_ended"
    assert transcript[1]["metadata"]["status"] == "failed"


async def test_an_llm_session_s_transcript_keeps_its_tool_calls_and_results_in_order(gw: Stack) -> None:
    """Seed 003's transcript: the turn's tool call and its result are items between the user's text and the
    answer, in `GET /v1/sessions/{id}` and in `plexus sessions show` (text and --json)."""
    response = await gw.client.post("/v1/sessions", json={"agent_type": "llm"})
    sid = response.json()["session_id"]
    events = await read_sse(gw.client, f"/v1/sessions/{sid}/run", method="POST", body={"input": text("q")})
    assert events[-1].data == "[DONE]"
    transcript = (await gw.client.get(f"/v1/sessions/{sid}")).json()["transcript"]
    assert [i["kind"] for i in transcript] == ["user", "assistant", "tool", "assistant"]
    call, result = transcript[1]["blocks"], transcript[2]["blocks"]
    assert [(b["type"], b["call_id"], b["tool_name"], b["arguments"]) for b in call] == [
        ("tool_use", "c1", "lookup", {"q": "plexus"})
    ]
    assert [(b["type"], b["call_id"]) for b in result] == [("tool_result", "c1")]
    assert result[0]["content"][0]["text"] == "found plexus"
    assert transcript[3]["blocks"][0]["text"] == "Found it."
    run_ids = {i["metadata"]["plexus.run_id"] for i in transcript}
    assert len(run_ids) == 1

    code, out, err = await plexus("sessions", "show", sid, "--nats", gw.nats_url)
    assert code == 0, err
    lines = out.splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["user", "assistant", "tool", "assistant"]
    assert 'lookup({"q": "plexus"}) [c1]' in lines[1]
    assert "[c1] found plexus" in lines[2]
    code, out, err = await plexus("sessions", "show", sid, "--json", "--nats", gw.nats_url)
    assert code == 0, err
    assert json.loads(out)["transcript"] == transcript
