"""Durable approvals: a needs_approval tool suspends the loop; the decision comes from another process
after the worker that suspended it has stopped, and the loop resumes on the new owner."""

from __future__ import annotations

from typing import Any

import pytest

from plexus.core import AgentId, DataBlock, ErrorBlock, TextBlock, ToolResultBlock
from plexus.llm import (
    ApprovalPendingError,
    LLMAgent,
    ModelRequest,
    NoPendingApprovalError,
    ScriptedModel,
    ScriptedTurn,
    approve,
    tool,
)
from plexus.runtime import App, Runtime

SENT: list[int] = []


@tool(needs_approval=True)
def transfer(amount: int) -> str:
    """Send money (a person must approve)."""
    SENT.append(amount)
    return f"sent {amount}"


@tool
def balance() -> str:
    """Read the balance."""
    return "100"


def _results(request: ModelRequest) -> dict[str, ToolResultBlock]:
    return {b.call_id: b for i in request.items for b in i.blocks if isinstance(b, ToolResultBlock)}


def _app(model: ScriptedModel) -> App:
    app = App()
    app.register("payer", lambda _id: LLMAgent(model, tools=[transfer, balance]))
    return app


def _script() -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedTurn(tool_calls=[("c1", "transfer", {"amount": 5}), ("c2", "balance", {})]),
            ScriptedTurn(text="done"),
        ]
    )


async def test_approval_survives_a_worker_change(runtime: Runtime, start_worker: Any) -> None:
    SENT.clear()
    model = _script()
    agent = AgentId("payer", "alice")
    first = await start_worker(_app(model))
    reply = await runtime.send_message([TextBlock(text="pay 5")], agent, timeout=20)
    assert isinstance(reply[0], DataBlock)
    assert reply[0].data == {"status": "awaiting_approval", "call_ids": ["c1"]}
    assert len(model.requests) == 1
    assert SENT == []  # nothing ran, not even the ungated balance call of the same turn
    with pytest.raises(ApprovalPendingError):
        await runtime.send_message([TextBlock(text="hello?")], agent, timeout=20)

    await first.stop(drain_timeout=5)  # the suspended loop lives only in the checkpointed state now
    await start_worker(_app(model))
    reply = await approve(runtime, agent, "c1", timeout=30)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done"]
    assert SENT == [5]
    results = _results(model.requests[1])
    assert results["c1"].content == [TextBlock(text="sent 5")]
    assert results["c2"].content == [TextBlock(text="100")]
    with pytest.raises(NoPendingApprovalError):
        await approve(runtime, agent, "c1", timeout=20)


async def test_denied_call_is_an_error_the_model_sees(runtime: Runtime, start_worker: Any) -> None:
    SENT.clear()
    model = _script()
    agent = AgentId("payer", "bob")
    await start_worker(_app(model))
    await runtime.send_message([TextBlock(text="pay 5")], agent, timeout=20)
    reply = await approve(runtime, agent, "c1", approved=False, reason="too much", timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done"]
    assert SENT == []
    (error,) = _results(model.requests[1])["c1"].content
    assert isinstance(error, ErrorBlock)
    assert error.error_type == "ApprovalDenied"
    assert "too much" in error.message
