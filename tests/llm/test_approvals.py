"""Durable approvals: a needs_approval tool suspends the loop (a plain send raises `ApprovalRequired`); the
decision comes from another process after the worker that suspended it has stopped, is durable before any
worker runs, and the loop resumes on the new owner. One API (`approve` / `deny`) for agents and runs:
it returns once the decision is durable, and with ``wait=True`` the outcome."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from plexus.core import (
    AgentId,
    AgentNotFoundError,
    ErrorBlock,
    KernelError,
    RunMessageReceived,
    TextBlock,
    ToolResultBlock,
)
from plexus.llm import (
    FINISH_KEY,
    ApprovalPendingError,
    ApprovalRequired,
    LLMAgent,
    ModelRequest,
    NoPendingApprovalError,
    ScriptedModel,
    ScriptedTurn,
    approve,
    deny,
    tool,
)
from plexus.runtime import App, NatsServer, Runtime
from plexus.runtime.orchestration import RunStateError, RunStatus
from tests.runtime.conftest import REPO
from tests.security.seeds import identity_env

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
            ScriptedTurn(text="you're welcome"),
        ]
    )


def _texts(reply: list[Any]) -> list[str]:
    return [b.text for b in reply if isinstance(b, TextBlock)]


async def test_a_plain_send_raises_approval_required_and_the_decision_is_durable_before_any_worker_runs(
    runtime: Runtime, start_worker: Any
) -> None:
    SENT.clear()
    model = _script()
    agent = AgentId("payer", "alice")
    first = await start_worker(_app(model))
    with pytest.raises(ApprovalRequired) as required:
        await runtime.send_message([TextBlock(text="pay 5")], agent, timeout=20)
    assert required.value.agent_id == str(agent)
    assert required.value.call_ids == ["c1"]
    (call,) = required.value.calls
    assert {k: call[k] for k in ("call_id", "tool_name", "arguments")} == {
        "call_id": "c1",
        "tool_name": "transfer",
        "arguments": {"amount": 5},
    }
    assert isinstance(call["suspension"], str)
    assert call["suspension"]
    assert KernelError.from_wire(required.value.to_wire()) == required.value
    assert len(model.requests) == 1
    assert SENT == []  # nothing ran, not even the ungated balance call of the same turn
    with pytest.raises(ApprovalPendingError):
        await runtime.send_message([TextBlock(text="hello?")], agent, timeout=20)

    await first.stop(drain_timeout=5)  # the suspended loop lives only in the checkpointed state now
    # No worker hosts the agent: approve returns once the decision is stored, not when it is handled.
    await approve(runtime, agent, "c1", timeout=30)
    # A repeated call (say, its answer was lost) stores nothing more.
    await approve(runtime, agent, "c1", timeout=30)
    assert SENT == []
    await start_worker(_app(model))
    # The next message queues behind the decision: its answer comes after the resumed loop's.
    reply = await runtime.send_message([TextBlock(text="thanks")], agent, timeout=30)
    assert _texts(reply) == ["you're welcome"]
    assert SENT == [5]
    results = _results(model.requests[1])
    assert results["c1"].content == [TextBlock(text="sent 5")]
    assert results["c2"].content == [TextBlock(text="100")]
    assert len(model.requests) == 3
    with pytest.raises(NoPendingApprovalError):
        await approve(runtime, agent, "c1", wait=True, timeout=20)


async def test_approve_with_wait_returns_the_resumed_loops_answer(
    runtime: Runtime, start_worker: Any
) -> None:
    SENT.clear()
    model = _script()
    agent = AgentId("payer", "erin")
    await start_worker(_app(model))
    with pytest.raises(ApprovalRequired):
        await runtime.send_message([TextBlock(text="pay 5")], agent, timeout=20)
    reply = await approve(runtime, agent, "c1", wait=True, timeout=30)
    assert _texts(reply) == ["done"]
    assert {b.metadata[FINISH_KEY] for b in reply} == {"completed"}
    assert SENT == [5]


async def test_denied_call_is_an_error_the_model_sees(runtime: Runtime, start_worker: Any) -> None:
    SENT.clear()
    model = _script()
    agent = AgentId("payer", "bob")
    await start_worker(_app(model))
    with pytest.raises(ApprovalRequired):
        await runtime.send_message([TextBlock(text="pay 5")], agent, timeout=20)
    reply = await deny(runtime, agent, "c1", reason="too much", wait=True, timeout=20)
    assert _texts(reply) == ["done"]
    assert SENT == []
    (error,) = _results(model.requests[1])["c1"].content
    assert isinstance(error, ErrorBlock)
    assert error.error_type == "ApprovalDenied"
    assert "too much" in error.message


async def _started(runtime: Runtime, agent: AgentId) -> str:
    async with asyncio.timeout(20):
        while True:
            try:
                return await runtime.start_run(agent, [TextBlock(text="pay 5")])
            except KernelError as exc:  # the replica's service takes a moment to answer
                if exc.error_type != "ServiceUnavailableError":
                    raise
                await asyncio.sleep(0.1)


async def test_an_orchestrated_run_awaits_approval_as_its_status_and_resumes_on_approve(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    """Issue 10 item 6: the suspension is the run's status (`get_run`), and `Runtime.approve` resumes the
    same run from any process; a decision on anything the run does not wait for is a typed error."""
    SENT.clear()
    model = _script()
    agent = AgentId("payer", "carol")
    await start_worker(_app(model))
    run_id = await _started(runtime, agent)
    record = await runtime.wait_run(run_id, timeout=20, until={RunStatus.AWAITING_APPROVAL})
    assert record.awaiting == ["c1"]
    assert (await runtime.get_run(run_id)).status == RunStatus.AWAITING_APPROVAL
    assert SENT == []
    with pytest.raises(RunStateError):
        await runtime.approve(run_id, "c9")  # not a call it waits for

    resumed = await runtime.approve(run_id, "c1")
    assert resumed.status == RunStatus.RUNNING
    assert resumed.awaiting == []
    reply = await runtime.run_result(run_id, timeout=20)
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["done"]
    assert SENT == [5]
    assert (await runtime.get_run(run_id)).status == RunStatus.COMPLETED
    with pytest.raises(RunStateError):
        await runtime.approve(run_id, "c1")  # decided once; the run has ended


async def test_an_orchestrated_denial_reaches_the_model_and_the_run_completes(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    SENT.clear()
    model = _script()
    await start_worker(_app(model))
    run_id = await _started(runtime, AgentId("payer", "dave"))
    await runtime.wait_run(run_id, timeout=20, until={RunStatus.AWAITING_APPROVAL})
    # A run id: the same API.
    reply = await deny(runtime, run_id, "c1", reason="not today", wait=True, timeout=20)
    assert _texts(reply) == ["done"]
    assert (await runtime.get_run(run_id)).status == RunStatus.COMPLETED
    assert SENT == []
    (error,) = _results(model.requests[1])["c1"].content
    assert isinstance(error, ErrorBlock)
    assert "not today" in error.message


class Payment(BaseModel):
    amount: int


PAID: list[int] = []


@tool(mode="batch", needs_approval=True)
def pay_all(calls: list[Payment]) -> list[str]:
    """Pay many at once (a person must approve each)."""
    PAID.extend(c.amount for c in calls)
    return [f"paid {c.amount}" for c in calls]


@tool(needs_approval=True)
def close_account() -> ToolResultBlock:
    """Close the account and end the conversation (a person must approve)."""
    return ToolResultBlock(call_id="", content=[TextBlock(text="closed")], terminate=True)


async def test_a_batch_tool_runs_only_the_approved_calls(runtime: Runtime, start_worker: Any) -> None:
    PAID.clear()
    calls = [("p1", "pay_all", {"amount": 5}), ("p2", "pay_all", {"amount": 7})]
    model = ScriptedModel([ScriptedTurn(tool_calls=calls), ScriptedTurn(text="done")])
    app = App()
    app.register("batcher", lambda _id: LLMAgent(model, tools=[pay_all]))
    await start_worker(app)
    agent = AgentId("batcher", "b")
    with pytest.raises(ApprovalRequired) as required:
        await runtime.send_message([TextBlock(text="pay both")], agent, timeout=20)
    assert required.value.call_ids == ["p1", "p2"]
    with pytest.raises(ApprovalRequired) as still:  # the outcome of one decision: it waits for the other
        await deny(runtime, agent, "p1", reason="no", wait=True, timeout=20)
    assert still.value.call_ids == ["p2"]
    assert [c["arguments"] for c in still.value.calls] == [{"amount": 7}]
    reply = await approve(runtime, agent, "p2", approved=True, wait=True, timeout=20)
    assert _texts(reply) == ["done"]
    assert PAID == [7]  # one invocation, with the approved call only
    results = _results(model.requests[1])
    (denied,) = results["p1"].content
    assert isinstance(denied, ErrorBlock)
    assert denied.error_type == "ApprovalDenied"
    assert results["p2"].content == [TextBlock(text="paid 7")]


async def test_an_approved_terminating_tool_ends_the_run_without_a_follow_up_call(
    runtime: Runtime, start_worker: Any
) -> None:
    model = ScriptedModel(
        [ScriptedTurn(text="closing", tool_calls=[("x1", "close_account", {})]), ScriptedTurn(text="unused")]
    )
    app = App()
    app.register("closer", lambda _id: LLMAgent(model, tools=[close_account]))
    await start_worker(app)
    agent = AgentId("closer", "c")
    with pytest.raises(ApprovalRequired):
        await runtime.send_message([TextBlock(text="close it")], agent, timeout=20)
    reply = await approve(runtime, agent, "x1", approved=True, wait=True, timeout=20)
    assert len(model.requests) == 1  # terminate: no model call after the resumed tool step
    assert [b.text for b in reply if isinstance(b, TextBlock)] == ["closing"]
    assert {b.metadata[FINISH_KEY] for b in reply} == {"terminated"}


async def test_approve_with_wait_on_a_run_gives_the_outcome_an_answer_or_the_calls_it_still_waits_for(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    PAID.clear()
    calls = [("p1", "pay_all", {"amount": 5}), ("p2", "pay_all", {"amount": 7})]
    model = ScriptedModel([ScriptedTurn(tool_calls=calls), ScriptedTurn(text="done")])
    app = App()
    app.register("batcher", lambda _id: LLMAgent(model, tools=[pay_all]))
    await start_worker(app)
    run_id = await _started(runtime, AgentId("batcher", "run"))
    await runtime.wait_run(run_id, timeout=20, until={RunStatus.AWAITING_APPROVAL})
    with pytest.raises(ApprovalRequired) as still:
        await approve(runtime, run_id, "p1", wait=True, timeout=20)
    assert still.value.call_ids == ["p2"]
    assert [c["call_id"] for c in still.value.calls] == ["p2"]
    record = await runtime.approve(run_id, "p2", wait=True, timeout=20)
    assert record.status == RunStatus.COMPLETED
    assert _texts(await runtime.run_result(run_id, timeout=20)) == ["done"]
    assert PAID == [5, 7]


_CLIENT = """
import asyncio, json, sys
from plexus.core import AgentId, KernelError, TextBlock
from plexus.runtime import Runtime

