"""`/v1` runs, agents and messages over real HTTP against a real cluster."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from plexus.core import AgentId, RunId, RunMessageReceived, TextBlock
from plexus.runtime.kernel import escape_token

from .conftest import SseEvent, Stack, read_sse


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


async def test_openapi_lists_the_v1_routes(gw: Stack) -> None:
    spec = (await gw.client.get("/openapi.json")).json()
    for path in (
        "/v1/agents",
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/tree",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/cancel",
        "/v1/runs/{run_id}/approve",
        "/v1/sessions",
        "/v1/agents/{agent_type}/{key}/messages",
    ):
        assert path in spec["paths"], path


async def test_agents_lists_registered_types_with_their_live_workers(gw: Stack) -> None:
    response = await gw.client.get("/v1/agents")
    assert response.status_code == 200
    by_type = {a["type"]: a for a in response.json()}
    assert {"echo", "fanout", "leaf", "failing"} <= set(by_type)
    assert by_type["echo"]["capabilities"] == ["chat"]
    assert by_type["echo"]["workers"], "the worker hosting echo is listed"
    workers = (await gw.client.get("/v1/workers")).json()
    assert any("default/echo" in w["types"] for w in workers)

    async def echo_partitions() -> list[int]:
        listed = (await gw.client.get("/v1/workers")).json()
        return sorted(p for w in listed for p in w["partitions"].get("default/echo", []))

    # Durable types' inbox partitions are leased by the live workers: all 16 of each, once the leases settle
    # (a worker that just started, or one another test left behind, may still be rebalancing).
    async with asyncio.timeout(30):
        while await echo_partitions() != list(range(16)):  # noqa: ASYNC110 - leases have no event here
            await asyncio.sleep(0.2)


async def test_message_rpc_returns_the_reply(gw: Stack) -> None:
    response = await gw.client.post("/v1/agents/echo/k1/messages", json={"input": text("hi")})
    assert response.status_code == 200, response.text
    assert response.json()["output"][0]["text"] == "echo #1: hi"


async def test_message_rpc_failure_is_problem_json_with_the_kernel_error(gw: Stack) -> None:
    response = await gw.client.post(
        "/v1/agents/failing/k1/messages", json={"input": text("x"), "timeout_s": 10}
    )
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["error_type"] == "HandlerError"
    assert body["status"] == 502


async def test_message_to_an_unhosted_type_is_404(gw: Stack) -> None:
    response = await gw.client.post(
        "/v1/agents/nobody/k1/messages", json={"input": text("x"), "timeout_s": 0.5}
    )
    assert response.status_code == 404
    assert response.json()["error_type"] == "AgentNotFoundError"


async def test_run_lifecycle_start_get_tree_list(gw: Stack) -> None:
    cmd = json.dumps({"children": 2, "leaf": {"steps": 2, "tokens": 5}})
    response = await gw.client.post(
        "/v1/runs", json={"agent_id": "fanout/r1", "input": text(cmd), "budget": {"max_tokens": 1000}}
    )
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]
    record = await gw.rt.wait_run(run_id, timeout=30)
    assert record.status == "completed"

    one = (await gw.client.get(f"/v1/runs/{run_id}")).json()
    assert one["run"]["status"] == "completed"
    assert one["usage"]["tokens"] == 20
    assert one["budget"]["tokens"] == {"used": 20, "limit": 1000}

    tree = (await gw.client.get(f"/v1/runs/{run_id}/tree")).json()
    assert tree["root_id"] == run_id
    assert tree["runs"][0]["agent_id"] == "fanout/r1"
    assert sorted(r["agent_id"] for r in tree["runs"][1:]) == ["leaf/r1-0", "leaf/r1-1"]
    # A child's tree is its root's tree.
    child = tree["runs"][1]["run_id"]
    assert (await gw.client.get(f"/v1/runs/{child}/tree")).json()["root_id"] == run_id

    roots = (await gw.client.get("/v1/runs", params={"roots_only": "true", "status": "completed"})).json()
    assert [r["run_id"] for r in roots["runs"]] == [run_id]
    leaves = (await gw.client.get("/v1/runs", params={"agent_type": "leaf"})).json()
    assert len(leaves["runs"]) == 2
    assert (await gw.client.get("/v1/runs", params={"status": "failed"})).json()["runs"] == []


async def test_runs_pagination_walks_every_run_once(gw: Stack) -> None:
    ids = []
    for i in range(5):
        response = await gw.client.post("/v1/runs", json={"agent_id": f"echo/p{i}", "input": text("x")})
        ids.append(response.json()["run_id"])
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await gw.client.get("/v1/runs", params=params)).json()
        seen.extend(r["run_id"] for r in page["runs"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)


async def test_cancel_cancels_the_tree(gw: Stack) -> None:
    cmd = json.dumps({"children": 2, "leaf": {"steps": 100, "sleep": 0.1}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/c1", "input": text(cmd)})).json()[
        "run_id"
    ]
    await gw.rt.wait_run(run_id, timeout=10, until=("running",))
    response = await gw.client.post(f"/v1/runs/{run_id}/cancel", json={"reason": "enough"})
    assert response.status_code == 200, response.text
    record = await gw.rt.wait_run(run_id, timeout=30)
    assert record.status == "cancelled"
    again = await gw.client.post(f"/v1/runs/{run_id}/cancel")
    assert again.status_code in (200, 409)


async def test_a_run_awaiting_approval_shows_it_and_resumes_when_approved(gw: Stack) -> None:
    created = await gw.client.post("/v1/runs", json={"agent_id": "gatekeeper/g1", "input": text("open")})
    run_id = created.json()["run_id"]
    await gw.rt.wait_run(run_id, timeout=20, until=("awaiting_approval",))
    shown = (await gw.client.get(f"/v1/runs/{run_id}")).json()
    assert shown["run"]["status"] == "awaiting_approval"
    assert shown["run"]["awaiting"] == ["door-1"]
    wrong = await gw.client.post(f"/v1/runs/{run_id}/approve", json={"decision_id": "door-2"})
    assert wrong.status_code == 409, wrong.text
    assert wrong.json()["error_type"] == "RunStateError"
    empty = await gw.client.post(f"/v1/runs/{run_id}/approve", json={"decision_id": ""})
    assert empty.status_code == 422
    ok = await gw.client.post(f"/v1/runs/{run_id}/approve", json={"decision_id": "door-1", "reason": "fine"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["run"]["status"] == "running"
    record = await gw.rt.wait_run(run_id, timeout=20)
    assert record.status == "completed"
    assert [b.text for b in await gw.rt.run_result(run_id) if isinstance(b, TextBlock)] == [
        "door-1 approved=True"
    ]


async def test_a_run_whose_later_turn_reuses_a_call_id_is_approved_twice_over_http(gw: Stack) -> None:
    """Both turns of an LLM agent call ``call_0``: the second awaits a decision again (not ``running`` while
    its agent is parked), and its approval within the duplicate window reaches the agent (not dropped as a
    repeat of the first)."""
    created = await gw.client.post("/v1/runs", json={"agent_id": "porter/d1", "input": text("open both")})
    run_id = created.json()["run_id"]
    first = await gw.rt.wait_run(run_id, timeout=20, until=("awaiting_approval",))
    assert first.awaiting == ["call_0"]
    ok = await gw.client.post(f"/v1/runs/{run_id}/approve", json={"decision_id": "call_0"})
    assert ok.status_code == 200, ok.text
    second = await gw.rt.wait_run(run_id, timeout=20, until=("awaiting_approval", "completed", "failed"))
    assert second.status == "awaiting_approval"
    shown = (await gw.client.get(f"/v1/runs/{run_id}")).json()["run"]
    assert (shown["awaiting"], shown.get("decided", [])) == (["call_0"], [])
    assert shown["suspension"] != first.suspension
    stale = {"decision_id": "call_0", "suspension": first.suspension}  # a retry of the first decision
    refused = await gw.client.post(f"/v1/runs/{run_id}/approve", json=stale)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error_type"] == "RunStateError"
    current = {"decision_id": "call_0", "suspension": shown["suspension"]}
    again = await gw.client.post(f"/v1/runs/{run_id}/approve", json=current)
    assert again.status_code == 200, again.text
    assert (await gw.rt.wait_run(run_id, timeout=20)).status == "completed"
    assert [b.text for b in await gw.rt.run_result(run_id) if isinstance(b, TextBlock)] == ["both doors open"]
    late = await gw.client.post(
        f"/v1/runs/{run_id}/approve", json={"decision_id": "call_0", "approved": False}
    )
    assert late.status_code == 409, late.text


async def test_a_plain_message_that_ends_awaiting_approval_is_a_409_naming_the_calls(gw: Stack) -> None:
    """Issue 37 item 5: the suspension is a typed outcome (ApprovalRequired), not a 200 with a status."""
    sent = await gw.client.post("/v1/agents/gatekeeper/g2/messages", json={"input": text("open")})
    assert sent.status_code == 409, sent.text
    problem = sent.json()
    assert problem["error_type"] == "ApprovalRequired"
    assert problem["fields"]["call_ids"] == ["door-1"]
    assert problem["fields"]["agent_id"].endswith("gatekeeper/g2")


async def test_a_plain_agents_pending_calls_are_decided_over_http_per_suspension(gw: Stack) -> None:
    """The 409 a plain send gets names the pending calls; `/approvals/{call_id}` decides them: with ``wait``
    the resumed agent's answer (or its next suspension, a 409 again), without it once stored (a repeat once).
    A decision naming a suspension that has ended is a 409; the later turn's reused ``call_0`` is decided."""
    path = "/v1/agents/porter/p1"
    sent = await gw.client.post(f"{path}/messages", json={"input": text("open both")})
    assert sent.status_code == 409, sent.text
    (call,) = sent.json()["fields"]["calls"]
    assert (call["call_id"], call["tool_name"], call["arguments"]) == ("call_0", "open_door", {"door": 1})
    first = {"suspension": call["suspension"]}
    resumed = await gw.client.post(f"{path}/approvals/call_0", json={**first, "wait": True})
    assert resumed.status_code == 409, resumed.text  # the next turn's call_0 waits
    assert resumed.json()["error_type"] == "ApprovalRequired"
    (later,) = resumed.json()["fields"]["calls"]
    assert (later["call_id"], later["arguments"]) == ("call_0", {"door": 2})
    assert later["suspension"] != call["suspension"]
    for _ in range(2):  # a retry of the first decision, its answer lost: stored (once), not taken
        stored = await gw.client.post(f"{path}/approvals/call_0", json=first)
        assert stored.status_code == 200, stored.text
        assert stored.json() == {
            "agent_id": "porter/p1",
            "call_id": "call_0",
            "approved": True,
            "output": None,
        }
    stale = await gw.client.post(f"{path}/approvals/call_0", json={**first, "approved": False, "wait": True})
    assert stale.status_code == 409, stale.text
    assert stale.json()["error_type"] == "NoPendingApprovalError"
    done = await gw.client.post(
        f"{path}/approvals/call_0", json={"suspension": later["suspension"], "wait": True}
    )
    assert done.status_code == 200, done.text
    assert [b["text"] for b in done.json()["output"]] == ["both doors open"]
    log = await gw.rt.event_log(AgentId("porter", "p1")).read()
    # The input, two decisions that resumed it, the retry once, the refused stale one.
    assert len([r for r in log if isinstance(r.entry, RunMessageReceived)]) == 5
    unknown = await gw.client.post("/v1/agents/nobody/x/approvals/call_0", json={})
    assert unknown.status_code == 404, unknown.text


