"""One model call's stream read into a `ModelTurn`: deltas go out on the agent's stream subject as they
come, and the call stops at once when the run is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from plexus.core import CancellationError
from plexus.runtime import Context

from ._accumulate import ModelTurn, TurnAccumulator
from ._client import ModelClient, ModelRequest
from ._events import ReasoningDeltaEvent, TextDeltaEvent

__all__ = ["race_cancellation", "stream_turn"]


async def stream_turn(ctx: Context, model: ModelClient, request: ModelRequest) -> ModelTurn:
    """Call `model` with `request`, streaming its text and reasoning deltas through `ctx`."""
    acc = TurnAccumulator()
    async for event in model.stream(request):
        acc.add(event)
        if isinstance(event, TextDeltaEvent) and event.text:
            await ctx.stream(event.text)
        elif isinstance(event, ReasoningDeltaEvent) and event.text:
            await ctx.stream(event.text, reasoning=True)
    return acc.finish(metadata={"plexus.llm.model": model.model})


async def race_cancellation(ctx: Context, work: Coroutine[Any, Any, ModelTurn]) -> ModelTurn:
    """Await ``work`` unless the run is cancelled first; then stop it and raise CancellationError."""
    task: asyncio.Task[ModelTurn] = asyncio.ensure_future(work)
    registration = ctx.cancellation.add_callback(lambda _reason: task.cancel())
    try:
        return await task
    except asyncio.CancelledError:
        if ctx.cancellation.is_cancelled:
            raise CancellationError(ctx.cancellation.reason or "cancelled") from None
        raise
    finally:
        registration.unregister()
