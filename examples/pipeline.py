"""A small multi-agent run tree: a coordinator fans a question out to three researchers and a writer.

Run it with `make run` (which is `plexus dev examples.pipeline:app --run examples.pipeline:main`): an
embedded nats-server and a worker start, `main` sends one question, and the whole run tree's progress is
printed from ONE subscription while it happens.
"""

from __future__ import annotations

import asyncio

from plexus.core import AgentId, BaseBlock, ExecutionBudget, SpawnBudget, TextBlock
from plexus.runtime import Agent, App, Context, Runtime, new_root_run

app = App()

TOPICS = ("history", "physics", "economics")


@app.agent("researcher", description="Answers a question from one angle", capabilities=["research"])
class Researcher(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        question = _text(blocks)
        await ctx.emit_progress("thinking", [TextBlock(text=f"{ctx.agent_id.key} angle on {question!r}")])
        self.state["answered"] = int(self.state.get("answered", 0)) + 1
        for word in ("considering", "the", f"{ctx.agent_id.key}", "angle"):
            await ctx.stream(word + " ")
        await ctx.usage(tokens=120)
        return [TextBlock(text=f"[{ctx.agent_id.key}] {question} (answer #{self.state['answered']})")]


@app.agent("writer", description="Merges findings into one answer", capabilities=["writing"])
class Writer(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("started", [TextBlock(text=f"merging {len(blocks)} findings")])
        return [TextBlock(text=" | ".join(_text([b]) for b in blocks))]


@app.agent("coordinator", description="Plans, delegates, merges", capabilities=["planning"])
class Coordinator(Agent):
    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.emit_progress("started", blocks)
        findings = await asyncio.gather(
            *(ctx.spawn(AgentId("researcher", topic), blocks) for topic in TOPICS)
        )
        await ctx.emit_progress("handoff", [TextBlock(text="all researchers answered; asking the writer")])
        merged = await ctx.spawn(AgentId("writer", "main"), [b for found in findings for b in found])
        await ctx.emit_progress("done", merged)
        return merged


def _text(blocks: list[BaseBlock]) -> str:
    return " ".join(getattr(b, "text", "") for b in blocks)


async def main(rt: Runtime) -> None:
    run = new_root_run()
    print(f"run {run.run_id}: asking the coordinator; progress of the whole tree follows")

    async def watch() -> None:
        async for event in rt.progress(run.run_id):
            indent = "  " * event.depth
            text = _text(event.content)[:70]
            print(f"  {indent}{event.agent_id:<22} {event.step.value:<9} {text}", flush=True)
            if event.step.value == "done" and event.depth == 0:
                return

    watcher = asyncio.create_task(watch())
    reply = await rt.send_message(
        [TextBlock(text="Why did the bridge sway?")], AgentId("coordinator", "demo"), run=run, timeout=60
    )
    await asyncio.wait_for(watcher, 10)
    print(f"reply: {_text(reply)}")
    types = await rt.agent_types()
    print("agent types (queried from the cluster registry, nothing instantiated):")
    for info in types:
        print(f"  {info.type:<12} capabilities={info.capabilities} durable={info.durable}")
    await budgeted(rt)


async def budgeted(rt: Runtime) -> None:
    """The same tree under the orchestrator with a 200-token budget: it fails cluster-wide when crossed."""
    run_id = await rt.start_run(
        AgentId("coordinator", "budgeted"),
        [TextBlock(text="Why is the sky blue?")],
        budget=ExecutionBudget(max_tokens=200),
        spawn_budget=SpawnBudget(max_agents=10),
    )
    print(f"\nrun {run_id}: same tree, orchestrated, max_tokens=200 (each researcher uses 120)")

    async def watch() -> None:
        async for event in rt.progress(run_id):
            indent = "  " * event.depth
            print(
                f"  {indent}{event.agent_id:<22} {event.step.value:<9} {_text(event.content)[:60]}",
                flush=True,
            )

    watcher = asyncio.create_task(watch())
    record = await rt.wait_run(run_id, timeout=60)
    await asyncio.sleep(0.3)  # let the last progress events print
    watcher.cancel()
    print(f"run {run_id}: {record.status.value} — {record.reason}")
