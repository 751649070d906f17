"""Agent types of the transcript view's tests, registered into the gateway tests' app on import: an LLM
agent with two gated turns (approvals) and one whose provider answers its first call with a 429."""

from __future__ import annotations

from collections.abc import AsyncIterator

from plexus.core import AgentId
from plexus.llm import LLMAgent, ModelEvent, ModelRequest, RateLimitError, ScriptedModel, ScriptedTurn, tool

from .apps import app

__all__ = ["FlakyModel", "app"]


@tool(needs_approval=True)
def open_gate(gate: int) -> str:
    """Open a gate (a person must approve)."""
    return f"gate {gate} open"


def _gated(_id: AgentId) -> LLMAgent:
    turns = [ScriptedTurn(tool_calls=[("call_0", "open_gate", {"gate": n})]) for n in (1, 2)]
    return LLMAgent(ScriptedModel([*turns, ScriptedTurn(text="both gates open")]), tools=[open_gate])


class FlakyModel(ScriptedModel):
    """A scripted model whose provider refuses the first call (429, retry after 50 ms)."""

    failed = False

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if not self.failed:
            self.failed = True
            raise RateLimitError("slow down", provider="fake", retry_after_s=0.05)
        async for event in super().stream(request):
            yield event


def _flaky(_id: AgentId) -> LLMAgent:
    return LLMAgent(FlakyModel([ScriptedTurn(text="Recovered.")]))


app.register("tx-gated", _gated, description="an LLM agent whose two turns each ask to open a gate (call_0)")
app.register("tx-flaky", _flaky, description="an LLM agent whose provider refuses its first call (429)")