async def main() -> None:
    rt = await Runtime.connect(sys.argv[1])
    try:
        await rt.send_message([TextBlock(text="pay 5")], AgentId("payer", "remote"), timeout=60)
        got = None
    except KernelError as exc:
        got = [type(exc).__module__, type(exc).__name__, exc.field_values()]
    finally:
        await rt.close()
    print(json.dumps({"llm_imported": "plexus.llm" in sys.modules, "error": got}))

asyncio.run(main())
"""


async def test_a_client_that_never_imported_plexus_llm_gets_approval_required_with_the_calls(
    nats_server: NatsServer, start_worker: Any
) -> None:
    await start_worker(_app(_script()))
    env = {**os.environ, "PYTHONPATH": str(REPO), **identity_env(nats_server, "client")}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _CLIENT, nats_server.url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["llm_imported"] is False
    module, name, fields = result["error"]
    assert (module, name) == ("plexus.runtime.wire._orchestration", "ApprovalRequired")
    assert fields["call_ids"] == ["c1"]
    (call,) = fields["calls"]
    assert (call["call_id"], call["tool_name"], call["arguments"]) == ("c1", "transfer", {"amount": 5})
    assert isinstance(call["suspension"], str)


async def test_a_decision_for_an_agent_type_nobody_registered_is_refused_at_once(runtime: Runtime) -> None:
    with pytest.raises(AgentNotFoundError) as refused:
        await approve(runtime, AgentId("nobody", "x"), "c1")
    assert refused.value.registered is False


async def test_a_call_id_reused_by_a_later_turn_is_decided_again_within_the_duplicate_window(
    runtime: Runtime, start_worker: Any
) -> None:
    """The review's probe: two turns each call `transfer` as ``call_0`` (OpenAI-compatible servers do), both
    approved within two minutes by bare call id. The second decision is a new message, not a duplicate of
    the first (which left the agent waiting for ever)."""
    SENT.clear()
    model = ScriptedModel(
        [
            ScriptedTurn(tool_calls=[("call_0", "transfer", {"amount": 5})]),
            ScriptedTurn(text="sent 5"),
            ScriptedTurn(tool_calls=[("call_0", "transfer", {"amount": 7})]),
            ScriptedTurn(text="sent 7"),
            ScriptedTurn(text="bye"),
        ]
    )
    agent = AgentId("payer", "reuse")
    await start_worker(_app(model))
    with pytest.raises(ApprovalRequired) as first:
        await runtime.send_message([TextBlock(text="pay 5")], agent, timeout=20)
    await approve(runtime, agent, "call_0", timeout=30)
    with pytest.raises(ApprovalRequired) as second:  # queued behind the decision: the next turn's suspension
        await runtime.send_message([TextBlock(text="pay 7")], agent, timeout=30)
    await approve(runtime, agent, "call_0", timeout=30)
    reply = await runtime.send_message([TextBlock(text="thanks")], agent, timeout=30)
    assert _texts(reply) == ["bye"]
    assert SENT == [5, 7]
    assert first.value.calls[0]["suspension"] != second.value.calls[0]["suspension"]


async def test_a_decision_names_its_suspension_a_repeat_is_stored_once_and_the_first_decision_stands(
    runtime: Runtime, start_worker: Any
) -> None:
    PAID.clear()
    calls = [("call_0", "pay_all", {"amount": 5}), ("call_1", "pay_all", {"amount": 7})]
    later = [("call_0", "pay_all", {"amount": 9})]
    model = ScriptedModel(
        [
            ScriptedTurn(tool_calls=calls),
            ScriptedTurn(text="done"),
            ScriptedTurn(tool_calls=later),
            ScriptedTurn(text="done again"),
        ]
    )
    app = App()
    app.register("batcher", lambda _id: LLMAgent(model, tools=[pay_all]))
    await start_worker(app)
    agent = AgentId("batcher", "once")
    with pytest.raises(ApprovalRequired) as required:
        await runtime.send_message([TextBlock(text="pay both")], agent, timeout=20)
    first, second = required.value.calls
    await approve(runtime, agent, first, timeout=30)
    await approve(runtime, agent, first, timeout=30)  # a retry (its answer lost): one message
    # A deny after the approve of the same call and suspension is refused: the approval stands.
    with pytest.raises(NoPendingApprovalError, match="already decided") as refused:
        await deny(runtime, agent, first, reason="changed my mind", wait=True, timeout=20)
    assert refused.value.call_id == "call_0"
    reply = await approve(runtime, agent, second, wait=True, timeout=20)
    assert _texts(reply) == ["done"]
    assert PAID == [5, 7]
    log = await runtime.event_log(agent).read()
    received = [r for r in log if isinstance(r.entry, RunMessageReceived)]
    assert len(received) == 4  # pay both, call_0's approval once (not its repeat), the refused deny, call_1's

    # A later turn reuses call_0: a decision naming the ended suspension is refused, the new one's is taken.
    with pytest.raises(ApprovalRequired) as again:
        await runtime.send_message([TextBlock(text="pay 9")], agent, timeout=20)
    (new,) = again.value.calls
    assert new["suspension"] != first["suspension"]
    with pytest.raises(NoPendingApprovalError):
        await approve(runtime, agent, first, wait=True, timeout=20)
    reply = await approve(runtime, agent, new, wait=True, timeout=20)
    assert _texts(reply) == ["done again"]
    assert PAID == [5, 7, 9]


def _two_gated_turns() -> ScriptedModel:
    """Two turns each call `transfer` as ``call_0`` (OpenAI-compatible servers and scripts do)."""
    return ScriptedModel(
        [
            ScriptedTurn(tool_calls=[("call_0", "transfer", {"amount": 5})]),
            ScriptedTurn(tool_calls=[("call_0", "transfer", {"amount": 7})]),
            ScriptedTurn(text="sent both"),
        ]
    )


async def test_a_run_whose_later_turn_reuses_a_call_id_awaits_and_takes_a_decision_again(
    runtime: Runtime, start_worker: Any, orchestrator: Any
) -> None:
    """The run path's probe: the second turn's ``call_0`` is a new wait (not taken as decided by the first
    decision, which set the run ``running`` while its agent was parked), and its decision, given within the
    stream's duplicate window, is a new message (not dropped as a repeat of the first). A repeated decision
    is stored once; another decision on a decided call is refused (the first stands)."""
    SENT.clear()
    agent = AgentId("payer", "run-reuse")
    await start_worker(_app(_two_gated_turns()))
    run_id = await _started(runtime, agent)
    first = await runtime.wait_run(run_id, timeout=20, until={RunStatus.AWAITING_APPROVAL})
    assert (first.awaiting, first.decided) == (["call_0"], [])
    assert first.suspension
    second = await runtime.approve(run_id, "call_0", wait=True, timeout=20)
    assert second.status == RunStatus.AWAITING_APPROVAL  # the second turn's call_0, not "running"
    assert (second.awaiting, second.decided) == (["call_0"], [])
    assert second.suspension not in (None, first.suspension)
    assert SENT == [5]
    # A retry of the first decision that names its suspension never takes the second turn's call_0.
    with pytest.raises(RunStateError):
        await approve(runtime, run_id, {"call_id": "call_0", "suspension": first.suspension})
    assert (await runtime.get_run(run_id)).awaiting == ["call_0"]

    # The same decision twice at once (a retry racing its original): one message, the other refused or
    # answered with the record.
    outcomes = await asyncio.gather(
        runtime.approve(run_id, "call_0"), runtime.approve(run_id, "call_0"), return_exceptions=True
    )
    assert any(not isinstance(o, BaseException) for o in outcomes)
    assert all(not isinstance(o, BaseException) or isinstance(o, RunStateError) for o in outcomes)
    assert _texts(await runtime.run_result(run_id, timeout=20)) == ["sent both"]
    assert SENT == [5, 7]
    with pytest.raises(RunStateError):
        await runtime.deny(run_id, "call_0")  # decided (and the run has ended): the approval stands
    log = await runtime.event_log(agent).read()
    assert len([r for r in log if isinstance(r.entry, RunMessageReceived)]) == 3  # the input, 2 decisions
