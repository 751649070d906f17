"""Durable approvals: a tool marked ``needs_approval`` suspends the loop until someone decides.

The loop stops before running the tools of a turn that calls such a tool: the transcript (with the calls
unanswered) and the pending call ids go into the agent's state, which the runtime checkpoints, so the pending
approval survives worker restarts and moves with the agent. A progress step ``paused`` announces it; the
handler calls `Context.await_approval`, so a plain `Runtime.send_message` raises `ApprovalRequired` (the
pending calls) instead of returning, and an orchestrated run gets the status ``awaiting_approval``.

`approve` / `deny` here are the one way to decide, for an agent or a run alike: they return once the
decision is durable (stored in the agent's inbox stream; for a run, also checked and recorded by the
orchestrator), and with ``wait=True`` once its outcome is known (the agent's answer, or `ApprovalRequired`
again). The handler of the decision, on whichever worker owns the agent then, runs the approved calls,
answers denied ones with an ErrorBlock the model sees, and resumes the loop. The decision message format
(`plexus.runtime.orchestration.approval_blocks`) is the runtime's; a decision from here also names the
suspension it is for.

Call ids are not unique over an agent's life (providers reuse ``call_0``), so each suspension has its own id
(``suspension`` in the pending state and in each entry of `ApprovalRequired.calls`, derived from the message
whose handling suspended). A decision that names it is stored under an id of (agent, suspension, call,
verdict): a repeat is stored once, a later suspension's decision on the same call id is a new message, and
one for a suspension that has ended is refused. The first decision on a call stands: another one (a deny
after an approve) is refused with `NoPendingApprovalError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, overload

from plexus.core import AgentId, BaseBlock, DataBlock, KernelError, MessageId
from plexus.runtime import Runtime
from plexus.runtime.kernel import blocks_from_payload
from plexus.runtime.orchestration import (
    APPROVAL_KEY,
    ApprovalRequired,
    RunStatus,
    approval_blocks,
    decision_message_id,
)

__all__ = [
    "APPROVAL_KEY",
    "PENDING_KEY",
    "ApprovalPendingError",
    "ApprovalRequired",
    "NoPendingApprovalError",
    "approval_blocks",
    "approval_of",
    "approve",
    "deny",
]

#: Agent state key of the pending approval: {"calls": [call ids], "decisions": {call id: decision},
#: "suspension": its id} (no "suspension" in a state written before it existed: any decision matches).
PENDING_KEY = "plexus.llm.pending_approval"

#: What a decision may name: a call id, or an entry of `ApprovalRequired.calls` (its call id and suspension).
Call = str | Mapping[str, Any]


class ApprovalPendingError(KernelError):
    """The agent waits for a decision on tool calls; it takes no other message until then."""

    fields: ClassVar[tuple[str, ...]] = ("message", "call_ids")

    def __init__(self, message: str, call_ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.call_ids = list(call_ids or [])


class NoPendingApprovalError(KernelError):
    """A decision arrived for a call that is not waiting for one."""

    fields: ClassVar[tuple[str, ...]] = ("message", "call_id")

    def __init__(self, message: str, call_id: str = "") -> None:
        super().__init__(message)
        self.call_id = call_id


def suspension_id(message_id: str, items: int) -> str:
    """The id of the suspension that handling `message_id` ends in, with `items` transcript items (at most one
    per handled message; the same when a crashed handler runs the message again, as the journal replays)."""
    return hashlib.sha256(f"{message_id}\n{items}".encode()).hexdigest()[:16]


def approval_of(blocks: list[BaseBlock]) -> dict[str, Any] | None:
    """The decision carried by ``blocks``, or None when they are an ordinary message."""
    if len(blocks) == 1 and isinstance(blocks[0], DataBlock):
        decision = blocks[0].data.get(APPROVAL_KEY)
        if isinstance(decision, dict) and isinstance(decision.get("call_id"), str):
            suspension = decision.get("suspension")
            decided_by = decision.get("decided_by")
            return {
                "call_id": decision["call_id"],
                "approved": decision.get("approved") is True,
                "reason": str(decision.get("reason") or ""),
                "suspension": suspension if isinstance(suspension, str) else None,
                "decided_by": decided_by if isinstance(decided_by, str) else None,
            }
    return None


def check_decision(pending: dict[str, Any], decision: dict[str, Any]) -> None:
    """Refuse a decision the pending approval cannot take: a call it does not wait for, one of another
    suspension (an earlier turn's call with the same id), or a call already decided (the first decision
    stands)."""
    call_id = decision["call_id"]
    mine = pending.get("suspension")
    if call_id not in pending["calls"] or (
        decision.get("suspension") is not None and mine is not None and decision["suspension"] != mine
    ):
        raise NoPendingApprovalError(f"call {call_id!r} awaits no approval", call_id)
    first = pending["decisions"].get(call_id)
    if first is not None:
        verdict = "approved" if first["approved"] else "denied"
        raise NoPendingApprovalError(f"call {call_id!r} is already decided ({verdict})", call_id)


def _decision(call: Call) -> tuple[str, str | None]:
    if isinstance(call, str):
        return call, None
    if isinstance(call, Mapping) and isinstance(call.get("call_id"), str):
        suspension = call.get("suspension")
        return call["call_id"], suspension if isinstance(suspension, str) else None
    raise TypeError(f"call must be a call id or an entry of ApprovalRequired.calls, got {call!r}")


@overload
async def approve(
    rt: Runtime,
    target: AgentId | str,
    call: Call,
    *,
    approved: bool = True,
    reason: str = "",
    wait: Literal[False] = False,
    timeout: float = 300.0,
    decided_by: str | None = None,
) -> None: ...


@overload
async def approve(
    rt: Runtime,
    target: AgentId | str,
    call: Call,
    *,
    approved: bool = True,
    reason: str = "",
    wait: Literal[True],
    timeout: float = 300.0,
    decided_by: str | None = None,
) -> list[BaseBlock]: ...


async def approve(
    rt: Runtime,
    target: AgentId | str,
    call: Call,
    *,
    approved: bool = True,
    reason: str = "",
    wait: bool = False,
    timeout: float = 300.0,
    decided_by: str | None = None,
) -> list[BaseBlock] | None:
    """Decide one pending tool call of `target` (an agent awaiting approval after a plain send, or the id of
    an orchestrated run) from any process. `call` is an entry of `ApprovalRequired.calls` (it names the
    suspension too) or a bare call id.

    Returns once the decision is durable: stored in the agent's inbox stream, handled once by whichever
    worker owns the agent then (also one that starts later); for a run the orchestrator first checks that the
    run waits for the call (RunStateError if not) and records it. With ``wait=True`` returns the agent's
    answer once the loop has resumed and finished (a run's result), or raises `ApprovalRequired` when it
    waits for decisions again (other calls of the turn, or a later turn's), or the typed error it failed
    with; for an agent, a call it does not wait for (or of a suspension that has ended, or already decided:
    the first decision stands) is `NoPendingApprovalError` (without ``wait`` the worker logs it). A repeat of
    a decision that names its suspension is stored once; a bare call id's is stored each time (the agent
    refuses the second). ``decided_by`` (default: `rt.identity`, the connection's NATS user) is recorded
    by the agent with the decision (an ``llm.approval`` entry of its log: the transcript shows it)."""
    call_id, suspension = _decision(call)
    by = decided_by if decided_by is not None else rt.identity
    if isinstance(target, AgentId):
        blocks = approval_blocks(call_id, approved, reason, suspension, by)
        if wait:
            return await rt.send_message(blocks, target, timeout=timeout)
        message_id = str(MessageId.new())
        if suspension is not None:  # stored once per decision of this suspension (`decision_message_id`)
            message_id = decision_message_id(str(target), call_id, approved, suspension)
        await rt.post_message(blocks, target, message_id=message_id, timeout=min(timeout, 30.0))
        return None
    if not isinstance(target, str) or not target:
        raise TypeError(f"target must be an AgentId or a run id, got {target!r}")
    record = await rt.approve(
        target,
        call_id,
        approved=approved,
        reason=reason,
        wait=wait,
        timeout=timeout,
        suspension=suspension,
        decided_by=by,
    )
    if not wait:
        return None
    if record.status == RunStatus.AWAITING_APPROVAL:
        output = blocks_from_payload(record.output) if record.output is not None else []
        raise ApprovalRequired.of_reply(record.agent_id, list(record.awaiting), output)
    return await rt.run_result(target, timeout=timeout)


@overload
async def deny(
    rt: Runtime,
    target: AgentId | str,
    call: Call,
    *,
    reason: str = "",
    wait: Literal[False] = False,
    timeout: float = 300.0,
    decided_by: str | None = None,
) -> None: ...


@overload
async def deny(
    rt: Runtime,
    target: AgentId | str,
    call: Call,
    *,
    reason: str = "",
    wait: Literal[True],
    timeout: float = 300.0,
    decided_by: str | None = None,
) -> list[BaseBlock]: ...


async def deny(
    rt: Runtime,
    target: AgentId | str,
    call: Call,
    *,
    reason: str = "",
    wait: bool = False,
    timeout: float = 300.0,
    decided_by: str | None = None,
) -> list[BaseBlock] | None:
    """`approve` with ``approved=False``: the model sees an ``ApprovalDenied`` error result with `reason`."""
    if wait:
        return await approve(
            rt, target, call, approved=False, reason=reason, wait=True, timeout=timeout, decided_by=decided_by
        )
    await approve(rt, target, call, approved=False, reason=reason, timeout=timeout, decided_by=decided_by)
    return None
