"""examples/research_team.py runs offline end to end (`plexus dev` with an embedded nats-server,
orchestrator, worker and gateway) and reports a completed tree within its budget: `make run ONCE=1`; its
researchers look topics up through the MCP server examples/library_mcp.py and its writer answers with a
typed Report; and `make run` itself keeps serving the dashboard after the demo until it is stopped."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
from examples import research_team
from examples.library_mcp import LIBRARY

from plexus.core import AgentId, TextBlock
from plexus.llm import (
    OUTPUT_TOOL,
    AnthropicModel,
    GeminiModel,
    LLMAgent,
    ModelClient,
    OpenAIChatModel,
    OpenAIResponsesModel,
    close_mcp_connections,
)
from plexus.runtime import App, Runtime

from .fake_gemini import gemini_client, gemini_frames
from .fake_providers import FakeProvider, Sse, anthropic_frames, openai_frames
from .fake_responses import responses_frames

REPO = Path(__file__).resolve().parents[2]
DEV = [sys.executable, "-m", "plexus.runtime.cli", "dev", "examples.research_team:app"]
DEV += ["--run", "examples.research_team:main"]


def _env() -> dict[str, str]:
    keys = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in keys}
    env["PYTHONPATH"] = str(REPO)
    env["PLEXUS_GATEWAY_PORT"] = "0"  # a free port: tests may run beside a developer's `make run`
    return env


def test_research_team_runs_offline(tmp_path: Path) -> None:
    out = subprocess.run([*DEV, "--once"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("run ") and "(offline (ScriptedModel))" in line for line in lines)
    assert any(line.startswith("run ") and ": completed" in line for line in lines), out.stdout[-3000:]
    assert "usage: 120 tokens of 20000, 8 turns of 30" in lines
    assert any("researcher/jetstream" in line for line in lines)
    assert any("writer/main" in line for line in lines)
    assert any("[planner streams]" in line for line in lines)
    assert any(line.startswith("watch it in a terminal: plexus runs watch run_") for line in lines)
    # The lookup went through the MCP server (the library's text exists only in examples/library_mcp.py).
    assert "MCP server 'library' connected" in out.stdout + out.stderr
    for topic in research_team.TOPICS:
        agent = f"researcher/{topic}"
        assert any(
            agent in line and "tool_call" in line and f"library_lookup {{'topic': '{topic}'}}" in line
            for line in lines
        ), out.stdout[-3000:]
        assert any(agent in line and "tool_result" in line and LIBRARY[topic] in line for line in lines)
    # The writer's answer, read back with run_result(output_type=Report): its fields, printed.
    typed = next(i for i, line in enumerate(lines) if line.startswith("typed report (Report, run run_"))
    assert lines[typed].endswith(": How Plexus keeps agents durable")
    assert lines[typed + 1] == "  summary: Drafted from 2 research notes."
    assert lines[typed + 2 : typed + 4] == [f"  - {LIBRARY[t]}" for t in research_team.TOPICS]
    # The demo starts once the services serve: the dashboard's address comes before the run.
    first_run = next(i for i, line in enumerate(lines) if line.startswith("run "))
    assert any("(dashboard at http://" in line for line in lines[:first_run]), out.stdout[-3000:]


async def test_the_examples_lookup_tool_is_the_library_servers() -> None:
    """The example's `library` is a real stdio MCP server offering `lookup` as `library_lookup`."""
    try:
        tools = await research_team.library.list_tools()
        assert [t.name for t in tools] == ["library_lookup"]
        assert tools[0].schema["required"] == ["topic"]
        result = await research_team.library.call("lookup", {"topic": "leases"})
        assert [c.text for c in result.content] == [LIBRARY["leases"]]  # type: ignore[union-attr]
    finally:
        await close_mcp_connections()


REPORT = research_team.Report(title="T", summary="S", key_points=["a", "b"])


async def _writer_on(model: ModelClient, runtime: Runtime, start_worker: Any, key: str) -> None:
    app = App()
    app.register("writer", lambda _id: LLMAgent(model, system="Write.", output_type=research_team.Report))
    await start_worker(app)
    blocks = [TextBlock(text="notes")]
    report = await runtime.send_message(blocks, AgentId("writer", key), output_type=research_team.Report)
    assert report == REPORT


