"""Tool sources: objects in ``LLMAgent(tools=[...])`` that list their tools at run time (an MCP server).

An agent with sources rebuilds its `ToolRegistry` only when a source hands back a different list (a source
caches its own, so a turn costs one call per source); an agent without sources never comes here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ._tools import Tool, ToolRegistry

__all__ = ["ToolSource", "ToolSources", "split_sources"]


@runtime_checkable
class ToolSource(Protocol):
    """Something that lists tools when the loop asks (before each model call): ``MCPServer`` is one."""

    async def list_tools(self) -> Sequence[Tool]:
        """The tools on offer now; the same list object while nothing changed (the registry is kept then)."""
        ...


def split_sources(tools: Sequence[object]) -> tuple[list[Tool], list[ToolSource]]:
    """Separate ``tools=``'s sources from its plain tools (which `ToolRegistry` checks)."""
    plain: list[Tool] = []
    sources: list[ToolSource] = []
    for t in tools:
        if not isinstance(t, Tool) and isinstance(t, ToolSource):
            sources.append(t)
        else:
            plain.append(t)  # type: ignore[arg-type]  # ToolRegistry refuses what is not a Tool, by name
    return plain, sources


class ToolSources:
    """The agent's plain tools plus its sources' current tools, as one registry."""

    def __init__(self, plain: Sequence[Tool], sources: Sequence[ToolSource]) -> None:
        self._plain = list(plain)
        self._sources = list(sources)
        self._seen: list[Sequence[Tool]] = []
        self._registry = ToolRegistry(self._plain)

    async def registry(self) -> ToolRegistry:
        """The registry for the next step; a name listed twice (two sources with one prefix) is a
        ValueError naming it."""
        if len(self._sources) == 1:
            listed = [await self._sources[0].list_tools()]
        else:
            listed = list(await asyncio.gather(*(s.list_tools() for s in self._sources)))
        if len(listed) == len(self._seen) and all(a is b for a, b in zip(listed, self._seen, strict=True)):
            return self._registry
        self._registry = ToolRegistry([*self._plain, *(t for tools in listed for t in tools)])
        self._seen = listed
        return self._registry
