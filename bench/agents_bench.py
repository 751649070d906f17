"""A peer measured as `bench.llm_bench` measures Plexus: the OpenAI Agents SDK's loop overhead per model turn.

Run by ``make bench`` with the interpreter of ``.bench-venv/openai-agents`` (the SDK is never a dependency of
Plexus): ``.bench-venv/openai-agents/bin/python -m bench.agents_bench [--runs N]``. The same fake OpenAI
provider (keep-alive, its own process) answers the same 2-turn conversation: a streamed run
(``Runner.run_streamed``, every event read) of an agent with one sync function tool, ``add``, makes 2 model
calls and 1 tool call, as a Plexus run does. The SDK's tracing is off (it would export to OpenAI).

Rounds as in `bench.llm_bench`: a bare pair (the two request bodies this SDK sends, recorded from one run and
replayed through ``AsyncOpenAI.chat.completions.create(stream=True)``), a run, a second bare pair, each
after 5 ms of idle; overhead per turn = p50 over rounds of (run - bare pair) / 2. The run is in-process, so
its whole time is what Plexus's "inside the handler" compares with. Prints a table and one ``RESULT <json>``
line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from bench.llm_bench import PAUSE_S, _Rounds, fake_provider


async def _measure(base_url: str, runs: int) -> dict[str, float]:
    import openai
    from agents import (  # type: ignore[import-not-found,unused-ignore]
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    create = client.chat.completions.create
    bodies: list[dict[str, Any]] = []
    recording = [True]

    async def recording_create(**body: Any) -> Any:
        if recording[0]:
            bodies.append(body)
        return await create(**body)

    client.chat.completions.create = recording_create  # type: ignore[method-assign]

    @function_tool  # type: ignore[untyped-decorator,unused-ignore]
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    agent = Agent(
        name="bench", model=OpenAIChatCompletionsModel(model="m", openai_client=client), tools=[add]
    )

    async def run() -> None:
        result = Runner.run_streamed(agent, "2+3?")
        async for _ in result.stream_events():
            pass
        if result.final_output != "The answer is 5.":
            raise SystemExit(f"unexpected answer {result.final_output!r}")

    await run()
    recording[0] = False
    if len(bodies) != 2:
        raise SystemExit(f"expected a run of 2 model calls, recorded {len(bodies)}")

    async def bare_pair() -> tuple[float, float]:
        await asyncio.sleep(PAUSE_S)
        t0, c0 = time.perf_counter(), time.process_time()
        for body in bodies:
            stream = await create(**body)
            async for _ in stream:
                pass
        return time.perf_counter() - t0, time.process_time() - c0

    rounds = _Rounds()
    for i in range(20 + runs):
        bare, bare_cpu = await bare_pair()
        await asyncio.sleep(PAUSE_S)
        t0, c0 = time.perf_counter(), time.process_time()
        await run()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        again, _ = await bare_pair()
        if i >= 20:
            rounds.bare.append(bare)
            rounds.bare_cpu.append(bare_cpu)
            rounds.run.append(wall)
            rounds.run_cpu.append(cpu)
            rounds.loop.append(wall)  # in-process: the whole run is the loop
            rounds.bare_again.append(again)
    metrics = rounds.metrics("peer.agents.")
    del metrics["peer.agents.overhead_per_turn.p50_ms"]  # the same as the loop's: one figure
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    with fake_provider() as base_url:
        metrics = asyncio.run(_measure(base_url, args.runs))
    for name, value in metrics.items():
        print(f"{name:<44} {value:8.2f}")
    result = {
        "metrics": {
            k: {"unit": "×" if k.endswith("ratio") else "ms", "values": [v]} for k, v in metrics.items()
        },
        "info": {"runs": args.runs},
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
