"""A research team of LLM agents: a planner spawns one researcher per topic and a writer, each an LLMAgent.

Offline by default (ScriptedModel: no network, deterministic). With ``OPENAI_API_KEY``,
``ANTHROPIC_API_KEY`` or ``GEMINI_API_KEY`` / ``GOOGLE_API_KEY`` set (looked at in that order), the same tree
runs on the real provider through the official SDK (``PLEXUS_LLM_MODEL`` names the model): OpenAI through
the Responses API, or Chat Completions with ``PLEXUS_OPENAI_API=chat`` or a custom ``OPENAI_BASE_URL``
(vLLM/Ollama/LM Studio speak only that); Gemini through google-genai.

The researchers' lookup tool comes from a small MCP server (`examples/library_mcp.py`, stdio, one process
per worker); the writer answers with a typed `Report` (``output_type``), which `main` reads back with
``rt.run_result(..., output_type=Report)``.

Run it with ``uv run --no-sync plexus dev examples.research_team:app --run examples.research_team:main``: an
embedded nats-server, orchestrator and worker start; the run tree's progress (tool calls and their results)
and the planner's streamed text are printed live, then the writer's typed report and the run's usage
against its budget.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from plexus.core import (
    AgentId,
    BaseBlock,
    DataBlock,
    ExecutionBudget,
    JsonValue,
    KernelError,
    SpawnBudget,
    TextBlock,
    TextDelta,
    ToolResultBlock,
    ToolUseBlock,
)
from plexus.llm import (
    AnthropicModel,
    GeminiModel,
    LLMAgent,
    MCPServer,
    ModelClient,
    ModelRequest,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ScriptedModel,
    ScriptedTurn,
    tool,
)
from plexus.runtime import App, Context, Runtime

TOPICS = ("jetstream", "leases")


def openai_api(env: Mapping[str, str]) -> str:
    """Which OpenAI API to call: ``responses`` (OpenAI's own), or ``chat`` when ``PLEXUS_OPENAI_API=chat``
    or ``OPENAI_BASE_URL`` points elsewhere than api.openai.com (compatible servers speak only that)."""
    base_url = env.get("OPENAI_BASE_URL", "").rstrip("/")
    if env.get("PLEXUS_OPENAI_API") == "chat" or base_url not in ("", "https://api.openai.com/v1"):
        return "chat"
    return "responses"


def _real_model() -> ModelClient | None:
    if os.environ.get("OPENAI_API_KEY"):
        import openai

        if openai_api(os.environ) == "chat":
            return OpenAIChatModel(openai.AsyncOpenAI(), os.environ.get("PLEXUS_LLM_MODEL", "gpt-4o-mini"))
        return OpenAIResponsesModel(openai.AsyncOpenAI(), os.environ.get("PLEXUS_LLM_MODEL", "gpt-5-mini"))
    if os.environ.get("ANTHROPIC_API_KEY"):
        import anthropic

        model = os.environ.get("PLEXUS_LLM_MODEL", "claude-sonnet-4-5")
        return AnthropicModel(anthropic.AsyncAnthropic(), model)
    if os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY"):
        from google import genai  # the client reads either key from the environment

        return GeminiModel(genai.Client(), os.environ.get("PLEXUS_LLM_MODEL", "gemini-2.5-flash"))
    return None


def _tool_results(request: ModelRequest) -> int:
    return sum(1 for i in request.items if i.kind.value == "tool")


def _planner_script(request: ModelRequest) -> ScriptedTurn:
    done = _tool_results(request)
    if done == 0:
        calls = [(f"r_{t}", "research", {"topic": t}) for t in TOPICS]
        return ScriptedTurn(text="I will ask two researchers in parallel.", tool_calls=calls)
    if done == 1:
        notes = " / ".join(request.last_tool_texts().values())
        return ScriptedTurn(text="Now the writer.", tool_calls=[("w", "write", {"notes": notes or "notes"})])
    return ScriptedTurn(
        text="The report is ready: durable agents on NATS, journaled so no turn is paid twice."
    )


def _researcher_script(request: ModelRequest) -> ScriptedTurn:
    if _tool_results(request) == 0:  # the MCP server's tool: `library_` (its name) + `lookup`
        return ScriptedTurn(tool_calls=[("l", "library_lookup", {"topic": request.last_user_text()})])
    return ScriptedTurn(text=f"Finding: {request.last_tool_texts()['l']}")


def _writer_script(request: ModelRequest) -> ScriptedTurn:
    # A typed agent's final answer is the JSON of its output_type (validated by the loop).
    notes = [n.strip() for n in request.last_user_text().split(" / ") if n.strip()]
    report = Report(
        title="How Plexus keeps agents durable",
        summary=f"Drafted from {len(notes)} research notes.",
        key_points=[n.removeprefix("Finding: ") for n in notes],
    )
    return ScriptedTurn(text=report.model_dump_json())


def _model(script: object) -> ModelClient:
    return _real_model() or ScriptedModel([script] * 20)  # type: ignore[list-item]


class Report(BaseModel):
    """The writer's typed answer (``LLMAgent(output_type=Report)``)."""

    title: str
    summary: str
    key_points: list[str]


# The lookup tool lives in an MCP server: one `python library_mcp.py` process per worker, started at the
# first lookup; its tool is offered as `library_lookup`.
library = MCPServer.stdio(sys.executable, [str(Path(__file__).with_name("library_mcp.py"))], name="library")


def _answer(reply: list[BaseBlock]) -> dict[str, JsonValue] | str:
    """A child's reply as a tool result: its typed data when it has some, else its text."""
    data = [b.data for b in reply if isinstance(b, DataBlock)]
    return data[-1] if data else " ".join(getattr(b, "text", "") for b in reply)


@tool
async def research(topic: str, ctx: Context) -> str:
    """Ask a researcher agent about one topic (a child run, counted in the spawn budget)."""
    reply = await ctx.spawn(AgentId("researcher", topic), [TextBlock(text=topic)], timeout=120)
    return " ".join(getattr(b, "text", "") for b in reply)


@tool(mode="sequential")
async def write(notes: str, ctx: Context) -> dict[str, JsonValue] | str:
    """Hand the notes to the writer agent and return its report (title, summary, key points)."""
    return _answer(await ctx.spawn(AgentId("writer", "main"), [TextBlock(text=notes)], timeout=120))


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
    lambda _id: LLMAgent(
        _model(_researcher_script), system="Research one topic with the library.", tools=[library]
    ),
    description="Researches one topic with the library's MCP lookup tool",
)
app.register(
    "writer",
    lambda _id: LLMAgent(_model(_writer_script), system="Write a short report.", output_type=Report),
    description="Writes the report (a typed Report)",
)


