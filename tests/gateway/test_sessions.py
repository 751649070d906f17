"""Sessions: created, run with SSE, transcript as seed 002 items, memory, surviving a gateway restart."""

from __future__ import annotations

from .conftest import Stack, StartGateway, read_sse


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