async def test_events_stream_snapshot_then_live_then_done(gw: Stack) -> None:
    cmd = json.dumps({"children": 2, "leaf": {"steps": 3, "tokens": 1, "sleep": 0.05}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/e1", "input": text(cmd)})).json()[
        "run_id"
    ]
    events = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
    assert events[0].event == "snapshot"
    assert events[0].id == "0"
    assert events[0].json()["root_id"] == run_id
    assert events[-1].data == "[DONE]"
    ids = [int(e.id or "-1") for e in events[1:-1]]
    assert ids == sorted(set(ids)), "ids strictly increase"
    names = {e.event for e in events[1:-1]}
    assert {"status", "progress"} <= names
    statuses = [
        e.json()["run"]["status"]
        for e in events
        if e.event == "status" and e.json()["run"]["run_id"] == run_id
    ]
    assert statuses[-1] == "completed"
    leaf_steps = [e for e in events if e.event == "progress" and "leaf" in e.json()["progress"]["agent_id"]]
    assert len(leaf_steps) == 6


async def test_events_resume_with_last_event_id_loses_and_repeats_nothing(gw: Stack) -> None:
    cmd = json.dumps({"children": 3, "leaf": {"steps": 2}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/e2", "input": text(cmd)})).json()[
        "run_id"
    ]
    full = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
    middle = full[len(full) // 2]
    assert middle.id is not None
    assert middle.event != "snapshot"
    resumed = await read_sse(gw.client, f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": middle.id})
    expected = [
        (e.id, e.event)
        for e in full[len(full) // 2 + 1 : -1]
        if not (e.event == "status" and e.json().get("reconciled"))
    ]
    # Reconciled status events restate current records (flagged, with the id of the last real event).
    replayed = [
        (e.id, e.event) for e in resumed[:-1] if not (e.event == "status" and e.json().get("reconciled"))
    ]
    assert replayed == expected
    assert resumed[-1].data == "[DONE]"


async def test_done_waits_for_the_status_event_of_an_ending_whose_record_is_written_first(gw: Stack) -> None:
    """The orchestrator writes a run's record, then announces it on the progress stream: a client may read
    "completed" before that event is stored. [DONE] waits for it (else a resume would read one event more)."""
    done = (await gw.client.post("/v1/runs", json={"agent_id": "echo/late", "input": text("x")})).json()
    model_events = await read_sse(gw.client, f"/v1/runs/{done['run_id']}/events")
    ending = next(e for e in reversed(model_events) if e.event == "status" and not e.json().get("reconciled"))
    assert ending.json()["progress"]["metadata"]["status"] == "completed"

    # The orchestrator's two writes for a root that ends, copied from that run into a run of our own: the
    # record first; its status event only after a client has been shown the ended record.
    run_id = str(RunId.new())
    record = {**ending.json()["run"], "run_id": run_id, "root_id": run_id, "updated_at": time.time()}
    progress = {
        **ending.json()["progress"],
        "run_id": run_id,
        "root_id": run_id,
        "agent_id": f"orchestrator/{run_id}",
    }
    await gw.rt.topology.runs.put(f"run.{escape_token(run_id)}", json.dumps(record).encode())
    snapshot = asyncio.Event()

    def on_event(event: SseEvent) -> bool:
        if event.event == "snapshot":
            snapshot.set()
        return False

    reader = asyncio.ensure_future(read_sse(gw.client, f"/v1/runs/{run_id}/events", stop=on_event))
    await asyncio.wait_for(snapshot.wait(), 30)
    # The announcement lags the record (a JetStream round trip, more under load): here by longer than the
    # gateway takes to look at the ended tree (one poll), well within its settle_s (10 s).
    await asyncio.sleep(1.0)
    assert not reader.done(), [(e.id, e.event, e.data) for e in reader.result()]
    ack = await gw.rt.js.publish(
        gw.rt.subjects.progress(run_id, "orchestrator", run_id), json.dumps(progress).encode()
    )
    events = await asyncio.wait_for(reader, 30)
    assert [(e.id, e.event) for e in events] == [
        ("0", "snapshot"),
        (str(ack.seq), "status"),
        (f"{ack.seq}.1", "message"),
    ]
    assert events[1].json()["run"]["status"] == "completed"
    assert events[-1].data == "[DONE]"

    # Resumed after that event (the gateway finds it on the stream instead of reading it): nothing more.
    resumed = await read_sse(gw.client, f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(ack.seq)})
    assert [e.data for e in resumed if not (e.event == "status" and e.json().get("reconciled"))] == ["[DONE]"]


async def test_a_viewer_disconnecting_does_not_cancel_the_run(gw: Stack) -> None:
    cmd = json.dumps({"children": 1, "leaf": {"steps": 5, "sleep": 0.1}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/d1", "input": text(cmd)})).json()[
        "run_id"
    ]
    got = await read_sse(gw.client, f"/v1/runs/{run_id}/events", stop=lambda e: e.event == "progress")
    assert got[-1].event == "progress"
    record = await gw.rt.wait_run(run_id, timeout=30)
    assert record.status == "completed"


async def test_heartbeat_comments_flow_while_the_tree_is_quiet(gw: Stack) -> None:
    cmd = json.dumps({"children": 1, "leaf": {"steps": 1, "sleep": 2.5}})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "fanout/h1", "input": text(cmd)})).json()[
        "run_id"
    ]
    comments: list[str] = []
    events = await read_sse(gw.client, f"/v1/runs/{run_id}/events", comments=comments)
    assert events[-1].data == "[DONE]"
    assert comments, "the gateway (heartbeat_s=1 here) sent keep-alive comments during the 2.5 s quiet step"


async def test_two_gateways_serve_the_same_run(start_gateway: object, gw: Stack) -> None:
    other = await start_gateway()  # type: ignore[operator]
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "echo/two", "input": text("x")})).json()[
        "run_id"
    ]
    await gw.rt.wait_run(run_id, timeout=30)
    a, b = await asyncio.gather(gw.client.get(f"/v1/runs/{run_id}"), other.client.get(f"/v1/runs/{run_id}"))
    assert a.json()["run"] == b.json()["run"]


