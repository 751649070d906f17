"""The agent types the fuzz harness's worker process serves (`plexus worker tests.fuzz.app:app`)."""

from __future__ import annotations

from plexus.core import AgentId, BaseBlock, TextBlock
from plexus.runtime import Agent, App, Context

app = App()


@app.agent("echo", description="returns its input, counting messages in durable state")
class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["n"] = int(self.state.get("n", 0)) + 1
        return blocks


@app.agent("echo-eph", description="stateless echo", durable=False)
class EchoEphemeral(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        return blocks


@app.agent("spawner", description="spawns one echo child and returns its reply")
class Spawner(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        reply = await ctx.spawn(AgentId("echo", f"{ctx.agent_id.key}-child"), blocks, timeout=30)
        return [TextBlock(text="spawned"), *reply]


@app.agent("listener", description="subscribed to the fuzz topic; records how many publications it saw")
class Listener(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        self.state["seen"] = int(self.state.get("seen", 0)) + 1
        return []
