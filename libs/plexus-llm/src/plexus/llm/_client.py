"""The `ModelClient` protocol (streaming-first), its request type, and the non-streaming call as a fold."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from plexus.core import Item, ItemKind, JsonValue, TextBlock, ToolResultBlock

from ._accumulate import ModelTurn, TurnAccumulator
from ._events import ModelEvent
from ._output import OutputSpec
from ._settings import ModelSettings

__all__ = ["ModelClient", "ModelRequest", "ToolSpec", "complete"]

#: A request's settings when none are given: one shared (frozen) value.
_NO_SETTINGS = ModelSettings()


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about a tool: its name, description and JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, JsonValue]


@dataclass(frozen=True)
class ModelRequest:
    """One model call: the transcript, the tools on offer and the sampling settings (``settings``' values
    win over ``max_tokens`` and ``temperature``)."""

    items: Sequence[Item]
    tools: Sequence[ToolSpec] = ()
    max_tokens: int = 1024
    temperature: float | None = None
    #: Provider-specific request fields merged last (e.g. ``{"thinking": {...}}`` for Anthropic).
    extra: dict[str, JsonValue] = field(default_factory=dict)
    settings: ModelSettings = _NO_SETTINGS
    #: The typed answer asked for (`LLMAgent(output_type=...)`); each adapter asks its provider its own way.
    output: OutputSpec | None = None

    def with_settings(self, settings: ModelSettings) -> ModelRequest:
        """This request with ``settings``' set values winning over its own (a model middleware's override)."""
        return replace(self, settings=self.settings.merged(settings))

    def last_user_text(self) -> str:
        """The text of the last user item ('' when there is none): what the current message asked."""
        for item in reversed(self.items):
            if item.kind is ItemKind.USER:
                return item.text
        return ""

    def last_tool_results(self) -> list[ToolResultBlock]:
        """The results answering the model's last turn, in call order ([] when that turn called no tool).

        The loop puts every result of a turn in one ``tool`` item (``Item.text`` is ``''``: a result's
        output is in its ``content`` blocks)."""
        results: list[ToolResultBlock] = []
        for item in reversed(self.items):
            if item.kind is not ItemKind.TOOL:
                break
            results[:0] = [b for b in item.blocks if isinstance(b, ToolResultBlock)]
        return results

    def last_tool_texts(self) -> dict[str, str]:
        """`last_tool_results` as text by call id: each result's text blocks joined with newlines (a tool
        returning a str gives one text block; a dict gives a data block, not counted here)."""
        return {
            r.call_id: "\n".join(b.text for b in r.content if isinstance(b, TextBlock))
            for r in self.last_tool_results()
        }


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