async def test_the_writers_report_on_openai_is_a_strict_json_schema(
    runtime: Runtime, start_worker: Any
) -> None:
    """The real-provider path: the example's Report goes as a strict response_format and validates."""
    async with FakeProvider(lambda _: Sse(openai_frames(REPORT.model_dump_json()))) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
        await _writer_on(OpenAIChatModel(client, "m"), runtime, start_worker, "o")
    schema = fake.requests[0]["response_format"]["json_schema"]
    assert (schema["name"], schema["strict"], schema["schema"]["additionalProperties"]) == (
        "Report",
        True,
        False,
    )


async def test_the_writers_report_on_the_responses_api_is_a_strict_text_format(
    runtime: Runtime, start_worker: Any
) -> None:
    async with FakeProvider(lambda _: Sse(responses_frames(REPORT.model_dump_json()))) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="k")
        await _writer_on(OpenAIResponsesModel(client, "m"), runtime, start_worker, "r")
    text_format = fake.requests[0]["text"]["format"]
    assert (text_format["type"], text_format["name"], text_format["strict"]) == (
        "json_schema",
        "Report",
        True,
    )
    assert text_format["schema"]["additionalProperties"] is False


def test_the_example_picks_the_openai_api_from_the_environment() -> None:
    pick = research_team.openai_api
    assert pick({"OPENAI_API_KEY": "k"}) == "responses"
    assert pick({"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "https://api.openai.com/v1/"}) == "responses"
    assert pick({"OPENAI_API_KEY": "k", "PLEXUS_OPENAI_API": "chat"}) == "chat"
    assert pick({"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://localhost:11434/v1"}) == "chat"


async def test_the_writers_report_on_anthropic_is_the_forced_output_tool(
    runtime: Runtime, start_worker: Any
) -> None:
    answer = Sse(anthropic_frames(tool_calls=[("toolu_1", OUTPUT_TOOL, REPORT.model_dump_json())]))
    async with FakeProvider(lambda _: answer, base_path="") as fake:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="k")
        await _writer_on(AnthropicModel(client, "claude"), runtime, start_worker, "a")
    (request,) = fake.requests
    assert request["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}
    assert request["tools"][0]["input_schema"]["required"] == ["title", "summary", "key_points"]


async def test_the_writers_report_on_gemini_is_a_json_response_schema(
    runtime: Runtime, start_worker: Any
) -> None:
    async with FakeProvider(lambda _: Sse(gemini_frames(REPORT.model_dump_json())), base_path="") as fake:
        await _writer_on(GeminiModel(gemini_client(fake), "gemini"), runtime, start_worker, "g")
    config = fake.requests[0]["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["required"] == ["title", "summary", "key_points"]


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=sink, stderr=subprocess.STDOUT)


async def test_make_run_keeps_serving_the_dashboard_until_stopped(tmp_path: Path) -> None:
    log = tmp_path / "dev.log"
    proc = _start(DEV, log)
    try:
        async with asyncio.timeout(150):
            while "plexus dev: serving on" not in log.read_text():
                assert proc.poll() is None, log.read_text()[-3000:]
                await asyncio.sleep(0.2)
        text = log.read_text()
        assert ": completed" in text  # the demo ran first
        found = re.search(r"dashboard at (http://[0-9.:]+)/", text)
        assert found is not None, text[-3000:]
        async with httpx.AsyncClient(base_url=found.group(1), timeout=10) as client:
            page = await client.get("/")
            assert page.status_code == 200
            assert "<html" in page.text.lower()
            runs = (await client.get("/v1/runs", params={"roots_only": "true"})).json()["runs"]
            assert [r["status"] for r in runs] == ["completed"]  # the demo's tree, served after it ended
        assert proc.poll() is None  # still serving
        proc.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(proc.wait, 60) == 0
        assert "plexus dev: stopped" in log.read_text()
    finally:
        if proc.poll() is None:  # stopped the way a user does, so it stops its own children too
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.to_thread(proc.wait, 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