async def test_token_deltas_stream_live_as_token_events(gw: Stack) -> None:
    cmd = json.dumps({"rounds": 40})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "streamer/s1", "input": text(cmd)})).json()[
        "run_id"
    ]
    events = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
    tokens = [e.json() for e in events if e.event == "token"]
    assert tokens, "deltas produced while the viewer watched arrive as token events"
    assert all(t["agent_id"] == "streamer/s1" and t["run_id"] == run_id for t in tokens)
    assert all(t["delta"]["type"] == "text_delta" and t["delta"]["text"].startswith("tok") for t in tokens)
    assert events[-1].data == "[DONE]"


async def test_every_event_id_is_unique_and_names_the_last_durable_event(gw: Stack) -> None:
    """Papercut: token events reused the last durable event's id, so a client deduplicating by id dropped
    them. A durable event's id is its sequence; each event after it that is not durable is ``<seq>.<n>``."""
    cmd = json.dumps({"rounds": 30})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "streamer/u1", "input": text(cmd)})).json()[
        "run_id"
    ]
    events = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
    ids = [e.id for e in events]
    assert None not in ids
    assert len(set(ids)) == len(ids), [i for i in ids if ids.count(i) > 1]
    assert any(e.event == "token" for e in events)
    seq, n = 0, 0
    for event in events:
        durable = event.event not in ("token", "message") and not (
            event.event == "status" and event.json().get("reconciled")
        )
        if durable:
            assert event.id is not None
            assert event.id.isdigit(), (event.event, event.id)
            seq, n = int(event.id), 0
        else:
            n += 1
            assert event.id == f"{seq}.{n}", (event.event, event.id, seq, n)


