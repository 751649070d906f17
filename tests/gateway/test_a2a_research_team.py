"""The research-team example (examples/research_team.py, offline) driven end to end by the a2a-sdk's own
client through the gateway's A2A server: the planner is an A2A agent; its run tree (researchers that use an
MCP tool of their own, the typed writer) shows as ``working`` status updates, and the planner's answer comes
back as the task's artifact."""

from __future__ import annotations

import httpx
from a2a.client import ClientConfig, create_client
from a2a.types import GetTaskRequest, TaskState
from examples import research_team

from plexus.gateway import GatewayConfig, hash_token
from plexus.runtime import Runtime
from plexus.runtime.orchestration import RunStatus

from .conftest import TOKEN, StartGateway
from .test_a2a import _events, _message, _reply_text, _text
from .test_mcp_research_team import team

__all__ = ["team"]

ANSWER = "The report is ready: durable agents on NATS, journaled so no turn is paid twice."


async def test_an_a2a_client_drives_the_research_team(team: Runtime, start_gateway: StartGateway) -> None:
    stack = await start_gateway(
        GatewayConfig(token_hashes=frozenset({hash_token(TOKEN)}), heartbeat_s=1.0, a2a_types=("planner",))
    )
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120.0)
    client = await create_client(
        f"{stack.url}/a2a/planner", client_config=ClientConfig(streaming=True, httpx_client=http)
    )
    events = await _events(client.send_message(_message(_text("How does Plexus keep agents durable?"))))
    assert events[0].HasField("task")
    task_id = events[0].task.id
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[-2].artifact_update.artifact.parts[-1].text == ANSWER
    working = [
        e.status_update.status
        for e in events
        if e.HasField("status_update") and e.status_update.status.state == TaskState.TASK_STATE_WORKING
    ]
    agents = {s.message.metadata["agent_id"] for s in working}
    for topic in research_team.TOPICS:  # the tree's progress: every researcher's steps, the writer's
        assert f"researcher/{topic}" in agents, agents
    assert "writer/main" in agents, agents
    fetched = await client.get_task(GetTaskRequest(id=task_id))  # task id = the planner's run id
    assert fetched.status.state == TaskState.TASK_STATE_COMPLETED
    assert _reply_text(fetched).endswith(ANSWER)
    assert (await team.get_run(task_id)).status == RunStatus.COMPLETED
    await client.close()
    await http.aclose()
