"""Agents for the orchestrated run-tree tests, served by real `plexus worker` processes.

Every agent reports what it does as progress events (durable in PLEXUS_PROGRESS), so the tests can see
what happened on workers that were killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

from plexus.core import (
    AgentId,
    BaseBlock,
    BudgetExhaustedError,
    KernelError,
    MiddlewareTermination,
    SpawnDenied,
    TextBlock,
)
from plexus.runtime import Agent, App, Context

app = App()

#: Leaf key -> set once that leaf has made its first step in this process (a root's ``after`` waits for it;
#: meaningful when the root and that leaf run in the same worker process).
_first_steps: dict[str, asyncio.Event] = {}


def _first_step(key: str) -> asyncio.Event:
    return _first_steps.setdefault(key, asyncio.Event())


def _text(blocks: list[BaseBlock]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)


def _cmd(blocks: list[BaseBlock]) -> dict[str, object]:
    loaded = json.loads(_text(blocks) or "{}")
    assert isinstance(loaded, dict)
    return loaded


@app.agent("root", description="spawns a tree of leaves")
class Root(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = _cmd(blocks)
        children = int(str(cmd.get("children", 0)))
        leaf_cmd = json.dumps(cmd.get("leaf", {}))
        priority = cmd.get("priority")

        async def one(i: int) -> str:
            try:
                reply = await ctx.spawn(
                    AgentId("leaf", f"{ctx.agent_id.key}-{i}"),
                    [TextBlock(text=leaf_cmd)],
                    priority=int(str(priority)) if priority is not None else None,
                    timeout=60,
                )
                return "ok:" + _text(reply)
            except SpawnDenied:
                return "denied"
            except KernelError as exc:
                return f"error:{exc.error_type}"

        async def spec(i: int, item: dict[str, object]) -> str:
            # Staggered children with their own priority and command (for preemption): ``after`` waits until
            # spec ``after``'s leaf has made its first step (a fixed delay alone raced its slow activation).
            if "after" in item:
                after = _first_step(f"{ctx.agent_id.key}-s{item['after']}")
                await asyncio.wait_for(after.wait(), 30)
            await asyncio.sleep(float(str(item.get("delay", 0))))
            try:
                reply = await ctx.spawn(
                    AgentId("leaf", f"{ctx.agent_id.key}-s{i}"),
                    [TextBlock(text=json.dumps(item.get("leaf", {})))],
                    priority=int(str(item["priority"])) if "priority" in item else None,
                    timeout=60,
                )
                return "ok:" + _text(reply)
            except SpawnDenied:
                return "denied"

        specs = cmd.get("specs")
        if isinstance(specs, list):
            results = await asyncio.gather(*(spec(i, item) for i, item in enumerate(specs)))
        else:
            results = await asyncio.gather(*(one(i) for i in range(children)))
        await ctx.emit_progress("done", [TextBlock(text=json.dumps(results))])
        return [TextBlock(text=json.dumps(results))]


@app.agent("leaf", description="consumes tokens step by step")
class Leaf(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = _cmd(blocks)
        steps = int(str(cmd.get("steps", 1)))
        tokens = int(str(cmd.get("tokens", 0)))
        sleep = float(str(cmd.get("sleep", 0.0)))
        await ctx.emit_progress("started", [TextBlock(text=f"pid={os.getpid()}")])
        start = int(self.state.get("step", 0))
        for step in range(start, steps):
            if tokens:
                try:
                    await ctx.usage(tokens=tokens)
                except BudgetExhaustedError:
                    await ctx.emit_progress("error", [TextBlock(text="budget")])
                    if not cmd.get("stubborn"):
                        raise
                    # Stubborn: goes on spending (a model call already under way) until the tree's
                    # cancellation reaches it; that usage is counted all the same.
            self.state["step"] = step + 1
            if cmd.get("checkpoint"):
                await ctx.checkpoint()
            await ctx.emit_progress("thinking", [TextBlock(text=f"step {step + 1} pid={os.getpid()}")])
            _first_step(ctx.agent_id.key).set()
            if sleep:
                await asyncio.sleep(sleep)
        return [TextBlock(text=f"{ctx.agent_id.key} did {steps} steps from {start}")]


@app.agent("sleeper", description="never checks anything; just sleeps")
class Sleeper(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("started", [TextBlock(text=f"pid={os.getpid()}")])
        await asyncio.sleep(float(str(_cmd(blocks).get("sleep", 60))))
        return [TextBlock(text="woke up")]


@app.agent("doomed", description="kills its own worker process when DOOMED_KILL is set")
class Doomed(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("started", [TextBlock(text=f"pid={os.getpid()}")])
        if os.environ.get("DOOMED_KILL"):
            await asyncio.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        return [TextBlock(text="survived")]


@app.agent("guarded", description="a guard ends its run on purpose (MiddlewareTermination)")
class Guarded(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        raise MiddlewareTermination("guardrail: forbidden topic " + _text(blocks))