async def test_a_resume_from_a_token_event_loses_nothing_and_reuses_no_id(gw: Stack) -> None:
    cmd = json.dumps({"rounds": 30})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "streamer/u2", "input": text(cmd)})).json()[
        "run_id"
    ]
    first = await read_sse(gw.client, f"/v1/runs/{run_id}/events", stop=lambda e: e.event == "token")
    token = first[-1]
    assert token.id is not None
    assert "." in token.id
    rest = await read_sse(gw.client, f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": token.id})
    ids = [e.id for e in first + rest]
    assert len(set(ids)) == len(ids), [i for i in ids if ids.count(i) > 1]
    whole = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
    durable = [
        (e.id, e.event) for e in whole if e.id is not None and e.id.isdigit() and e.event != "snapshot"
    ]
    assert [(e.id, e.event) for e in first + rest if e.id is not None and e.id.isdigit()][1:] == durable
    assert rest[-1].data == "[DONE]"


async def test_many_concurrent_viewers_each_get_every_event(gw: Stack) -> None:
    """Regression: on a busy gateway a quiet poll is no proof that a viewer has caught up; [DONE] waits for
    the consumer to have nothing pending (early ends once delivered 3,707 of 30,000 events to 100 viewers)."""
    cmd = json.dumps({"n": 150, "gap": 0.002})
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "ticker/many", "input": text(cmd)})).json()[
        "run_id"
    ]
    streams = await asyncio.gather(*(read_sse(gw.client, f"/v1/runs/{run_id}/events") for _ in range(20)))
    for events in streams:
        ticks = [e.json()["progress"]["content"][0]["text"] for e in events if e.event == "progress"]
        assert ticks == [str(i) for i in range(150)]
        assert events[-1].data == "[DONE]"
    usage_seen = [e.json()["usage"] for e in streams[0] if e.event == "status"]
    assert usage_seen, "status events carry the tree's usage"


