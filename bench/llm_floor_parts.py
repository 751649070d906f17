"""What the LLM loop's floor (`bench.llm_floor.Floor`) is made of.

``python -m bench.llm_floor_parts [--runs N]``: the floor, and the floor with one part left out
(``leave_out``: the journal, the progress events, the tool's thread), in the rounds of `bench.llm_bench`, one
after the other in one process. Printed, with one ``RESULT <json>`` line; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.common import emit_once
from bench.llm_bench import (
    bare_pair,
    fake_provider,
    measure_rounds,
    record_run,
    register_recorder,
    worker_and_client,
)
from bench.llm_floor import PARTS, Floor


async def _parts(base_url: str, runs: int) -> dict[str, float]:
    """The floor per model turn inside the handler, whole and each part's share (the floor without it,
    subtracted from the whole)."""
    import nats
    import openai

    from plexus.runtime import App

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    bodies: list[dict[str, Any]] = []
    app = App()
    register_recorder(app, client, bodies)
    figures: dict[str, float] = {}
    async with worker_and_client(app) as (rt, url):
        await record_run(rt, bodies)
        nc = await nats.connect(url)
        try:
            pair = bare_pair(client.chat.completions.create, bodies)
            for variant in ("none", *PARTS):
                floor = Floor(
                    nc,
                    client.chat.completions.create,
                    bodies,
                    lambda a, b: a + b,
                    name=f"{variant}-",
                    leave_out=() if variant == "none" else (variant,),
                )
                await floor.start()
                rounds = await measure_rounds(runs, pair, floor.run, floor.loop_times.__getitem__)
                figures[variant] = rounds.metrics("")["loop_overhead_per_turn.p50_ms"]
        finally:
            await nc.close()
    result = {"llm.floor.loop_overhead_per_turn.p50_ms": figures["none"]}
    for part in PARTS:
        result[f"llm.floor.{part}_per_turn.p50_ms"] = figures["none"] - figures[part]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=150, help="measured rounds per variant")
    args = parser.parse_args()
    with fake_provider() as base_url:
        metrics = asyncio.run(_parts(base_url, args.runs))
    whole = metrics["llm.floor.loop_overhead_per_turn.p50_ms"]
    print(f"the floor, per model turn inside the handler: {whole:.3f} ms")
    for part in PARTS:
        print(f"  of which {part}: {metrics[f'llm.floor.{part}_per_turn.p50_ms']:.3f} ms")
    emit_once(metrics, {"runs": args.runs})


if __name__ == "__main__":
    main()
