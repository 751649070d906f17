"""Agents behind the gateway tests: a root that fans out to leaves that spend tokens step by step."""

from __future__ import annotations

import asyncio
import json

from plexus.core import AgentId, BaseBlock, DataBlock, KernelError, TextBlock, Usage
from plexus.llm import LLMAgent, ScriptedModel, ScriptedTurn, tool
from plexus.runtime import Agent, App, Context
from plexus.runtime.orchestration import APPROVAL_KEY

app = App()


def _text(blocks: list[BaseBlock]) -> str:
    return "".join(getattr(b, "text", "") for b in blocks)


def _cmd(blocks: list[BaseBlock]) -> dict[str, object]:
    try:
        loaded = json.loads(_text(blocks) or "{}")
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


@app.agent("echo", description="replies with its input", capabilities=["chat"])
class Echo(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("thinking", [TextBlock(text="echoing")])
        turns = int(self.state.get("turns", 0)) + 1
        self.state["turns"] = turns
        return [TextBlock(text=f"echo #{turns}: {_text(blocks)}")]


@app.agent("fanout", description="spawns `children` leaves and gathers their replies")
class Fanout(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = _cmd(blocks)
        children = int(str(cmd.get("children", 2)))
        leaf = json.dumps(cmd.get("leaf", {}))
        await ctx.emit_progress("started", [TextBlock(text=f"fanning out to {children}")])

        async def one(i: int) -> str:
            try:
                reply = await ctx.spawn(
                    AgentId("leaf", f"{ctx.agent_id.key}-{i}"), [TextBlock(text=leaf)], timeout=120
                )
                return _text(reply)
            except KernelError as exc:
                return f"error:{exc.error_type}"

        results = await asyncio.gather(*(one(i) for i in range(children)))
        return [TextBlock(text=json.dumps(results))]


@app.agent("leaf", description="spends tokens step by step")
class Leaf(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = _cmd(blocks)
        steps = int(str(cmd.get("steps", 1)))
        tokens = int(str(cmd.get("tokens", 0)))
        sleep = float(str(cmd.get("sleep", 0.0)))
        for step in range(steps):
            if tokens:
                await ctx.usage(tokens=tokens)
            await ctx.emit_progress("thinking", [TextBlock(text=f"step {step + 1}")])
            if sleep:
                await asyncio.sleep(sleep)
        return [TextBlock(text=f"{ctx.agent_id.key} did {steps}")]


@app.agent("failing", description="always fails")
class Failing(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        raise ValueError("nope")


@app.agent("streamer", description="streams text deltas while it works")
class Streamer(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("started", [TextBlock(text="streaming")])
        rounds = int(str(_cmd(blocks).get("rounds", 30)))
        for i in range(rounds):
            await ctx.stream(f"tok{i} ")
            await asyncio.sleep(0.1)
        return [TextBlock(text="streamed")]


@app.agent("ticker", description="emits `n` progress events `gap` seconds apart (benchmarks)")
class Ticker(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        cmd = _cmd(blocks)
        n = int(str(cmd.get("n", 100)))
        gap = float(str(cmd.get("gap", 0.005)))
        for i in range(n):
            await ctx.emit_progress("thinking", [TextBlock(text=str(i))])
            if gap:
                await asyncio.sleep(gap)
        return [TextBlock(text=f"ticked {n}")]


@app.agent("tooler", description="reports a tool call and its result as progress steps")
class Tooler(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("tool_call", [TextBlock(text="search(q='sse')")])
        await ctx.emit_progress("tool_result", [TextBlock(text="3 hits")])
        return [TextBlock(text="done")]


@app.agent("gatekeeper", description="waits for a person's decision before it answers")
class Gatekeeper(Agent):
    """The runtime's approval protocol without plexus.llm: ask once, answer with the decision."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        data = blocks[0].data if len(blocks) == 1 and isinstance(blocks[0], DataBlock) else {}
        decision = data.get(APPROVAL_KEY)
        if isinstance(decision, dict):
            return [TextBlock(text=f"{decision['call_id']} approved={decision['approved']}")]
        ctx.await_approval(["door-1"])
        return [TextBlock(text="waiting for door-1")]


@tool(needs_approval=True)
def open_door(door: int) -> str:
    """Open a door (a person must approve)."""
    return f"door {door} open"


def _porter(_id: AgentId) -> LLMAgent:
    """Two gated turns that both call ``call_0`` (as OpenAI-compatible servers do), then an answer."""
    turns = [ScriptedTurn(tool_calls=[("call_0", "open_door", {"door": n})]) for n in (1, 2)]
    return LLMAgent(ScriptedModel([*turns, ScriptedTurn(text="both doors open")]), tools=[open_door])


app.register("porter", _porter, description="an LLM agent whose two turns each ask to open a door (call_0)")


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def _scripted_llm(_id: AgentId) -> LLMAgent:
    """Two model turns with a tool call between them, each with its own usage (nothing leaves the host)."""
    return LLMAgent(
        ScriptedModel(
            [
                ScriptedTurn(
                    text="Looking it up.",
                    tool_calls=[("c1", "lookup", {"q": "plexus"})],
                    usage=Usage(input_tokens=120, cached_tokens=20, output_tokens=30, reasoning_tokens=10),
                ),
                ScriptedTurn(
                    text="Found it.",
                    usage=Usage(input_tokens=200, cached_tokens=100, output_tokens=40, reasoning_tokens=5),
                ),
            ]
        ),
        tools=[lookup],
    )


app.register("llm", _scripted_llm, description="a scripted LLM agent: two turns and a tool call")


helpdesk = app.register(
    "helpdesk",
    lambda _id: LLMAgent(ScriptedModel([ScriptedTurn(text="Helpdesk here: solved.")])),
    description="the helpdesk: takes conversations handed over by the triage agent",
)


def _triage(_id: AgentId) -> LLMAgent:
    """Hands the conversation to the helpdesk on its first turn (plexus.llm handoffs)."""
    turn = ScriptedTurn(text="Passing you on.", tool_calls=[("h1", "transfer_to_helpdesk", {})])
    return LLMAgent(ScriptedModel([turn]), handoffs=[helpdesk])


app.register("triage", _triage, description="an LLM agent that hands every conversation to the helpdesk")
