"""Typed failures of a remote A2A agent (`A2AAgent`). Called as a tool, the failure reaches the model as an
ErrorBlock of that type and the loop goes on; as a handoff target, the handoff call's error result."""

from __future__ import annotations

from typing import ClassVar

from plexus.core import KernelError

__all__ = [
    "A2AAgentError",
    "A2AInputRequiredError",
    "A2AProtocolError",
    "A2ATaskFailedError",
    "A2ATimeoutError",
]


class A2AAgentError(KernelError):
    """The remote agent could not be reached or went away (``agent`` is its URL). Retrying may help."""

    fields: ClassVar[tuple[str, ...]] = ("message", "agent")
    recoverable = True

    def __init__(self, message: str, agent: str = "") -> None:
        super().__init__(message)
        self.agent = agent


class A2AProtocolError(A2AAgentError):
    """The remote answered something that is not A2A, or refused a request with a JSON-RPC error."""


class A2ATimeoutError(A2AAgentError):
    """The remote task did not end within ``A2AAgent(..., timeout_s=...)`` (it is cancelled)."""


class A2ATaskFailedError(KernelError):
    """The remote task ended without an answer: ``state`` is its A2A state (failed, rejected, canceled,
    auth-required), ``message`` what the remote said."""

    fields: ClassVar[tuple[str, ...]] = ("message", "agent", "task_id", "state")
    recoverable = False

    def __init__(self, message: str, agent: str = "", task_id: str = "", state: str = "") -> None:
        super().__init__(message)
        self.agent = agent
        self.task_id = task_id
        self.state = state


class A2AInputRequiredError(A2ATaskFailedError):
    """The remote task waits for input (``input-required``): a tool call cannot answer it, so the task is
    left as it is and its id and question are reported."""
