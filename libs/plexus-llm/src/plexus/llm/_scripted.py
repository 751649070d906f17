"""`ScriptedModel`: a deterministic `ModelClient` without HTTP, for unit tests and the offline demo.

Turns are counted per `ScriptedModel` instance, across every request it gets (messages and keys alike): a
script is a list of answers to the 1st, 2nd, ... call of that object. Counting per conversation would need
an identity the request does not carry, and the examples and tests rely on the shared counter (one model
for several agents, ``[fn] * 20``). A script that must not depend on which calls came before (an agent
re-activated after passivation builds a new model) uses functions of the request instead.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from plexus.core import FinishReason, JsonValue, KernelError, Usage

from ._client import ModelRequest
from ._events import FinishEvent, ModelEvent, TextDeltaEvent, ToolCallDeltaEvent, UsageEvent

__all__ = ["ScriptExhaustedError", "ScriptedModel", "ScriptedTurn"]


class ScriptExhaustedError(KernelError):
    """A `ScriptedModel` was called more times than its script has turns (``script`` names it)."""

    fields: ClassVar[tuple[str, ...]] = ("message", "script", "turns")

    def __init__(self, message: str, script: str = "", turns: int = 0) -> None:
        super().__init__(message)
        self.script = script
        self.turns = turns


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
    """Answers its Nth call with ``script[N]``: a `ScriptedTurn`, a list of `ModelEvent`s, or a function of
    the `ModelRequest` returning a `ScriptedTurn` (``[fn] * 20``: the same function for 20 calls).

    ``ScriptedTurn.tool_calls`` are ``(call_id, tool_name, arguments)`` tuples. N counts every call of this
    instance, across messages and agents sharing it; ``requests`` records them. A call past the end raises
    `ScriptExhaustedError` naming the script (``name``, else its functions' names) and its length.
    """

    def __init__(
        self,
        script: Sequence[ScriptedTurn | Sequence[ModelEvent] | Callable[[ModelRequest], ScriptedTurn]],
        *,
        model: str = "scripted",
        name: str | None = None,
    ) -> None:
        self._script = list(script)
        self._model = model
        self.name = name or _script_name(self._script)
        self.requests: list[ModelRequest] = []

    @property
    def model(self) -> str:
        return self._model

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        n = len(self.requests)
        self.requests.append(request)
        if n >= len(self._script):
            turns = len(self._script)
            raise ScriptExhaustedError(
                f"ScriptedModel {self.name!r} has {turns} turn(s); call {n + 1} has no answer (turns are "
                "counted per ScriptedModel instance, across messages and agents sharing it): add turns, or "
                "answer with a function of the request",
                script=self.name,
                turns=turns,
            )
        entry = self._script[n]
        if callable(entry):
            entry = entry(request)
        events = entry.events() if isinstance(entry, ScriptedTurn) else list(entry)
        for event in events:
            yield event


def _script_name(script: Sequence[object]) -> str:
    names = dict.fromkeys(getattr(e, "__qualname__", "") for e in script if callable(e))
    return ", ".join(n for n in names if n) or "scripted"
