"""Durable approvals: a tool marked ``needs_approval`` suspends the loop until someone decides.

The loop stops before running the tools of a turn that calls such a tool: the transcript (with the calls
unanswered) and the pending call ids go into the agent's state, which the runtime checkpoints, so the pending
approval survives worker restarts and moves with the agent. A progress step ``paused`` announces it and the
reply says ``awaiting_approval``; the handler also calls `Context.await_approval`, so an orchestrated run
gets the run status ``awaiting_approval`` (with the call ids) instead of ``completed``. Any process decides:
`Runtime.approve(run_id, call_id)` / `Runtime.deny` for an orchestrated run (the orchestrator delivers the
decision inside the run), or `approve` here (a message to the agent, through `Runtime.send_message`). The
handler of that message, on whichever worker owns the agent then, runs the approved calls, answers denied
ones with an ErrorBlock the model sees, and resumes the loop. The decision message format
(`plexus.runtime.orchestration.approval_blocks`) is the runtime's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from plexus.core import AgentId, BaseBlock, DataBlock, KernelError
from plexus.runtime import Runtime
from plexus.runtime.orchestration import APPROVAL_KEY, approval_blocks

__all__ = [
    "APPROVAL_KEY",
    "PENDING_KEY",
    "ApprovalPendingError",
    "NoPendingApprovalError",
    "approval_blocks",
    "approval_of",
    "approve",
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


async def approve(
    rt: Runtime,
    agent_id: AgentId,
    call_id: str,
    *,
    approved: bool = True,
    reason: str = "",
    timeout: float = 300.0,
) -> list[BaseBlock]:
    """Approve (or deny) a pending call from any process; returns the agent's reply to the resumed loop."""
    return await rt.send_message(approval_blocks(call_id, approved, reason), agent_id, timeout=timeout)
