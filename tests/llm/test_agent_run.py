"""LLMAgent inside a run: the tree budget stops a runaway loop, progress steps and live text deltas."""

from __future__ import annotations

from typing import Any

import pytest

from plexus.core import (
    AgentId,
    AgentStep,
    BudgetExhaustedError,
    ExecutionBudget,
    TextBlock,
    TextDelta,
    stream_event_from_json,
)
from plexus.llm import LLMAgent, ModelRequest, ScriptedModel, ScriptedTurn, tool
from plexus.runtime import App, Runtime, new_root_run


@tool
def ping() -> str:
    """Ping."""
    return "pong"


def _forever(request: ModelRequest) -> ScriptedTurn:
    return ScriptedTurn(text="again", tool_calls=[(f"c{len(request.items)}", "ping", {})])


async def test_tree_budget_stops_a_runaway_loop(runtime: Runtime, start_worker: Any) -> None:
    """ctx.usage() after every model call: with max_turns=3 in the run's budget, the 4th call is refused
    although the agent itself would loop 50 times."""
    model = ScriptedModel([_forever] * 50)
    app = App()
    app.register("looper", lambda _id: LLMAgent(model, tools=[ping], max_turns=50))
    await start_worker(app)
    run = new_root_run(budget=ExecutionBudget(max_turns=3))
    with pytest.raises(BudgetExhaustedError) as info:
        await runtime.send_message([TextBlock(text="go")], AgentId("looper", "b1"), timeout=20, run=run)
    assert info.value.dimension == "turns"
    assert len(model.requests) == 4


async def test_progress_steps_and_live_text_deltas(runtime: Runtime, start_worker: Any) -> None:
    model = ScriptedModel(
        [
            ScriptedTurn(text="Let me ping.", tool_calls=[("c1", "ping", {})]),
            ScriptedTurn(text="Got pong back."),
        ]
    )
    app = App()
    app.register("pinger", lambda _id: LLMAgent(model, tools=[ping]))
    await start_worker(app)
    agent = AgentId("pinger", "p1")
    sub = await runtime.nc.subscribe(runtime.subjects.stream(agent.type, agent.key))
    await runtime.nc.flush()
    run = new_root_run()
    reply = await runtime.send_message([TextBlock(text="ping")], agent, timeout=20, run=run)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["Got pong back."]

    deltas: list[str] = []
    while len("".join(deltas)) < len("Let me ping.Got pong back."):
        event = stream_event_from_json((await sub.next_msg(timeout=10)).data)
        if isinstance(event, TextDelta):
            deltas.append(event.text)
    await sub.unsubscribe()
    assert "".join(deltas) == "Let me ping.Got pong back."

    steps: list[AgentStep] = []
    async for progress in runtime.progress(run.run_id):
        if progress.agent_id == str(agent):
            steps.append(progress.step)
        if progress.step is AgentStep.DONE:
            break
    llm_steps = [s for s in steps if s is not AgentStep.STARTED]
    assert llm_steps == [
        AgentStep.THINKING,
        AgentStep.TOOL_CALL,
        AgentStep.TOOL_RESULT,
        AgentStep.THINKING,
        AgentStep.DONE,
    ]