def _describe(block: BaseBlock) -> str:
    """One block of a progress event as a line: text, a tool call, a tool result's text, typed data."""
    if isinstance(block, ToolUseBlock):
        return f"{block.tool_name} {block.arguments}"
    if isinstance(block, ToolResultBlock):
        return " ".join(_describe(b) for b in block.content)
    if isinstance(block, DataBlock):
        return f"{block.schema_id or 'data'} {block.data}"
    return getattr(block, "text", "")


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

    writer_runs: list[str] = []

    async def watch() -> None:
        async for event in rt.progress(run_id):
            if event.agent_id == "writer/main":
                writer_runs.append(event.run_id)
            text = " ".join(_describe(b) for b in event.content)[:90]
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
    if writer_runs:  # the writer's child run answered with a Report: read it back typed
        try:
            report = await rt.run_result(writer_runs[0], output_type=Report)
        except KernelError as exc:  # a real model's answer that never validated, say
            print(f"no typed report (run {writer_runs[0]}): {type(exc).__name__}: {exc}")
        else:
            print(f"typed report ({type(report).__name__}, run {writer_runs[0]}): {report.title}")
            print(f"  summary: {report.summary}")
            for point in report.key_points:
                print(f"  - {point}")
    used = record.usage
    print(f"usage: {used.tokens} tokens of {budget.max_tokens}, {used.turns} turns of {budget.max_turns}")