async def test_a_busy_tree_does_not_make_the_stream_read_its_root_per_event(gw: Stack) -> None:
    """Between the root's status events a stream reads the root's record at most once per poll (0.5 s),
    not after every event: a dashboard of a busy tree otherwise costs the cluster a read per event per viewer.
    Counted on the server: every read of the root's record by anyone (KV get requests for its key)."""
    cmd = json.dumps({"n": 300, "gap": 0.001})
    run_id = str(RunId.new())
    key = f"run.{escape_token(run_id)}"
    reads: list[float] = []

    async def on_get(msg: Any) -> None:
        if key.encode() in msg.data or msg.subject.endswith(key):
            reads.append(time.monotonic())

    counter = await gw.rt.nc.subscribe("$JS.API.>", cb=on_get)
    try:
        started = time.monotonic()
        await gw.client.post(
            "/v1/runs", json={"agent_id": "ticker/busy", "input": text(cmd), "run_id": run_id}
        )
        events = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
        elapsed = time.monotonic() - started
    finally:
        await counter.unsubscribe()
    ticks = [e for e in events if e.event == "progress"]
    assert len(ticks) == 300
    assert events[-1].data == "[DONE]"
    # The orchestrator's and the worker's own reads of the record, the gateway's start of the stream and its
    # reads at each status event and poll: a handful, against 300+ when every event read it.
    statuses = sum(1 for e in events if e.event == "status")
    assert len(reads) <= 20 + statuses + 2 * elapsed / 0.5, (len(reads), statuses, elapsed)


