"""What parts of the LLM loop cost, measured in pairs inside one process (immune to the machine's phases).

``uv run --no-sync python -m bench.llm_components [--runs N]``: a nats-server, the fake OpenAI provider of
`bench.llm_bench` in its own process, one in-process worker, and agent types that differ from the bench's LLM
run (2 model turns + 1 sync tool, journaled) in one thing each. Each round sends one message to every type,
in an order that rotates, each to a new key; a turn middleware times each run's loop iterations. A
component's cost is the p50 over rounds of (baseline − variant), halved: per model turn.

Why pairs: on the shared 2-core machine the same code's figures move by a factor of two between minutes
(docs/llm.md), while two variants measured in the same round see the same phase. Printed as a table and
one ``RESULT <json>`` line; not part of ``make bench``, not asserted anywhere.

One more type measures the loop directly rather than by a difference: its model client replays the chunks the
SDK parsed from the fake for the same two requests (recorded once, before the rounds), so its loop iterations
are Plexus's own work per turn (progress, deltas, journal and its waits, usage, the tool step) with the HTTP
call and the SDK's request and response handling left out.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench.common import emit_once
from bench.llm_bench import fake_provider, iteration_timer, worker_and_client
from bench.llm_replay import Replay

#: variant -> what it leaves out of the baseline (the component whose cost it measures)
VARIANTS = {
    "no-journal": "the journal (its writes and the waits for them)",
    "async-tool": "running the sync tool in a thread (the same tool as async def)",
}


async def _measure(base_url: str, runs: int) -> dict[str, float]:
    import openai

    from plexus.core import AgentId, TextBlock
    from plexus.llm import LLMAgent, OpenAIChatModel, tool
    from plexus.runtime import App

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool(name="add")
    async def add_async(a: int, b: int) -> int:
        """Add."""
        return a + b

    times: dict[tuple[str, str], float] = {}
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    timing = [iteration_timer(times)]
    app = App()
    app.register(
        "baseline", lambda _id: LLMAgent(OpenAIChatModel(client, "m"), tools=[add], middleware=timing)
    )
    app.register(
        "no-journal",
        lambda _id: LLMAgent(OpenAIChatModel(client, "m"), tools=[add], middleware=timing, journal=False),
    )
    app.register(
        "async-tool", lambda _id: LLMAgent(OpenAIChatModel(client, "m"), tools=[add_async], middleware=timing)
    )
    # Chunks as the SDK parsed them, per request shape (the first call of a run, the one after the tool).
    replay = Replay(client)
    app.register("record", lambda _id: LLMAgent(OpenAIChatModel(replay.recording, "m"), tools=[add]))
    app.register(
        "replayed",
        lambda _id: LLMAgent(OpenAIChatModel(replay.replaying, "m"), tools=[add], middleware=timing),
    )
    types = ["baseline", *VARIANTS, "replayed"]
    async with worker_and_client(app) as (rt, _):
        await rt.send_message([TextBlock(text="2+3?")], AgentId("record", "once"), timeout=30)
        if len(replay.recorded) != 2:
            raise SystemExit(f"expected a run of 2 distinct model calls, recorded {len(replay.recorded)}")
        for i in range(runs + 20):  # the first 20 rounds warm up (connections, caches)
            for type_ in types[i % len(types) :] + types[: i % len(types)]:
                await rt.send_message([TextBlock(text="2+3?")], AgentId(type_, f"r{i}"), timeout=30)
    rounds = range(20, runs + 20)
    metrics = {
        "llm.loop_2turns.p50_ms": statistics.median(times[("baseline", f"r{i}")] for i in rounds) * 1e3
    }
    metrics["llm.loop_alone_per_turn.p50_ms"] = (
        statistics.median(times[("replayed", f"r{i}")] for i in rounds) / 2 * 1e3
    )
    for variant in VARIANTS:
        diffs = [times[("baseline", f"r{i}")] - times[(variant, f"r{i}")] for i in rounds]
        metrics[f"llm.cost_per_turn.{variant}.p50_ms"] = statistics.median(diffs) / 2 * 1e3
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=300, help="measured rounds (one run of every type each)")
    args = parser.parse_args()
    with fake_provider() as base_url:
        metrics = asyncio.run(_measure(base_url, args.runs))
    print(f"loop iterations of a 2-turn run, p50: {metrics['llm.loop_2turns.p50_ms']:.2f} ms")
    print(
        "per model turn, the loop alone (the SDK's calls replayed from recorded chunks): "
        f"{metrics['llm.loop_alone_per_turn.p50_ms']:.3f} ms"
    )
    for variant, what in VARIANTS.items():
        print(f"per model turn, {what}: {metrics[f'llm.cost_per_turn.{variant}.p50_ms']:.3f} ms")
    emit_once(metrics, {"runs": args.runs})


if __name__ == "__main__":
    main()
