"""`ApprovalRequired` inside a handler: a `ctx.send` to an agent that parks raises it there too (a plain send
is a plain send, whoever makes it). A handler can catch it and answer on its own terms; one that does not
fails with it, and its own caller gets the same typed error (the parked agent's id and calls) to decide on."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.llm import ApprovalRequired, LLMAgent, ScriptedModel, ScriptedTurn, approve, tool
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.orchestration import RunStatus

SENT: list[int] = []


@tool(needs_approval=True)
def transfer(amount: int) -> str:
    """Send money (a person must approve)."""
    SENT.append(amount)
    return f"sent {amount}"


class Delegator(Agent):
    """Passes each message on to the payer of its own key and answers with the payer's answer."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return await ctx.send(blocks, AgentId("payer", ctx.agent_id.key), timeout=20)


class CarefulDelegator(Agent):
    """Catches the payer's suspension and says so in its own answer."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        try:
            return await ctx.send(blocks, AgentId("payer", ctx.agent_id.key), timeout=20)
        except ApprovalRequired as pending:
            self.state["waiting_for"] = pending.agent_id
            return [TextBlock(text=f"{pending.agent_id} waits for {pending.calls[0]['tool_name']}")]


def _app() -> App:
    model = ScriptedModel(
        [
            ScriptedTurn(tool_calls=[("call_0", "transfer", {"amount": 5})]),
            ScriptedTurn(text="sent 5"),
        ]
    )
    app = App()
    app.register("payer", lambda _id: LLMAgent(model, tools=[transfer]))
    app.register("delegator", lambda _id: Delegator())
    app.register("careful", lambda _id: CarefulDelegator())
    return app


def _texts(reply: list[Any]) -> list[str]:
    return [b.text for b in reply if isinstance(b, TextBlock)]


async def test_a_handler_that_does_not_catch_it_passes_the_typed_suspension_to_its_caller(
    runtime: Runtime, start_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    SENT.clear()
    await start_worker(_app())
    with caplog.at_level(logging.INFO, logger="plexus.worker"), pytest.raises(ApprovalRequired) as pending:
        await runtime.send_message([TextBlock(text="pay 5")], AgentId("delegator", "d1"), timeout=30)
    # The parked agent, not the delegator: the one to decide for.
    assert pending.value.agent_id == str(AgentId("payer", "d1"))
    assert [c["tool_name"] for c in pending.value.calls] == ["transfer"]
    # A typed outcome passed on, not a fault of the delegator: logged at INFO.
    failed = [r for r in caplog.records if r.getMessage().startswith("handler failed")]
    assert [(r.levelno, getattr(r, "error_type", None)) for r in failed] == [
        (logging.INFO, "ApprovalRequired")
    ]

    (call,) = pending.value.calls
    reply = await approve(runtime, AgentId.parse(pending.value.agent_id), call, wait=True, timeout=30)
    assert _texts(reply) == ["sent 5"]
    assert SENT == [5]


async def test_a_handler_can_catch_it_and_answer_on_its_own_terms(
    runtime: Runtime, start_worker: Any
) -> None:
    SENT.clear()
    await start_worker(_app())
    reply = await runtime.send_message([TextBlock(text="pay 5")], AgentId("careful", "c1"), timeout=30)
    assert _texts(reply) == ["payer/c1 waits for transfer"]
    assert SENT == []


async def test_an_orchestrated_run_whose_handler_passes_it_on_fails_with_it(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    SENT.clear()
    await start_worker(_app())
    run_id = await runtime.start_run(AgentId("delegator", "r1"), [TextBlock(text="pay 5")])
    record = await runtime.wait_run(run_id, timeout=30)
    assert record.status == RunStatus.FAILED
    assert record.awaiting == []  # the run waits for nothing: the payer does, outside it
    with pytest.raises(ApprovalRequired) as pending:
        await runtime.run_result(run_id, timeout=30)
    assert pending.value.agent_id == str(AgentId("payer", "r1"))
    (call,) = pending.value.calls
    reply = await approve(runtime, AgentId.parse(pending.value.agent_id), call, wait=True, timeout=30)
    assert _texts(reply) == ["sent 5"]
