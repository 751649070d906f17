"""The LLM loop's own cost per model turn against the length of the conversation before the message.

``uv run --no-sync python -m bench.llm_history [--rounds N] [--sizes 0,25,50]``: a nats-server, the fake
OpenAI provider of `bench.llm_bench` (once, to record the SDK's parsed chunks of a tool-call answer and of a
final answer), and an in-process worker whose `LLMAgent`s replay those chunks (no HTTP: the loop's own work,
as `bench.llm_components`'s replayed type, `bench.llm_replay`). Each round, for every size ``n``, a new key
gets ``n`` messages (4 items each: question, tool call, tool result, answer) and then the measured one, a
2-turn run; a turn middleware times the measured message's loop iterations. Printed per size: the loop per
turn (p50 over rounds) and the whole message's request/reply. Not part of ``make bench``, not asserted
anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from bench.common import emit_once
from bench.llm_bench import fake_provider, iteration_timer, worker_and_client
from bench.llm_replay import Replay


async def _measure(base_url: str, rounds: int, sizes: list[int]) -> dict[str, float]:
    import openai

    from plexus.core import AgentId, TextBlock
    from plexus.llm import LLMAgent, OpenAIChatModel, tool
    from plexus.runtime import App

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    # Every run of a conversation makes a tool call, and each needs an id of its own.
    replay = Replay(client, fresh_ids=(rounds + 3) * sum(n + 1 for n in sizes) + 1)

    times: dict[tuple[str, str], float] = {}
    app = App()
    app.register("record", lambda _id: LLMAgent(OpenAIChatModel(replay.recording, "m"), tools=[add]))
    app.register(
        "replayed",
        lambda _id: LLMAgent(
            OpenAIChatModel(replay.replaying, "m"), tools=[add], middleware=[iteration_timer(times)]
        ),
    )
    loop: dict[int, list[float]] = {n: [] for n in sizes}
    whole: dict[int, list[float]] = {n: [] for n in sizes}
    async with worker_and_client(app) as (rt, _):
        question = [TextBlock(text="2+3?")]
        await rt.send_message(question, AgentId("record", "once"), timeout=30)  # both answers
        if len(replay.recorded) != 2:
            raise SystemExit(f"expected a tool-call answer and a final one, recorded {len(replay.recorded)}")
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
    emit_once(metrics, {"rounds": args.rounds, "sizes": sizes})


if __name__ == "__main__":
    main()
