"""Agents of the telemetry tests: `relay` forwards to `ledger`, so a trace spans two handlers."""

from __future__ import annotations

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

app = App()


@app.agent("ledger", description="counts its messages")
class Ledger(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        return [TextBlock(text=str(self.state["n"]))]


@app.agent("relay", description="asks ledger/<its key> and returns the answer")
class Relay(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return await ctx.send(blocks, AgentId("ledger", ctx.agent_id.key), timeout=30)


@app.agent("lead", description="spawns ledger/<its key> as a child run and returns its answer")
class Lead(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return await ctx.spawn(AgentId("ledger", f"{ctx.agent_id.key}-child"), blocks, timeout=30)
