"""A research team of LLM agents: a planner spawns one researcher per topic and a writer, each an LLMAgent.

Offline by default (ScriptedModel: no network, deterministic). With ``OPENAI_API_KEY`` (and optionally
``OPENAI_BASE_URL`` for vLLM/Ollama/LM Studio, ``PLEXUS_LLM_MODEL`` for the model name) or
``ANTHROPIC_API_KEY`` set, the same tree runs on the real provider through the official SDK.

Run it with ``uv run --no-sync plexus dev examples.research_team:app --run examples.research_team:main``: an
embedded nats-server, orchestrator and worker start; the run tree's progress and the planner's streamed text
are printed live, then the run's usage against its budget.
"""

from __future__ import annotations

import asyncio
import os

from plexus.core import AgentId, ExecutionBudget, SpawnBudget, TextBlock, TextDelta
from plexus.llm import (
    AnthropicModel,
    LLMAgent,
    ModelClient,
    ModelRequest,
    OpenAIChatModel,
    ScriptedModel,
    ScriptedTurn,
    tool,
)
from plexus.runtime import App, Context, Runtime

TOPICS = ("jetstream", "leases")


def _real_model() -> ModelClient | None:
    if os.environ.get("OPENAI_API_KEY"):
        import openai

        return OpenAIChatModel(openai.AsyncOpenAI(), os.environ.get("PLEXUS_LLM_MODEL", "gpt-4o-mini"))
    if os.environ.get("ANTHROPIC_API_KEY"):
        import anthropic

        model = os.environ.get("PLEXUS_LLM_MODEL", "claude-sonnet-4-5")
        return AnthropicModel(anthropic.AsyncAnthropic(), model)
    return None


def _tool_results(request: ModelRequest) -> int:
    return sum(1 for i in request.items if i.kind.value == "tool")


def _planner_script(request: ModelRequest) -> ScriptedTurn:
    done = _tool_results(request)
    if done == 0:
        calls = [(f"r_{t}", "research", {"topic": t}) for t in TOPICS]
        return ScriptedTurn(text="I will ask two researchers in parallel.", tool_calls=calls)
    if done == 1:
        notes = " / ".join(r.text for r in request.items[-1:])
        return ScriptedTurn(text="Now the writer.", tool_calls=[("w", "write", {"notes": notes or "notes"})])
    return ScriptedTurn(
        text="The report is ready: durable agents on NATS, journaled so no turn is paid twice."
    )


def _researcher_script(request: ModelRequest) -> ScriptedTurn:
    topic = request.items[-1].text if _tool_results(request) == 0 else ""
    if _tool_results(request) == 0:
        return ScriptedTurn(tool_calls=[("l", "lookup", {"topic": topic})])
    return ScriptedTurn(text=f"Finding: {request.items[-1].blocks[0].model_dump().get('content', '')!s:.60}")


def _writer_script(request: ModelRequest) -> ScriptedTurn:
    return ScriptedTurn(text=f"Report draft based on {len(request.items[-1].text)} characters of notes.")


def _model(script: object) -> ModelClient:
    return _real_model() or ScriptedModel([script] * 20)  # type: ignore[list-item]


@tool
def lookup(topic: str) -> str:
    """Look a topic up in the (offline) library."""
    library = {
        "jetstream": "JetStream stores messages durably with per-subject sequences.",
        "leases": "Partition leases in a KV bucket decide which worker owns an agent key.",
    }
    return library.get(topic, f"nothing on {topic}")


@tool
async def research(topic: str, ctx: Context) -> str:
    """Ask a researcher agent about one topic (a child run, counted in the spawn budget)."""
    reply = await ctx.spawn(AgentId("researcher", topic), [TextBlock(text=topic)], timeout=120)
    return " ".join(getattr(b, "text", "") for b in reply)


@tool(mode="sequential")
async def write(notes: str, ctx: Context) -> str:
    """Hand the notes to the writer agent and return its draft."""
    reply = await ctx.spawn(AgentId("writer", "main"), [TextBlock(text=notes)], timeout=120)
    return " ".join(getattr(b, "text", "") for b in reply)


app = App()
app.register(
    "planner",
    lambda _id: LLMAgent(
        _model(_planner_script),
        system="Plan, delegate with your tools, then answer.",
        tools=[research, write],
    ),
    description="Plans the research and merges it",
)
app.register(
    "researcher",
    lambda _id: LLMAgent(_model(_researcher_script), system="Research one topic.", tools=[lookup]),
    description="Researches one topic with a lookup tool",
)
app.register(
    "writer",
    lambda _id: LLMAgent(_model(_writer_script), system="Write a short report."),
    description="Writes the report",
)


async def main(rt: Runtime) -> None:
    planner = AgentId("planner", "demo")
    budget = ExecutionBudget(max_tokens=20_000, max_turns=30)
    mode = "real provider" if _real_model() else "offline (ScriptedModel)"
    run_id = await rt.start_run(
        planner,
        [TextBlock(text="How does Plexus keep agents durable?")],
        budget=budget,
        spawn_budget=SpawnBudget(max_agents=10),
    )
    print(f"run {run_id} ({mode}); progress of the tree and the planner's streamed text follow")
    url = rt.nc.connected_url
    if url is not None:
        print(f"watch it in a terminal: plexus runs watch {run_id} --nats nats://{url.hostname}:{url.port}")

    async def watch() -> None:
        async for event in rt.progress(run_id):
            text = " ".join(getattr(b, "text", "") for b in event.content)[:60]
            print(f"  {'  ' * event.depth}{event.agent_id:<24} {event.step.value:<11} {text}", flush=True)

    async def deltas() -> None:
        async for event in rt.stream(planner):
            if isinstance(event, TextDelta):
                print(f"    [planner streams] {event.text!r}", flush=True)

    tasks = [asyncio.create_task(watch()), asyncio.create_task(deltas())]
    record = await rt.wait_run(run_id, timeout=300)
    await asyncio.sleep(0.3)  # let the last progress events print
    for task in tasks:
        task.cancel()
    print(f"run {run_id}: {record.status.value} {record.reason or ''}")
    used = record.usage
    print(f"usage: {used.tokens} tokens of {budget.max_tokens}, {used.turns} turns of {budget.max_turns}")
