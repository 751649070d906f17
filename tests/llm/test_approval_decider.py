"""Who decided (issue 38, transcript "approvals with who decided"): the decider travels with the decision
and the agent that takes it records it in its EventLog (an ``llm.approval`` entry committed with the
decision): `decided_by=` when given, else the deciding connection's identity (its NATS user)."""

from __future__ import annotations

from typing import Any

import pytest

from plexus.core import AgentId, TextBlock
from plexus.llm import ApprovalRequired, approve, deny
from plexus.runtime import Runtime
from plexus.runtime.kernel import NatsAuth
from plexus.runtime.orchestration import RunStatus
from tests.security.seeds import SecuredSeed

from .test_approvals import _app, _script, _started


async def _decisions(runtime: Runtime, agent: AgentId) -> list[dict[str, Any]]:
    return [
        r.entry.model_dump(include={"call_id", "approved", "reason", "decided_by"})
        for r in await runtime.event_log(agent).read()
        if r.entry.type == "llm.approval"
    ]


async def test_a_run_decision_records_the_decider_given(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    agent = AgentId("payer", "decided-run")
    await start_worker(_app(_script()))
    run_id = await _started(runtime, agent)
    record = await runtime.wait_run(run_id, timeout=20, until={RunStatus.AWAITING_APPROVAL})
    await deny(runtime, run_id, record.awaiting[0], reason="too much", decided_by="alice")
    assert (await runtime.wait_run(run_id, timeout=30)).status == RunStatus.COMPLETED
    assert await _decisions(runtime, agent) == [
        {"call_id": "c1", "approved": False, "reason": "too much", "decided_by": "alice"}
    ]


async def test_an_agent_decision_records_the_connections_nats_user_by_default(
    nats_server: Any, runtime: Runtime, start_worker: Any
) -> None:
    if isinstance(nats_server, SecuredSeed):
        pytest.skip("the seed's users are its own; an open server takes any user")
    agent = AgentId("payer", "decided-agent")
    await start_worker(_app(_script()))
    with pytest.raises(ApprovalRequired) as required:
        await runtime.send_message([TextBlock(text="pay 5")], agent, timeout=20)
    bob = await Runtime.connect(nats_server.url, auth=NatsAuth(user="bob", password="pw"))
    try:
        assert bob.identity == "bob"
        await approve(bob, agent, required.value.calls[0], wait=True, timeout=30)
    finally:
        await bob.close()
    assert await _decisions(runtime, agent) == [
        {"call_id": "c1", "approved": True, "reason": "", "decided_by": "bob"}
    ]
