"""LLMAgent inside a run: the tree budget stops a runaway loop, progress steps and live text deltas."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest

from plexus.core import (
    AgentId,
    AgentStep,
    BudgetExhaustedError,
    ExecutionBudget,
    TextBlock,
    TextDelta,
    Usage,
    stream_event_from_json,
)
from plexus.llm import LLMAgent, LlmStep, ModelRequest, ScriptedModel, ScriptedTurn, tool
from plexus.runtime import App, Context, Runtime, new_root_run
from plexus.runtime.client._cluster import ClusterSupervisor, RunControl


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
    # A turn is journaled only once its usage is counted (a replay never counts it again): the refused 4th
    # turn is not in the journal, the three counted ones and their tool steps are.
    journal = runtime.event_log(AgentId("looper.llm-journal", "b1", app.namespace))
    steps = [r.entry for r in await journal.read()]
    assert [s.item.kind.value for s in steps if isinstance(s, LlmStep)] == ["assistant", "tool"] * 3


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


#: The budget accounting of another process (set by the test): another agent of the tree, elsewhere.
ELSEWHERE: list[ClusterSupervisor] = []


@tool
async def spend(ctx: Context) -> str:
    """Meanwhile another agent of the tree, on another worker, spends the tree's tokens."""
    assert ctx.run is not None
    with contextlib.suppress(BudgetExhaustedError):
        await ELSEWHERE[0].consume(ctx.run, AgentId("other", "x"), Usage(output_tokens=500), 1)
    return "spent"


@pytest.mark.parametrize(("check_max_age", "model_calls"), [(0.0, 1), (60.0, 2)])
async def test_the_check_before_a_model_call_reads_the_tree_unless_a_verdict_of_that_age_exists(
    runtime: Runtime, start_worker: Any, check_max_age: float, model_calls: int
) -> None:
    """Between the tool step and the next model call another agent spends the tree's budget. Checking
    every time (``check_max_age=0``) stops the loop before its second model call; accepting the verdict of
    the first call's consume (60 s old at most) makes the second call, whose own consume then stops it —
    the budget is never passed by more than the calls already under way when it was spent. (No
    orchestrator runs here: it would also end the tree by broadcast as soon as it saw the spend.)"""
    ELSEWHERE[:] = [ClusterSupervisor(runtime.connection, RunControl(runtime.connection))]
    model = ScriptedModel(
        [ScriptedTurn(text="spending", tool_calls=[("c1", "spend", {})]), ScriptedTurn(text="done")]
    )
    app = App()
    app.register("budgeted", lambda _id: LLMAgent(model, tools=[spend], check_max_age=check_max_age))
    await start_worker(app)
    # A run with cluster-wide accounting, entered from an agent (not a run's start: nothing to report).
    run = msgspec.structs.replace(new_root_run(budget=ExecutionBudget(max_tokens=100)), orchestrated=True)
    with pytest.raises(BudgetExhaustedError) as info:
        await runtime.send_message(
            [TextBlock(text="go")], AgentId("budgeted", "b"), timeout=20, run=run, sender=AgentId("t", "t")
        )
    assert info.value.dimension == "tokens"
    assert len(model.requests) == model_calls


def test_check_max_age_is_never_negative() -> None:
    with pytest.raises(ValueError, match="check_max_age"):
        LLMAgent(ScriptedModel([]), check_max_age=-1)
