"""Who decided a pending tool call: the `ApprovalDecided` entry an LLM agent records with the decision.

The decision message names its decider (``decided_by``: `approve` / `deny`'s argument, else the deciding
connection's identity, or the gateway's token name); the agent writes it into its own EventLog, committed
with the message that took the decision, where the transcript view reads it (docs/llm.md, Approvals).
"""

from __future__ import annotations

from typing import Any, Literal

from plexus.core import KernelMessage, register_message_type
from plexus.runtime import Context

__all__ = ["ApprovalDecided", "record_decision"]


@register_message_type
class ApprovalDecided(KernelMessage):
    """One decision taken on a pending tool call, and who took it (None: the decider did not say)."""

    type: Literal["llm.approval"] = "llm.approval"
    call_id: str
    approved: bool
    reason: str = ""
    decided_by: str | None = None
    suspension: str | None = None


def record_decision(ctx: Context, decision: dict[str, Any]) -> None:
    """Record ``decision`` (as `approval_of` reads it) in the agent's log with the handled message."""
    ctx.record(
        ApprovalDecided(
            call_id=decision["call_id"],
            approved=decision["approved"],
            reason=decision["reason"],
            decided_by=decision.get("decided_by"),
            suspension=decision.get("suspension"),
        )
    )
