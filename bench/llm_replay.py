"""A model client that replays what the SDK parsed from the fake provider: the loop's own work, no HTTP.

`Replay.recording` is an ``AsyncOpenAI`` stand-in (for `OpenAIChatModel`) that makes the real call and keeps
the chunks the SDK parsed, per request shape: a call answering a tool result, or any other. `Replay.replaying`
answers every later call from those chunks, with no HTTP and none of the SDK's request or response handling,
so a run's loop iterations time Plexus's own work per turn (`bench.llm_components`, `bench.llm_history`).

A conversation of several runs needs an id of its own for every tool call (a repeated id is refused): with
``fresh_ids``, each replayed tool-call answer carries the next id from a pool made when recording, so no copy
is made while a run is timed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from bench.llm_bench import client_with

__all__ = ["Replay", "answers_tool"]


def answers_tool(body: dict[str, Any]) -> bool:
    """Whether the request's last message is a tool result (the call after the tool step)."""
    return bool(body["messages"][-1]["role"] == "tool")


class Replay:
    """Chunks recorded once through ``client`` (``openai.AsyncOpenAI``), replayed for every later call."""

    def __init__(self, client: Any, *, fresh_ids: int = 0) -> None:
        self._client = client
        self._fresh_ids = fresh_ids
        self.recorded: dict[bool, list[Any]] = {}
        self._variants: Iterator[list[Any]] | None = None
        self.recording = client_with(self._record)
        self.replaying = client_with(self._replay)

    async def _record(self, **body: Any) -> AsyncIterator[Any]:
        chunks = [chunk async for chunk in await self._client.chat.completions.create(**body)]
        self.recorded[answers_tool(body)] = chunks
        if self._fresh_ids and not answers_tool(body):
            self._variants = self._with_fresh_ids(chunks)
        return await self._replay(**body)

    def _with_fresh_ids(self, chunks: list[Any]) -> Iterator[list[Any]]:
        """``fresh_ids`` copies of ``chunks``, each tool call's id ``call_<n>``: made now, not while timed."""
        variants = []
        for n in range(self._fresh_ids):
            variant = []
            for chunk in chunks:
                delta = chunk.choices[0].delta if chunk.choices else None
                if delta is not None and delta.tool_calls and delta.tool_calls[0].id:
                    chunk = chunk.model_copy(deep=True)
                    chunk.choices[0].delta.tool_calls[0].id = f"call_{n}"
                variant.append(chunk)
            variants.append(variant)
        return iter(variants)

    async def _replay(self, **body: Any) -> AsyncIterator[Any]:
        after_tool = answers_tool(body)
        if not after_tool and self._variants is not None:
            chunks = next(self._variants, None)
            if chunks is None:
                raise RuntimeError(f"more tool-call answers replayed than fresh_ids={self._fresh_ids}")
        else:
            chunks = self.recorded[after_tool]

        async def stream() -> AsyncIterator[Any]:
            for chunk in chunks:
                yield chunk

        return stream()
