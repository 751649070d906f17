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
(`plexus.runtime.orchestration.approval_blocks`) is the runtime's.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Literal, overload

from plexus.core import AgentId, BaseBlock, DataBlock, KernelError
from plexus.runtime import Runtime, blocks_from_payload
from plexus.runtime.orchestration import APPROVAL_KEY, ApprovalRequired, RunStatus, approval_blocks

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

#: Agent state key of the pending approval: {"calls": [call ids], "decisions": {call id: decision}}.
PENDING_KEY = "plexus.llm.pending_approval"


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


def approval_of(blocks: list[BaseBlock]) -> dict[str, Any] | None:
    """The decision carried by ``blocks``, or None when they are an ordinary message."""
    if len(blocks) == 1 and isinstance(blocks[0], DataBlock):
        decision = blocks[0].data.get(APPROVAL_KEY)
        if isinstance(decision, dict) and isinstance(decision.get("call_id"), str):
            return {
                "call_id": decision["call_id"],
                "approved": decision.get("approved") is True,
                "reason": str(decision.get("reason") or ""),
            }
    return None


@overload
async def approve(
    rt: Runtime,
    target: AgentId | str,
    call_id: str,
    *,
    approved: bool = True,
    reason: str = "",
    wait: Literal[False] = False,
    timeout: float = 300.0,
) -> None: ...


@overload
async def approve(
    rt: Runtime,
    target: AgentId | str,
    call_id: str,
    *,
    approved: bool = True,
    reason: str = "",
    wait: Literal[True],
    timeout: float = 300.0,
) -> list[BaseBlock]: ...


async def approve(
    rt: Runtime,
    target: AgentId | str,
    call_id: str,
    *,
    approved: bool = True,
    reason: str = "",
    wait: bool = False,
    timeout: float = 300.0,
) -> list[BaseBlock] | None:
    """Decide one pending tool call of `target` (an agent awaiting approval after a plain send, or the id of
    an orchestrated run) from any process.

    Returns once the decision is durable: stored in the agent's inbox stream, handled once by whichever
    worker owns the agent then (also one that starts later); for a run the orchestrator first checks that the
    run waits for `call_id` (RunStateError if not) and records it. With ``wait=True`` returns the agent's
    answer once the loop has resumed and finished (a run's result), or raises `ApprovalRequired` when it
    waits for decisions again (other calls of the turn, or a later turn's), or the typed error it failed
    with; for an agent a `call_id` it does not wait for is `NoPendingApprovalError` (without ``wait`` the
    worker logs it)."""
    if isinstance(target, AgentId):
        blocks = approval_blocks(call_id, approved, reason)
        if wait:
            return await rt.send_message(blocks, target, timeout=timeout)
        # Fixed per decision: a repeated call (its answer lost) stores one message (the stream's dedupe).
        digest = hashlib.sha256(f"{target}\n{call_id}".encode()).hexdigest()[:32]
        await rt.post_message(blocks, target, message_id=f"approve-{digest}", timeout=min(timeout, 30.0))
        return None
    if not isinstance(target, str) or not target:
        raise TypeError(f"target must be an AgentId or a run id, got {target!r}")
    record = await rt.approve(target, call_id, approved=approved, reason=reason, wait=wait, timeout=timeout)
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
    call_id: str,
    *,
    reason: str = "",
    wait: Literal[False] = False,
    timeout: float = 300.0,
) -> None: ...


@overload
async def deny(
    rt: Runtime,
    target: AgentId | str,
    call_id: str,
    *,
    reason: str = "",
    wait: Literal[True],
    timeout: float = 300.0,
) -> list[BaseBlock]: ...


async def deny(
    rt: Runtime,
    target: AgentId | str,
    call_id: str,
    *,
    reason: str = "",
    wait: bool = False,
    timeout: float = 300.0,
) -> list[BaseBlock] | None:
    """`approve` with ``approved=False``: the model sees an ``ApprovalDenied`` error result with `reason`."""
    if wait:
        return await approve(rt, target, call_id, approved=False, reason=reason, wait=True, timeout=timeout)
    await approve(rt, target, call_id, approved=False, reason=reason, timeout=timeout)
    return None
