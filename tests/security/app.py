"""Agents served by a worker running as a tenant's `worker` user (tests/security)."""

from __future__ import annotations

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

app = App()


@app.agent("ledger", description="counts its messages in durable state")
class Ledger(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        await ctx.emit_progress("thinking", [TextBlock(text=f"message {self.state['n']}")])
        return [TextBlock(text=str(self.state["n"]))]


@app.agent("tree", description="spawns two ledger children and joins their answers")
class Tree(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        answers = []
        for i in range(2):
            reply = await ctx.spawn(AgentId("ledger", f"{ctx.agent_id.key}-{i}"), blocks, timeout=60)
            answers.append("".join(getattr(b, "text", "") for b in reply))
        return [TextBlock(text=",".join(answers))]