async def test_tool_steps_arrive_as_tool_call_events(gw: Stack) -> None:
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "tooler/t1", "input": text("x")})).json()[
        "run_id"
    ]
    events = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
    tools = [e.json()["progress"] for e in events if e.event == "tool_call"]
    assert [(t["step"], t["content"][0]["text"]) for t in tools] == [
        ("tool_call", "search(q='sse')"),
        ("tool_result", "3 hits"),
    ]


async def test_a_failed_run_streams_its_failure_and_is_found_by_the_failed_filter(gw: Stack) -> None:
    run_id = (await gw.client.post("/v1/runs", json={"agent_id": "failing/f1", "input": text("x")})).json()[
        "run_id"
    ]
    events = await read_sse(gw.client, f"/v1/runs/{run_id}/events")
    final = [e.json()["run"] for e in events if e.event == "status" and "run" in e.json()][-1]
    assert final["status"] == "failed"
    assert final["error"]["error_type"]
    assert events[-1].data == "[DONE]"
    failed = (await gw.client.get("/v1/runs", params={"status": "failed"})).json()["runs"]
    assert [r["run_id"] for r in failed] == [run_id]


async def test_runs_changes_names_each_run_as_its_record_changes(gw: Stack) -> None:
    """The live runs list's feed: a run started after subscribing shows up in a `changed` event."""
    events: list[SseEvent] = []
    ready = asyncio.Event()

    def seen(ev: SseEvent) -> bool:
        events.append(ev)
        if ev.event == "ready":
            ready.set()
        return False  # read until cancelled

    reader = asyncio.ensure_future(read_sse(gw.client, "/v1/runs/changes", stop=seen))
    try:
        await asyncio.wait_for(ready.wait(), 20)
        body = {"agent_id": "echo/changes", "input": [{"type": "text", "text": "hi"}]}
        run_id = (await gw.client.post("/v1/runs", json=body)).json()["run_id"]

        def named() -> set[str]:
            return {i for ev in events if ev.event == "changed" for i in json.loads(ev.data)["run_ids"]}

        for _ in range(100):
            if run_id in named():
                break
            await asyncio.sleep(0.1)
        assert run_id in named()
        assert events[0].event == "ready"
    finally:
        reader.cancel()
