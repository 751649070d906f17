"""Middleware at four stages of the loop, each ``process(context, call_next)``:

- message: around one handled message (the whole loop, replayed steps included);
- turn: around one loop iteration (model call and its tools), seeing the transcript so far;
- model: around one model call (``ModelRequest`` → ``ModelTurn``), inside the journal: a replayed turn does
  not pass through it again;
- tool: around one tool call (``ToolUseBlock`` → ``ToolResultBlock``).

A middleware that raises `plexus.core.MiddlewareTermination` ends the run with that typed error
(never retried).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from plexus.core import BaseBlock, Item, TextBlock, ToolResultBlock, ToolUseBlock
from plexus.runtime import Agent, Context

from ._accumulate import ModelTurn
from ._client import ModelClient, ModelRequest
from ._errors import ProviderUnavailableError, RateLimitError
from ._retried import retried
from ._settings import ModelSettings

__all__ = [
    "MessageCall",
    "Middleware",
    "ModelCall",
    "ProviderRetry",
    "RateLimit",
    "ToolCall",
    "ToolOutputLimit",
    "Turn",
]

log = logging.getLogger("plexus.llm")


@dataclass(frozen=True)
class MessageCall:
    """One handled message: what arrived and the agent handling it."""

    ctx: Context
    blocks: list[BaseBlock]
    agent: Agent


@dataclass(frozen=True)
class Turn:
    ctx: Context
    items: Sequence[Item]
    number: int


@dataclass(frozen=True)
class ModelCall:
    ctx: Context
    request: ModelRequest
    model: str
    #: The model client the call goes to (None when a caller built the call without one).
    client: ModelClient | None = None

    def with_settings(self, settings: ModelSettings) -> ModelCall:
        """This call with ``settings``' set values winning over its request's (a per-call override)."""
        return replace(self, request=self.request.with_settings(settings))


@dataclass(frozen=True)
class ToolCall:
    ctx: Context
    call: ToolUseBlock


class Middleware:
    """Base class: override the stages you need; each must call ``call_next`` (or not, to short-circuit)."""

    async def process_message(
        self, context: MessageCall, call_next: Callable[[MessageCall], Awaitable[list[BaseBlock] | None]]
    ) -> list[BaseBlock] | None:
        return await call_next(context)

    async def process_turn(self, context: Turn, call_next: Callable[[Turn], Awaitable[None]]) -> None:
        await call_next(context)

    async def process_model(
        self, context: ModelCall, call_next: Callable[[ModelCall], Awaitable[ModelTurn]]
    ) -> ModelTurn:
        return await call_next(context)

    async def process_tool(
        self, context: ToolCall, call_next: Callable[[ToolCall], Awaitable[ToolResultBlock]]
    ) -> ToolResultBlock:
        return await call_next(context)


def chain(stage: str, middleware: Sequence[Middleware], final: Callable[[Any], Awaitable[Any]]) -> Any:
    """``final`` wrapped by every middleware's ``process_<stage>``, the first in the list outermost (one that
    does not override the stage is left out: the base class's only passes the call on)."""
    call = final
    name = f"process_{stage}"
    passing = getattr(Middleware, name)
    for mw in reversed(middleware):
        if getattr(type(mw), name, None) is passing:
            continue
        method = getattr(mw, name)

        def bound(context: Any, _method: Any = method, _next: Any = call) -> Awaitable[Any]:
            return _method(context, _next)  # type: ignore[no-any-return]

        call = bound
    return call


@dataclass
class ProviderRetry(Middleware):
    """Retry a model call on `RateLimitError` and `ProviderUnavailableError`: wait the provider's
    ``retry_after_s`` when given, else ``base_s * 2**attempt``, both capped at ``max_s``.

    `LLMAgent` puts one in front of its middleware unless given its own. The cap bounds how long one
    handler holds its agent's mailbox; a provider asking for longer gets its request again earlier, and
    when the retries run out the error goes to the run's RetryPolicy, whose backoff can be longer.
    """

    attempts: int = 3
    base_s: float = 0.5
    max_s: float = 30.0
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)

    async def process_model(
        self, context: ModelCall, call_next: Callable[[ModelCall], Awaitable[ModelTurn]]
    ) -> ModelTurn:
        attempt = 0
        while True:
            try:
                return await call_next(context)
            except (RateLimitError, ProviderUnavailableError) as exc:
                if attempt + 1 >= self.attempts:
                    raise
                after = getattr(exc, "retry_after_s", None)
                wait = min(self.max_s, self.base_s * 2**attempt if after is None else after)
                log.info("model call failed (%s); retry %d in %.2f s", exc.error_type, attempt + 1, wait)
                context.ctx.record(retried(attempt + 1, exc, wait))  # shown in the transcript
                await context.ctx.check()
                await self.sleep(wait)
                attempt += 1


@dataclass
class RateLimit(Middleware):
    """At most ``per_second`` model calls per second per model name, in this process."""

    per_second: float
    _next_at: dict[str, float] = field(default_factory=dict, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    async def process_model(
        self, context: ModelCall, call_next: Callable[[ModelCall], Awaitable[ModelTurn]]
    ) -> ModelTurn:
        async with self._lock:
            now = time.monotonic()
            at = max(now, self._next_at.get(context.model, now))
            self._next_at[context.model] = at + 1 / self.per_second
        if at > now:
            await asyncio.sleep(at - now)
        return await call_next(context)


@dataclass
class ToolOutputLimit(Middleware):
    """Truncate the text of every tool result to ``max_chars`` (a note says how much was cut)."""

    max_chars: int

    async def process_tool(
        self, context: ToolCall, call_next: Callable[[ToolCall], Awaitable[ToolResultBlock]]
    ) -> ToolResultBlock:
        result = await call_next(context)
        budget = self.max_chars
        blocks = []
        changed = False
        for block in result.content:
            if isinstance(block, TextBlock) and len(block.text) > budget:
                cut = len(block.text) - budget
                block = TextBlock(text=block.text[:budget] + f"\n[... {cut} characters truncated]")
                changed = True
            if isinstance(block, TextBlock):
                budget = max(0, budget - len(block.text))
            blocks.append(block)
        return result.model_copy(update={"content": blocks}) if changed else result
