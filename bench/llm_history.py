"""The LLM loop's own cost per model turn against the length of the conversation before the message.

``uv run --no-sync python -m bench.llm_history [--rounds N] [--sizes 0,25,50]``: a nats-server, the fake
OpenAI provider of `bench.llm_bench` (once, to record the SDK's parsed chunks of a tool-call answer and of a
final answer), and an in-process worker whose `LLMAgent`s replay those chunks (no HTTP: the loop's own work,
as `bench.llm_components`'s replayed type). Each round, for every size ``n``, a new key gets ``n`` messages (4
items each: question, tool call, tool result, answer) and then the measured one, a 2-turn run; a turn
middleware times the measured message's loop iterations. Printed per size: the loop per turn (p50 over rounds)
and the whole message's request/reply. Not part of ``make bench``, not asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from bench.llm_bench import client_with, fake_provider, iteration_timer


async def _measure(base_url: str, rounds: int, sizes: list[int]) -> dict[str, float]:
    import openai

    from plexus.core import AgentId, TextBlock
    from plexus.llm import LLMAgent, OpenAIChatModel, tool
    from plexus.runtime import App, NatsServer, Runtime, Worker, WorkerConfig

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    recorded: dict[bool, list[Any]] = {}  # after a tool result? -> the chunks the SDK parsed
    calls = iter(range(1, 10**9))

    def answers_tool(body: dict[str, Any]) -> bool:
        return bool(body["messages"][-1]["role"] == "tool")

    async def record(**body: Any) -> AsyncIterator[Any]:
        recorded[answers_tool(body)] = [c async for c in await client.chat.completions.create(**body)]
        return await replay(**body)

    async def replay(**body: Any) -> AsyncIterator[Any]:
        chunks = []
        for chunk in recorded[answers_tool(body)]:
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and delta.tool_calls and delta.tool_calls[0].id:
                # Every call of a conversation needs an id of its own (a repeated one is refused).
                chunk = chunk.model_copy(deep=True)
                chunk.choices[0].delta.tool_calls[0].id = f"call_{next(calls)}"
            chunks.append(chunk)

        async def stream() -> AsyncIterator[Any]:
            for chunk in chunks:
                yield chunk

        return stream()

    times: dict[tuple[str, str], float] = {}
    app = App()
    app.register("record", lambda _id: LLMAgent(OpenAIChatModel(client_with(record), "m"), tools=[add]))
    app.register(
        "replayed",
        lambda _id: LLMAgent(
            OpenAIChatModel(client_with(replay), "m"), tools=[add], middleware=[iteration_timer(times)]
        ),
    )
    server = NatsServer()
    server.start()
    loop: dict[int, list[float]] = {n: [] for n in sizes}
    whole: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        wrt = await Runtime.connect(server.url)
        worker = Worker(app, wrt, WorkerConfig())
        await worker.start()
        rt = await Runtime.connect(server.url)
        try:
            question = [TextBlock(text="2+3?")]
            await rt.send_message(question, AgentId("record", "once"), timeout=30)  # both answers
            if len(recorded) != 2:
                raise SystemExit(f"expected a tool-call answer and a final one, recorded {len(recorded)}")
            for i in range(rounds + 3):  # the first 3 rounds warm up
                for n in sizes:
                    key = f"n{n}-r{i}"
                    for _ in range(n):
                        await rt.send_message(question, AgentId("replayed", key), timeout=30)
                    times.pop(("replayed", key), None)
                    t0 = time.perf_counter()
                    await rt.send_message(question, AgentId("replayed", key), timeout=30)
                    if i >= 3:
                        whole[n].append(time.perf_counter() - t0)
                        loop[n].append(times[("replayed", key)] / 2)
        finally:
            await rt.close()
            await worker.stop(drain_timeout=5)
            await wrt.close()
    finally:
        server.stop()
    metrics: dict[str, float] = {}
    for n in sizes:
        metrics[f"llm.history_{4 * n}.loop_per_turn.p50_ms"] = statistics.median(loop[n]) * 1e3
        metrics[f"llm.history_{4 * n}.message.p50_ms"] = statistics.median(whole[n]) * 1e3
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sizes", default="0,25,50", help="messages of history before the measured one")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with fake_provider() as base_url:
        metrics = asyncio.run(_measure(base_url, args.rounds, sizes))
    for n in sizes:
        per_turn = metrics[f"llm.history_{4 * n}.loop_per_turn.p50_ms"]
        message = metrics[f"llm.history_{4 * n}.message.p50_ms"]
        print(
            f"{4 * n:4d} items of history: the loop {per_turn:.3f} ms per turn, the message {message:.2f} ms"
        )
    result = {
        "metrics": {k: {"unit": "ms", "values": [v]} for k, v in metrics.items()},
        "info": {"rounds": args.rounds, "sizes": sizes},
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
