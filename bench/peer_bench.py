"""Peers measured as `bench.llm_bench` measures Plexus: their loop overhead per model turn.

Run by ``make bench`` with the interpreter of each peer's own venv (never a dependency of Plexus):
``.bench-venv/<peer>/bin/python -m bench.peer_bench --peer <peer> [--runs N]`` (`PEERS`). The same
fake OpenAI provider (keep-alive, its own process) answers the same 2-turn conversation: a streamed run of an
agent with one sync tool, ``add``, makes 2 model calls and 1 tool call, as a Plexus run does (every peer, like
Plexus, runs a sync tool in a thread).

Rounds as in `bench.llm_bench`: a bare pair (the two request bodies this peer sends, recorded from one run and
replayed through ``AsyncOpenAI.chat.completions.create(stream=True)``), a run, a second bare pair, each
after 5 ms of idle; overhead per turn = p50 over rounds of (run - bare pair) / 2. The run is in-process, so
its whole time is what Plexus's "inside the handler" compares with. Prints a table and one ``RESULT <json>``
line.
"""

from __future__ import annotations

import argparse
import asyncio
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import emit_once
from bench.llm_bench import bare_pair, fake_provider, measure_rounds


async def _openai_agents(client: Any) -> Callable[[], Awaitable[str]]:
    """The OpenAI Agents SDK: ``Runner.run_streamed``, every event read; tracing off (it would export)."""
    from agents import (  # type: ignore[import-not-found,unused-ignore]
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)

    @function_tool  # type: ignore[untyped-decorator,unused-ignore]
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    agent = Agent(
        name="bench", model=OpenAIChatCompletionsModel(model="m", openai_client=client), tools=[add]
    )

    async def run() -> str:
        result = Runner.run_streamed(agent, "2+3?")
        async for _ in result.stream_events():
            pass
        return str(result.final_output)

    return run


async def _pydantic_ai(client: Any) -> Callable[[], Awaitable[str]]:
    """pydantic-ai: ``Agent.run_stream_events``, every event of the run read (``run_stream`` would end at the
    first turn's text, before its tool call)."""
    from pydantic_ai import Agent  # type: ignore[import-not-found,unused-ignore]
    from pydantic_ai.models.openai import OpenAIChatModel  # type: ignore[import-not-found,unused-ignore]
    from pydantic_ai.providers.openai import OpenAIProvider  # type: ignore[import-not-found,unused-ignore]

    agent = Agent(OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client)))

    @agent.tool_plain  # type: ignore[untyped-decorator,unused-ignore]
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    async def run() -> str:
        output = None
        async with agent.run_stream_events("2+3?") as events:
            async for event in events:
                output = getattr(getattr(event, "result", None), "output", output)
        return str(output)

    return run


async def _langgraph(client: Any) -> Callable[[], Awaitable[str]]:
    """LangGraph: the prebuilt ReAct agent over langchain-openai's ``ChatOpenAI`` (streaming), every message
    chunk read (``stream_mode="messages"``)."""
    from langchain_core.tools import tool  # type: ignore[import-not-found,unused-ignore]
    from langchain_openai import ChatOpenAI  # type: ignore[import-not-found,unused-ignore]

    # LangGraph 1.x's own prebuilt agent; its import warns that it moves to `langchain.agents` in LangGraph 2.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent  # type: ignore[import-not-found,unused-ignore]

    @tool  # type: ignore[untyped-decorator,unused-ignore]
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    model = ChatOpenAI(
        model="m", api_key="bench", base_url=str(client.base_url), streaming=True, max_retries=0
    )
    # Its own AsyncOpenAI, pointed at the recording one: every request goes through the same wrapper.
    model.async_client = client.chat.completions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(model, [add])

    async def run() -> str:
        texts: dict[str, str] = {}  # message id -> its text, in order: the last is the answer
        async for chunk, _meta in graph.astream({"messages": [("user", "2+3?")]}, stream_mode="messages"):
            if getattr(chunk, "type", "") == "AIMessageChunk" and chunk.content:
                texts[chunk.id] = texts.get(chunk.id, "") + chunk.content
        return list(texts.values())[-1] if texts else ""

    return run


#: peer -> (what builds its run, the prefix of its metrics)
PEERS: dict[str, tuple[Callable[[Any], Awaitable[Callable[[], Awaitable[str]]]], str]] = {
    "openai-agents": (_openai_agents, "peer.agents."),
    "pydantic-ai": (_pydantic_ai, "peer.pydantic_ai."),
    "langgraph": (_langgraph, "peer.langgraph."),
}


async def _measure(base_url: str, runs: int, peer: str) -> dict[str, float]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    create = client.chat.completions.create
    bodies: list[dict[str, Any]] = []
    recording = [True]

    async def recording_create(**body: Any) -> Any:
        if recording[0]:
            bodies.append(body)
        return await create(**body)

    client.chat.completions.create = recording_create  # type: ignore[method-assign]
    build, prefix = PEERS[peer]
    run = await build(client)
    answer = await run()
    recording[0] = False
    if len(bodies) != 2 or answer != "The answer is 5.":
        raise SystemExit(f"expected a run of 2 model calls, recorded {len(bodies)}, answer {answer!r}")

    async def one(_i: int) -> None:
        await run()

    rounds = await measure_rounds(runs, bare_pair(create, bodies), one)
    metrics = rounds.metrics(prefix)
    del metrics[f"{prefix}overhead_per_turn.p50_ms"]  # the same as the loop's: one figure
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    with fake_provider() as base_url:
        metrics = asyncio.run(_measure(base_url, args.runs, args.peer))
    for name, value in metrics.items():
        print(f"{name:<44} {value:8.2f}")
    emit_once(metrics, {"runs": args.runs, "peer": args.peer})


if __name__ == "__main__":
    main()
