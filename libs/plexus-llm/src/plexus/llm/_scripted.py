"""`ScriptedModel`: a deterministic `ModelClient` without HTTP, for unit tests and the offline demo."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from plexus.core import FinishReason, JsonValue, Usage

from ._client import ModelRequest
from ._events import FinishEvent, ModelEvent, TextDeltaEvent, ToolCallDeltaEvent, UsageEvent

__all__ = ["ScriptedModel", "ScriptedTurn"]


@dataclass(frozen=True)
class ScriptedTurn:
    """One scripted answer: text (streamed word by word), tool calls, usage and the finish reason."""

    text: str = ""
    tool_calls: Sequence[tuple[str, str, Mapping[str, JsonValue]]] = ()  # (call_id, name, arguments)
    usage: Usage = field(default_factory=lambda: Usage(input_tokens=10, output_tokens=5))
    finish: FinishReason | None = None

    def events(self) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        words = self.text.split(" ")
        for i, word in enumerate(words):
            if word or i:
                out.append(TextDeltaEvent(text=word if i == 0 else " " + word))
        for index, (call_id, name, arguments) in enumerate(self.tool_calls):
            out.append(ToolCallDeltaEvent(index=index, call_id=call_id, name=name))
            out.append(ToolCallDeltaEvent(index=index, arguments=json.dumps(dict(arguments))))
        out.append(UsageEvent(self.usage))
        finish = self.finish
        if finish is None:
            finish = FinishReason.tool_call() if self.tool_calls else FinishReason.completed()
        out.append(FinishEvent(finish))
        return out


class ScriptedModel:
    """Answers call N with ``script[N]`` (a `ScriptedTurn`, a list of events, or a function of the request).

    ``requests`` records every request; running past the end of the script raises IndexError.
    """

    def __init__(
        self,
        script: Sequence[ScriptedTurn | Sequence[ModelEvent] | Callable[[ModelRequest], ScriptedTurn]],
        *,
        model: str = "scripted",
    ) -> None:
        self._script = list(script)
        self._model = model
        self.requests: list[ModelRequest] = []

    @property
    def model(self) -> str:
        return self._model

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        n = len(self.requests)
        self.requests.append(request)
        if n >= len(self._script):
            raise IndexError(f"ScriptedModel has {len(self._script)} turns; call {n + 1} has no answer")
        entry = self._script[n]
        if callable(entry):
            entry = entry(request)
        events = entry.events() if isinstance(entry, ScriptedTurn) else list(entry)
        for event in events:
            yield event
