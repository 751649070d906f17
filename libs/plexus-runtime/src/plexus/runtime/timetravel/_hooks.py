"""How a library above the runtime takes part in a replay without the runtime importing it.

plexus.llm registers a `ReplayHook` for its journal when it is imported (an app using `LLMAgent` imports
it): which entries of its sibling log the replayed handler reads back (the model turns, so no model is
called), which own-log entries it does not write again, and how to prepare an agent (a model client that
refuses any call the recording does not answer).
"""

from __future__ import annotations

from typing import Any, Protocol

from plexus.runtime._agent import Agent

__all__ = ["ReplayHook", "register_replay_hook", "replay_hooks"]


class ReplayHook(Protocol):
    #: The sibling log it owns (``<type><suffix>/<key>``), e.g. ``".llm-journal"``.
    log_suffix: str
    #: Types of the agent's own EventLog entries the replayed handler does not write again.
    own_entry_types: frozenset[str]

    def shown(self, entry: dict[str, Any]) -> bool:
        """Whether a recorded entry of the sibling log is read back by the replayed handler (else the handler
        is expected to append it again, and what it appends is compared with it)."""
        ...

    def prepare(self, agent: Agent) -> None:
        """Make ``agent`` fit for an offline replay (e.g. replace what would reach the network)."""
        ...


_HOOKS: dict[str, ReplayHook] = {}


def register_replay_hook(hook: ReplayHook) -> None:
    """Register (or replace) the hook of ``hook.log_suffix``."""
    _HOOKS[hook.log_suffix] = hook


def replay_hooks() -> list[ReplayHook]:
    return list(_HOOKS.values())
