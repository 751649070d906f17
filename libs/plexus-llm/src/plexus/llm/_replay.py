"""LLMAgent's part in an offline replay (`plexus.runtime.timetravel`), registered when plexus.llm is imported.

The replayed loop reads its model turns back from the recorded journal, exactly as a crash-retried handler
does, so no model is called and each turn is the recorded one; its tool steps run again and are compared
with the recorded ones. A model turn the recording does not hold (the new code asks for one more) is
refused by `ReplayModel`, which stands in for the agent's model client during a replay: no network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from plexus.core import FinishReason, FinishReasonKind
from plexus.runtime import Agent
from plexus.runtime.kernel import ReplayDivergedError, register_replay_hook

from ._agent import LLMAgent
from ._client import ModelRequest
from ._events import FinishEvent, ModelEvent
from ._journal import _JOURNAL_SUFFIX

__all__ = ["JournalReplay", "ReplayModel"]


class ReplayModel:
    """A model client that answers nothing: every turn of a replay comes from the journal."""

    def __init__(self, model: str) -> None:
        self.model = model

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if request.items or not request.items:  # always: an async generator must contain a yield
            raise ReplayDivergedError(
                f"a model turn the recording does not hold was asked for (after {len(request.items)} items)"
            )
        yield FinishEvent(FinishReason(kind=FinishReasonKind.ERROR))


class JournalReplay:
    """The `ReplayHook` of the journal (``<type>.llm-journal``)."""

    log_suffix = _JOURNAL_SUFFIX
    #: Written by a model call (and its provider retries), which a replay takes from the journal instead.
    own_entry_types = frozenset({"llm.call", "llm.retry"})

    def shown(self, entry: dict[str, Any]) -> bool:
        # Model turns carry their finish reason; tool steps do not and are run again.
        return entry.get("type") == "llm.step" and entry.get("finish_reason") is not None

    def prepare(self, agent: Agent) -> None:
        if isinstance(agent, LLMAgent):
            agent.model = ReplayModel(agent.model.model)


register_replay_hook(JournalReplay())
