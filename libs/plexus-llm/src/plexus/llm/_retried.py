"""A provider retry inside a turn: the `ProviderRetried` entry `ProviderRetry` records before it waits.

Written into the agent's own EventLog with the handled message (only when a call failed and is retried:
a turn without a retry records nothing), where the transcript view shows each turn's failed attempts. A
replay takes model turns from the journal and so never retries: the entries are the model call's, not
compared (`JournalReplay.own_entry_types`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from plexus.core import KernelError, KernelMessage, register_message_type

__all__ = ["ProviderRetried", "retried"]


@register_message_type
class ProviderRetried(KernelMessage):
    """Attempt ``attempt`` (1-based) of a model call failed with ``error_type``; retried after ``wait_s``."""

    type: Literal["llm.retry"] = "llm.retry"
    attempt: int = Field(ge=1)
    error_type: str
    message: str = ""
    wait_s: float = Field(ge=0)


def retried(attempt: int, exc: KernelError, wait_s: float) -> ProviderRetried:
    return ProviderRetried(attempt=attempt, error_type=exc.error_type, message=str(exc)[:500], wait_s=wait_s)
