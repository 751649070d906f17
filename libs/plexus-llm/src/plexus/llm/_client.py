"""The `ModelClient` protocol (streaming-first), its request type, and the non-streaming call as a fold."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from plexus.core import Item, JsonValue

from ._accumulate import ModelTurn, TurnAccumulator
from ._events import ModelEvent

__all__ = ["ModelClient", "ModelRequest", "ToolSpec", "complete"]


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about a tool: its name, description and JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, JsonValue]


@dataclass(frozen=True)
class ModelRequest:
    """One model call: the transcript, the tools on offer and the sampling settings."""

    items: Sequence[Item]
    tools: Sequence[ToolSpec] = ()
    max_tokens: int = 1024
    temperature: float | None = None
    #: Provider-specific request fields merged last (e.g. ``{"thinking": {...}}`` for Anthropic).
    extra: dict[str, JsonValue] = field(default_factory=dict)


@runtime_checkable
class ModelClient(Protocol):
    """A model behind one primitive: a stream of `ModelEvent`s for a request.

    ``stream`` raises `ProviderError` subclasses for provider failures, before or during the stream.
    """

    @property
    def model(self) -> str: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...


async def complete(client: ModelClient, request: ModelRequest) -> ModelTurn:
    """The non-streaming call: the fold of ``client.stream(request)`` through a `TurnAccumulator`."""
    acc = TurnAccumulator()
    async for event in client.stream(request):
        acc.add(event)
    return acc.finish(metadata={"plexus.llm.model": client.model})
