"""Agents behind the log tests: one that answers, one that fails, one that calls a type nobody registered."""

from __future__ import annotations

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

app = App()


@app.agent("fine")
class Fine(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return [TextBlock(text="fine")]


@app.agent("broken")
class Broken(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        raise ValueError("the widget is broken")


@app.agent("caller")
class Caller(Agent):
    """Sends to ``nosuchtype``: the run fails with AgentNotFoundError."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return await ctx.send([TextBlock(text="hi")], AgentId("nosuchtype", "k"), timeout=5.0)
