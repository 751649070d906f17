"""The gateway's A2A server driven by the a2a-sdk's own client: a real gateway, nats-server, orchestrator and
worker (tests/gateway/conftest.py); bad input gets the protocol's typed JSON-RPC errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskState,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict  # type: ignore[import-untyped]
from google.protobuf.struct_pb2 import Value  # type: ignore[import-untyped]

from plexus.gateway import GatewayConfig, hash_token

from .conftest import TOKEN, Stack, StartGateway

EXPOSED = ("echo", "leaf", "gatekeeper", "failing")


@pytest.fixture
async def a2a(start_gateway: StartGateway) -> Stack:
    return await start_gateway(
        GatewayConfig(token_hashes=frozenset({hash_token(TOKEN)}), heartbeat_s=1.0, a2a_types=EXPOSED)
    )


async def _client(stack: Stack, agent_type: str, *, streaming: bool = False, polling: bool = False) -> Client:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60.0)
    config = ClientConfig(streaming=streaming, polling=polling, httpx_client=http)
    return await create_client(f"{stack.url}/a2a/{agent_type}", client_config=config)


def _message(*parts: Part, context_id: str = "", task_id: str = "") -> SendMessageRequest:
    message = Message(
        message_id=str(uuid.uuid4()), role=Role.ROLE_USER, context_id=context_id, task_id=task_id
    )
    message.parts.extend(parts)
    return SendMessageRequest(message=message)


def _text(text: str) -> Part:
    return Part(text=text)


def _data(data: dict[str, Any]) -> Part:
    return Part(data=ParseDict(data, Value()))


async def _events(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [event async for event in stream]


async def _task(client: Client, request: SendMessageRequest) -> Task:
    events = await _events(client.send_message(request))
    assert len(events) == 1, events
    assert events[0].HasField("task"), events
    return events[0].task


def _reply_text(task: Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def test_the_card_is_built_from_the_registry_and_only_exposed_types_have_one(a2a: Stack) -> None:
    async with httpx.AsyncClient(base_url=a2a.url) as anonymous:  # the card is public
        response = await anonymous.get("/a2a/echo/.well-known/agent-card.json")
        assert response.status_code == 200, response.text
        card = response.json()
        assert card["name"] == "echo"
        assert card["description"] == "replies with its input"
        assert [s["id"] for s in card["skills"]] == ["chat"]
        assert card["capabilities"]["streaming"] is True
        assert card["supportedInterfaces"][0]["url"] == f"{a2a.url}/a2a/echo"
        assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
        for hidden in ("fanout", "nosuchtype"):
            assert (await anonymous.get(f"/a2a/{hidden}/.well-known/agent-card.json")).status_code == 404
        # The endpoint takes the gateway's bearer tokens.
        body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
        # JSON-RPC is not REST: the A2A routes stay out of the OpenAPI document (and its schemathesis run).
        assert not [p for p in (await a2a.client.get("/openapi.json")).json()["paths"] if "a2a" in p]
        assert (await anonymous.post("/a2a/echo", json=body)).status_code == 401


async def test_no_type_is_exposed_by_default(gw: Stack) -> None:
    assert (await gw.client.get("/a2a/echo/.well-known/agent-card.json")).status_code == 404
    assert (await gw.client.post("/a2a/echo", json={"jsonrpc": "2.0", "id": 1})).status_code == 404


async def test_send_message_runs_the_agent_and_a_context_keeps_its_agent(a2a: Stack) -> None:
    client = await _client(a2a, "echo")
    first = await _task(client, _message(_text("hi")))
    assert first.status.state == TaskState.TASK_STATE_COMPLETED
    assert _reply_text(first) == "echo #1: hi"
    record = (await a2a.client.get(f"/v1/runs/{first.id}")).json()["run"]  # task id = run id
    assert record["agent_id"].endswith(f"echo/{first.context_id}")
    second = await _task(client, _message(_text("again"), context_id=first.context_id))
    assert _reply_text(second) == "echo #2: again"
    assert second.id != first.id
    fetched = await client.get_task(GetTaskRequest(id=first.id))
    assert fetched.status.state == TaskState.TASK_STATE_COMPLETED
    assert _reply_text(fetched) == "echo #1: hi"
    await client.close()


async def test_data_parts_go_in_as_data_blocks_and_failures_are_failed_tasks(a2a: Stack) -> None:
    client = await _client(a2a, "failing")
    task = await _task(client, _message(_data({"x": 1})))
    assert task.status.state == TaskState.TASK_STATE_FAILED
    assert "nope" in task.status.message.parts[0].text
    await client.close()


async def test_streaming_follows_progress_then_ends_with_the_reply(a2a: Stack) -> None:
    client = await _client(a2a, "leaf", streaming=True)
    events = await _events(client.send_message(_message(_text(json.dumps({"steps": 3, "sleep": 0.1})))))
    assert events[0].HasField("task")
    working = [
        e.status_update.status.message.parts[0].text
        for e in events
        if e.HasField("status_update") and e.status_update.status.state == TaskState.TASK_STATE_WORKING
    ]
    # The orchestrator's own events (the run started) come too; the agent's steps in order.
    assert [w for w in working if w.startswith("step")] == ["step 1", "step 2", "step 3"]
    assert events[-2].HasField("artifact_update")
    assert events[-2].artifact_update.artifact.parts[0].text.endswith("did 3")
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    await client.close()


async def test_subscribe_cancel_and_a_cancel_of_an_ended_task(a2a: Stack) -> None:
    poller = await _client(a2a, "leaf", polling=True)
    slow = await _task(poller, _message(_text(json.dumps({"steps": 2, "sleep": 0.3}))))
    assert slow.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    streamer = await _client(a2a, "leaf", streaming=True)
    events = await _events(streamer.subscribe(SubscribeToTaskRequest(id=slow.id)))
    assert events[0].task.id == slow.id
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    with pytest.raises(UnsupportedOperationError):  # subscribing to an ended task
        await _events(streamer.subscribe(SubscribeToTaskRequest(id=slow.id)))

    long = await _task(poller, _message(_text(json.dumps({"steps": 100, "sleep": 0.2}))))
    cancelled = await poller.cancel_task(CancelTaskRequest(id=long.id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(TaskNotCancelableError):
        await poller.cancel_task(CancelTaskRequest(id=long.id))
    await poller.close()
    await streamer.close()


async def test_unknown_tasks_and_other_types_tasks_are_not_found(a2a: Stack) -> None:
    echo = await _client(a2a, "echo")
    leaf = await _client(a2a, "leaf")
    task = await _task(echo, _message(_text("mine")))
    for client, task_id in ((leaf, task.id), (echo, "run_nosuchrun"), (echo, "")):
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id=task_id))
        with pytest.raises(TaskNotFoundError):
            await client.cancel_task(CancelTaskRequest(id=task_id))
    await echo.close()
    await leaf.close()


async def test_an_approval_is_input_required_and_a_data_part_decides_it(a2a: Stack) -> None:
    client = await _client(a2a, "gatekeeper")
    task = await _task(client, _message(_text("open")))
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert "door-1" in task.status.message.parts[0].text
    with pytest.raises(Exception, match="approved"):  # text is not a decision
        await _task(client, _message(_text("yes"), task_id=task.id, context_id=task.context_id))
    done = await _task(
        client, _message(_data({"approved": True}), task_id=task.id, context_id=task.context_id)
    )
    assert done.id == task.id
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert _reply_text(done) == "door-1 approved=True"
    with pytest.raises(UnsupportedOperationError):  # the task has ended
        await _task(client, _message(_data({"approved": True}), task_id=task.id))
    await client.close()


async def _rpc(stack: Stack, body: Any, *, version: str | None = "1.0") -> dict[str, Any]:
    headers = {"Content-Type": "application/json", **({"A2A-Version": version} if version else {})}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await stack.client.post("/a2a/echo", content=content, headers=headers)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


async def test_bad_json_rpc_gets_typed_errors_not_a_500(a2a: Stack) -> None:
    assert (await _rpc(a2a, b"{not json"))["error"]["code"] == -32700
    assert (await _rpc(a2a, {"jsonrpc": "2.0", "id": 1, "method": "Nope"}))["error"]["code"] == -32601
    assert (await _rpc(a2a, [1, 2]))["error"]["code"] == -32600
    unknown_part = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"kind": "hologram", "x": 1}]}
    reply = await _rpc(
        a2a, {"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": unknown_part}}
    )
    assert reply["error"]["code"] == -32602
    assert "unknown part" in reply["error"]["message"]
    no_parts = {"messageId": "m2", "role": "ROLE_USER", "parts": []}
    reply = await _rpc(
        a2a, {"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": no_parts}}
    )
    assert reply["error"]["code"] == -32602
    reply = await _rpc(a2a, {"jsonrpc": "2.0", "id": 4, "method": "ListTasks", "params": {}})
    assert reply["error"]["code"] == -32004


async def test_the_v0_3_method_names_are_served_too(a2a: Stack) -> None:
    message = {
        "kind": "message",
        "messageId": "m1",
        "role": "user",
        "parts": [{"kind": "text", "text": "old"}],
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}
    reply = await _rpc(a2a, body, version=None)
    assert reply["result"]["status"]["state"] == "completed", reply
    assert reply["result"]["artifacts"][0]["parts"][0]["text"] == "echo #1: old"


def test_blocks_round_trip_through_parts() -> None:
    from plexus.core import DataBlock, ErrorBlock, ImageBlock, TextBlock
    from plexus.gateway._a2a_parts import blocks_from_parts, parts_from_blocks

    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    blocks = [TextBlock(text="t"), DataBlock(data={"a": [1, "b"]}), ImageBlock(data=png)]
    text, data, image = blocks_from_parts(parts_from_blocks(blocks))
    assert isinstance(text, TextBlock)
    assert isinstance(data, DataBlock)
    assert isinstance(image, ImageBlock)
    assert data.data == {"a": [1, "b"]}
    assert image.data == png
    assert image.mime_type == "image/png"
    (error,) = parts_from_blocks([ErrorBlock(error_type="E", message="m")])
    assert MessageToDict(error.metadata) == {"plexus_type": "error"}
    assert MessageToDict(error.data)["message"] == "m"


async def test_the_gateway_command_exposes_the_types_of_its_flag_and_environment(gw: Stack) -> None:
    env = {**os.environ, "PLEXUS_GATEWAY_A2A_TYPES": "leaf, failing"}
    argv = [sys.executable, "-m", "plexus.runtime.cli", "gateway", "--nats", gw.nats_url, "--port", "0"]
    proc = await asyncio.create_subprocess_exec(
        *argv, "--token-hash", hash_token(TOKEN), "--a2a-type", "echo",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        url = line.split()[3]
        async with httpx.AsyncClient(base_url=url) as client:
            for agent_type, status in (("echo", 200), ("leaf", 200), ("failing", 200), ("gatekeeper", 404)):
                card = await client.get(f"/a2a/{agent_type}/.well-known/agent-card.json")
                assert card.status_code == status, agent_type
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
    bad = await asyncio.create_subprocess_exec(
        *argv, "--a2a-type", "not a type", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await asyncio.wait_for(bad.communicate(), timeout=30)
    assert bad.returncode == 2
    assert b"A2A agent type" in err
