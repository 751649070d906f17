"""Issue 37 item 4: handoffs. A triage LLMAgent hands the conversation to a specialist (a child run of the
same tree, under the same budget); the specialist's answer is the triage agent's reply; the handoff step
is journaled like a tool step, so a retried handler does not spawn the specialist again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from plexus.core import (
    AgentId,
    AgentStep,
    BaseBlock,
    DataBlock,
    ErrorBlock,
    ExecutionBudget,
    Item,
    ItemKind,
    KernelError,
    RetryPolicy,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.llm import (
    FINISH_KEY,
    HANDOFF_KEY,
    Handoff,
    HandoffInputError,
    LLMAgent,
    LlmStep,
    Middleware,
    ModelRequest,
    ProviderUnavailableError,
    ScriptedModel,
    ScriptedTurn,
    Turn,
    tool,
    without_tool_calls,
)
from plexus.runtime import Agent, App, Context, Runtime
from plexus.runtime.orchestration import RunStatus

StartWorker = Any
FAST_POLICY = RetryPolicy(max_retries=3, initial_backoff_s=0.05, max_backoff_s=0.05)
NOTES: list[str] = []


@tool
def note(text: str) -> str:
    """Write a note down."""
    NOTES.append(text)
    return "noted"


def _transfer(*calls: tuple[str, str]) -> ScriptedTurn:
    return ScriptedTurn(text="Let me transfer you.", tool_calls=[(cid, name, {}) for cid, name in calls])


def _app(triage: ScriptedModel, specialist: ScriptedModel, **triage_options: Any) -> App:
    app = App()
    billing = app.register(
        "billing",
        lambda _id: LLMAgent(specialist, system="You handle billing."),
        description="Billing: invoices and refunds.",
    )
    handoffs = triage_options.pop("handoffs", [billing])
    app.register(
        "triage",
        lambda _id: LLMAgent(
            triage, system="Route the user.", tools=[note], handoffs=handoffs, **triage_options
        ),
    )
    return app


def _texts(items: Any) -> list[tuple[str, str]]:
    return [(i.kind.value, i.text) for i in items]


async def test_a_triage_agent_hands_the_filtered_conversation_to_a_specialist_whose_answer_is_the_reply(
    runtime: Runtime, start_worker: StartWorker, orchestrator: Any
) -> None:
    triage = ScriptedModel([_transfer(("h1", "transfer_to_billing"))])
    specialist = ScriptedModel([ScriptedTurn(text="Your refund is on its way.")])
    handoff = Handoff("billing", description="Refunds.", input_filter=without_tool_calls)
    app = _app(triage, specialist, handoffs=[handoff])
    await start_worker(app)
    run_id = await runtime.start_run(
        AgentId("triage", "t1"), [TextBlock(text="I want a refund.")], budget=ExecutionBudget(max_turns=5)
    )
    reply = await runtime.run_result(run_id, timeout=30)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["Your refund is on its way."]
    assert reply[0].metadata[FINISH_KEY] == "handoff"
    target = str(reply[0].metadata[HANDOFF_KEY])
    assert target == str(AgentId("billing", "t1"))  # the conversation's key: one specialist per conversation
    assert AgentId.parse(target).type == "billing"
    # The triage agent's loop ended with the handoff: no further model call of its own.
    assert len(triage.requests) == 1
    (spec,) = [s for s in triage.requests[0].tools if s.name == "transfer_to_billing"]
    assert spec.description == "Refunds."
    assert spec.parameters["properties"] == {}
    # The specialist continued from the filtered conversation, under its own system prompt.
    (received,) = specialist.requests
    assert _texts(received.items) == [
        ("system", "You handle billing."),
        ("user", "I want a refund."),
        ("assistant", "Let me transfer you."),
    ]
    assert not any(isinstance(b, ToolUseBlock) for i in received.items for b in i.blocks)
    # One tree, one budget: both agents' turns and tokens on the root run's counters.
    record = await runtime.get_run(run_id)
    assert record.status is RunStatus.COMPLETED
    assert (record.usage.turns, record.usage.tokens) == (2, 2 * 15)
    # Who holds the conversation: a handoff progress event from the triage agent to the specialist.
    handoffs = []
    async for progress in runtime.progress(run_id):
        if progress.step is AgentStep.HANDOFF and "from" in progress.metadata:  # not the spawn's own
            handoffs.append(progress)
        if progress.step is AgentStep.DONE and progress.agent_id == str(AgentId("triage", "t1")):
            break
    (event,) = handoffs
    assert event.metadata == {"from": str(AgentId("triage", "t1")), "to": target}
    # The specialist's own progress is a child run of the triage agent's run.
    seen: dict[str, Any] = {}
    async for progress in runtime.progress(run_id):
        seen.setdefault(progress.agent_id, progress)
        if target in seen:
            break
    assert seen[target].parent_id == run_id
    # The handoff step is journaled like a tool step, holding the specialist's answer.
    journal = runtime.event_log(AgentId("triage.llm-journal", "t1"))
    steps = [r.entry for r in await journal.read() if isinstance(r.entry, LlmStep)]
    assert [(s.step, s.item.kind) for s in steps] == [(0, ItemKind.ASSISTANT), (1, ItemKind.TOOL)]
    (result,) = steps[1].item.blocks
    assert isinstance(result, ToolResultBlock)
    assert result.terminate
    assert result.content[0].text == "Your refund is on its way."  # type: ignore[attr-defined]


async def test_the_first_handoff_of_a_turn_wins_and_the_unfiltered_transcript_crosses(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """Two handoffs and a tool in one turn: the first handoff is taken, the other calls are answered with
    error results (the tool does not run); without a filter the target gets every item, those answers too."""
    NOTES.clear()
    triage = ScriptedModel(
        [
            ScriptedTurn(
                text="Routing.",
                tool_calls=[
                    ("h1", "transfer_to_billing", {}),
                    ("n1", "note", {"text": "x"}),
                    ("h2", "transfer_to_support", {}),
                ],
            )
        ]
    )
    specialist = ScriptedModel([ScriptedTurn(text="Billing here.")])
    app = _app(triage, specialist, handoffs=["billing", "support"])
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="help")], AgentId("triage", "t2"), timeout=30)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["Billing here."]
    assert NOTES == []
    (received,) = specialist.requests
    assert _texts(received.items)[:3] == [
        ("system", "You handle billing."),
        ("user", "help"),
        ("assistant", "Routing."),
    ]
    tool_item = received.items[3]
    assert tool_item.kind is ItemKind.TOOL
    moved, not_run, ignored = tool_item.blocks
    assert isinstance(moved, ToolResultBlock)
    assert moved.call_id == "h1"
    assert not moved.is_error
    assert moved.content[0].text.startswith("Transferred to billing/")  # type: ignore[attr-defined]
    for result, call_id, error_type in [(not_run, "n1", "ToolNotRun"), (ignored, "h2", "HandoffIgnored")]:
        assert isinstance(result, ToolResultBlock)
        assert result.call_id == call_id
        assert result.is_error
        assert isinstance(result.content[0], ErrorBlock)
        assert result.content[0].error_type == error_type


@tool(needs_approval=True)
def refund(amount: int) -> str:
    """Refund an amount (needs approval)."""
    NOTES.append(f"refund {amount}")
    return "refunded"


async def test_a_handoff_takes_a_turn_that_also_calls_an_approval_gated_tool(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    """The handoff wins: the gated call is answered as not run and nothing waits for a decision."""
    NOTES.clear()
    triage = ScriptedModel(
        [
            ScriptedTurn(
                text="Routing.",
                tool_calls=[("r1", "refund", {"amount": 5}), ("h1", "transfer_to_billing", {})],
            )
        ]
    )
    specialist = ScriptedModel([ScriptedTurn(text="Billing here.")])
    app = App()
    app.register("billing", lambda _id: LLMAgent(specialist))
    app.register("triage", lambda _id: LLMAgent(triage, tools=[refund], handoffs=["billing"]))
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="refund")], AgentId("triage", "t5"), timeout=30)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["Billing here."]
    assert reply[0].metadata[FINISH_KEY] == "handoff"
    assert NOTES == []
    (received,) = specialist.requests
    not_run = received.items[-1].blocks[0]
    assert isinstance(not_run, ToolResultBlock)
    assert not_run.call_id == "r1"
    assert isinstance(not_run.content[0], ErrorBlock)
    assert not_run.content[0].error_type == "ToolNotRun"


async def test_a_handoff_to_an_unregistered_type_is_an_error_result_naming_the_known_types(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    def after_error(request: ModelRequest) -> ScriptedTurn:
        return ScriptedTurn(text="I will answer myself.")

    triage = ScriptedModel([_transfer(("h1", "transfer_to_bliling")), after_error])
    specialist = ScriptedModel([])
    app = _app(triage, specialist, handoffs=["bliling"])
    await start_worker(app)
    reply = await runtime.send_message([TextBlock(text="refund?")], AgentId("triage", "t3"), timeout=30)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["I will answer myself."]
    assert reply[0].metadata[FINISH_KEY] == "completed"
    (result,) = [b for b in triage.requests[1].items[-1].blocks if isinstance(b, ToolResultBlock)]
    assert result.is_error
    error = result.content[0]
    assert isinstance(error, ErrorBlock)
    assert error.error_type == "AgentNotFoundError"
    assert "billing" in error.details["known_types"]  # type: ignore[operator]
    assert error.details["suggestion"] == "billing"
    assert specialist.requests == []


class _FailOnceAfterTheHandoff(Middleware):
    """The handler fails once right after the handoff step (as a crash would, after the target answered)."""

    def __init__(self) -> None:
        self.failed = False

    async def process_turn(self, context: Turn, call_next: Callable[[Turn], Awaitable[None]]) -> None:
        await call_next(context)
        if not self.failed:
            self.failed = True  # the handoff step's append is in flight: the retry waits for it first
            raise ProviderUnavailableError("the worker went away", "test", 503)


async def test_a_retried_handler_replays_the_handoff_from_the_journal_and_spawns_no_second_specialist(
    runtime: Runtime, start_worker: StartWorker, orchestrator: Any
) -> None:
    triage = ScriptedModel([_transfer(("h1", "transfer_to_billing"))])
    specialist = ScriptedModel([ScriptedTurn(text="Refunded.")])
    app = _app(triage, specialist, middleware=[_FailOnceAfterTheHandoff()])
    await start_worker(app)
    run_id = await runtime.start_run(AgentId("triage", "t4"), [TextBlock(text="refund")], retry=FAST_POLICY)
    reply = await runtime.run_result(run_id, timeout=30)

    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["Refunded."]
    record = await runtime.get_run(run_id)
    assert (record.status, record.attempts) == (RunStatus.COMPLETED, 2)
    assert len(triage.requests) == 1  # the turn came from the journal
    assert len(specialist.requests) == 1  # and so did the specialist's answer: no second child


def test_handoffs_are_checked_when_the_agent_is_built() -> None:
    model = ScriptedModel([])
    with pytest.raises(ValueError, match="transfer_to_billing"):
        LLMAgent(model, handoffs=["billing", AgentId("billing", "x")])
    with pytest.raises(ValueError, match="note"):
        LLMAgent(model, tools=[note], handoffs=[Handoff("billing", tool_name="note")])
    with pytest.raises(TypeError, match="handoffs takes"):
        LLMAgent(model, handoffs=[42])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        Handoff("bad/type")
    agent = LLMAgent(model, handoffs=["billing.eu"])
    assert agent.handoffs is not None
    assert [s.name for s in agent.handoffs.specs] == ["transfer_to_billing_eu"]


async def test_a_malformed_handoff_message_is_a_typed_error(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    app = App()
    app.register("billing", lambda _id: LLMAgent(ScriptedModel([])))
    await start_worker(app)
    bad = DataBlock(data={HANDOFF_KEY: {"from": "x", "items": [{"kind": "nonsense"}]}})
    with pytest.raises(HandoffInputError):
        await runtime.send_message([bad], AgentId("billing", "b1"), timeout=20)


def test_without_tool_calls_keeps_the_words() -> None:
    items = [
        Item(kind=ItemKind.USER, blocks=[TextBlock(text="hi")]),
        Item(
            kind=ItemKind.ASSISTANT,
            blocks=[TextBlock(text="moving"), ToolUseBlock(call_id="c", tool_name="t", arguments={})],
        ),
        Item(kind=ItemKind.TOOL, blocks=[ToolResultBlock(call_id="c", content=[TextBlock(text="ok")])]),
        Item(kind=ItemKind.ASSISTANT, blocks=[ToolUseBlock(call_id="d", tool_name="t", arguments={})]),
    ]
    assert _texts(without_tool_calls(items)) == [("user", "hi"), ("assistant", "moving")]


class _Lost(Agent):
    """A target that runs and fails on a send of its own to a type nobody registered."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return await ctx.send([TextBlock(text="?")], AgentId("nowhere", "x"), timeout=5)


async def test_a_targets_own_agent_not_found_fails_the_message_and_is_not_a_missing_target(
    runtime: Runtime, start_worker: StartWorker
) -> None:
    triage = ScriptedModel([_transfer(("h1", "transfer_to_lost")), ScriptedTurn(text="unreachable")])
    app = App()
    app.register("lost", lambda _id: _Lost())
    app.register("triage", lambda _id: LLMAgent(triage, handoffs=["lost"]))
    await start_worker(app)
    with pytest.raises(KernelError) as info:
        await runtime.send_message([TextBlock(text="hi")], AgentId("triage", "t9"), timeout=30)
    assert "nowhere/x" in str(info.value)
    assert len(triage.requests) == 1  # not fed back to the model as "no such target"
