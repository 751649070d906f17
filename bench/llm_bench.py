"""Loop overhead of `plexus.llm.LLMAgent` per model turn, against a fake OpenAI provider on loopback.

``uv run --no-sync python -m bench.llm_bench [--runs N]``: starts a nats-server, the fake provider in its own
process (so its CPU is not counted), and an in-process worker. It measures, sequentially:

- the bare SDK call: ``AsyncOpenAI.chat.completions.create(stream=True)`` with the very request bodies one
  Plexus run sends (recorded, then replayed: tools and conversation included) and reading every chunk (p50
  wall time, CPU per call);
- a Plexus run of 2 model turns + 1 tool call (a message to an `LLMAgent`, journaled, budget consumed,
  deltas and progress published), p50 wall time and CPU per run.

Overhead per turn = (run p50 - 2 x bare-call p50) / 2; CPU per turn = (run CPU - 2 x bare-call CPU) / 2.
Both include the message's own request/reply through NATS, the new key's activation and its commit (EventLog
+ checkpoint), amortised over the two turns. The loop alone, inside the handler: a turn middleware (the
public `Middleware.process_turn`) times each of the run's two iterations (model step with its progress,
deltas, journal write and budget consume; the first also runs the tool step), and overhead per turn in the
loop = (p50 of the iterations' sum per run - 2 x bare-call p50) / 2 — the peers' runs (in-process function
calls) compare with this one. The same loop in orchestrated runs (``start_run`` with a token budget, the
orchestrator on the same server): there every model call's ``ctx.usage()`` is a counter increment on the
server, the budget consume the issue's goal includes; ``--no-orchestrator`` skips it.
``--no-journal`` measures the loop without its journal writes. Prints a
table and one ``RESULT <json>`` line (bench/common.py protocol). Not asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]


async def _serve() -> None:
    from tests.llm.fake_providers import FakeProvider, Sse, openai_frames

    def respond(body: dict[str, Any]) -> Sse:
        if any(m["role"] == "tool" for m in body["messages"]):
            return Sse(openai_frames("The answer is 5."))
        return Sse(openai_frames("Adding.", [("call_1", "add", '{"a": 2, "b": 3}')]))

    async with FakeProvider(respond) as fake:
        print(f"READY {fake.base_url}", flush=True)
        await asyncio.Event().wait()


async def _measure(
    base_url: str, runs: int, journal: bool, nats_url: str | None, orchestrated: bool = True
) -> dict[str, float]:
    import openai

    from plexus.core import AgentId, ExecutionBudget, TextBlock
    from plexus.llm import LLMAgent, OpenAIChatModel, tool
    from plexus.runtime import App, NatsServer, Runtime, Worker, WorkerConfig

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    iteration_times: dict[tuple[str, str], float] = {}
    timing = [iteration_timer(iteration_times)]

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    # The baseline is the same SDK work the loop does: the two requests of a run, byte for byte (tools and
    # the growing conversation included), recorded from one Plexus run and replayed bare. A bare call with
    # a shorter body would count the SDK's own request/response handling of the longer one as our overhead.
    bodies: list[dict[str, Any]] = []

    async def recording_create(**body: Any) -> Any:
        bodies.append(body)
        return await client.chat.completions.create(**body)

    recorder: Any = SimpleNamespace(
        chat=SimpleNamespace(completions=SimpleNamespace(create=recording_create))
    )

    async def bare(body: dict[str, Any]) -> None:
        stream = await client.chat.completions.create(**body)
        async for _ in stream:
            pass

    server = None if nats_url else NatsServer()
    if server is not None:
        server.start()
    url = nats_url or (server.url if server is not None else "")
    try:
        app = App()
        app.register(
            "bench",
            lambda _id: LLMAgent(
                OpenAIChatModel(client, "m"), tools=[add], journal=journal, middleware=timing
            ),
        )
        app.register(
            "record", lambda _id: LLMAgent(OpenAIChatModel(recorder, "m"), tools=[add], journal=journal)
        )
        wrt = await Runtime.connect(url)
        worker = Worker(app, wrt, WorkerConfig())
        await worker.start()
        rt = await Runtime.connect(url)
        try:
            await rt.send_message([TextBlock(text="2+3?")], AgentId("record", "once"), timeout=30)
            if len(bodies) != 2:
                raise SystemExit(f"expected a run of 2 model calls, recorded {len(bodies)}")
            for _ in range(10):
                for body in bodies:
                    await bare(body)
            bare_wall: list[float] = []
            cpu0 = time.process_time()
            for _ in range(runs):
                for body in bodies:
                    t0 = time.perf_counter()
                    await bare(body)
                    bare_wall.append(time.perf_counter() - t0)
            bare_cpu = (time.process_time() - cpu0) / (runs * 2)

            async def one(i: int) -> None:
                await rt.send_message([TextBlock(text="2+3?")], AgentId("bench", f"k{i}"), timeout=30)

            for i in range(20):
                await one(i)
            run_wall: list[float] = []
            cpu0 = time.process_time()
            for i in range(runs):
                t0 = time.perf_counter()
                await one(1000 + i)
                run_wall.append(time.perf_counter() - t0)
            run_cpu = (time.process_time() - cpu0) / runs
            orch_wall: list[float] = []
            if orchestrated:
                with _orchestrator(url):
                    budget = ExecutionBudget(max_tokens=10**12)

                    async def orchestrated_run(i: int) -> None:
                        run_id = await rt.start_run(
                            AgentId("bench", f"o{i}"), [TextBlock(text="2+3?")], budget=budget
                        )
                        await rt.run_result(run_id, timeout=30)

                    for i in range(20):
                        await orchestrated_run(i)
                    for i in range(runs):
                        t0 = time.perf_counter()
                        await orchestrated_run(1000 + i)
                        orch_wall.append(time.perf_counter() - t0)
        finally:
            await rt.close()
            await worker.stop(drain_timeout=5)
            await wrt.close()
    finally:
        if server is not None:
            server.stop()
    bare_p50 = statistics.median(bare_wall)
    run_p50 = statistics.median(run_wall)
    loop_p50 = statistics.median(iteration_times[("bench", f"k{1000 + i}")] for i in range(runs))
    metrics = {
        "llm.bare_call.p50_ms": bare_p50 * 1e3,
        "llm.bare_call.cpu_ms": bare_cpu * 1e3,
        "llm.run_2turns.p50_ms": run_p50 * 1e3,
        "llm.run_2turns.cpu_ms": run_cpu * 1e3,
        "llm.overhead_per_turn.p50_ms": (run_p50 - 2 * bare_p50) / 2 * 1e3,
        "llm.loop_overhead_per_turn.p50_ms": (loop_p50 - 2 * bare_p50) / 2 * 1e3,
        "llm.cpu_per_turn_ms": (run_cpu - 2 * bare_cpu) / 2 * 1e3,
    }
    if orch_wall:
        orch_loop = statistics.median(iteration_times[("bench", f"o{1000 + i}")] for i in range(runs))
        metrics["llm.orchestrated.overhead_per_turn.p50_ms"] = (
            (statistics.median(orch_wall) - 2 * bare_p50) / 2 * 1e3
        )
        metrics["llm.orchestrated.loop_overhead_per_turn.p50_ms"] = (orch_loop - 2 * bare_p50) / 2 * 1e3
    return metrics


def iteration_timer(times: dict[tuple[str, str], float]) -> Any:
    """A turn middleware summing the wall time of each run's loop iterations into ``times``, by (agent type,
    key): each run goes to a key of its own."""
    from plexus.llm import Middleware

    class TimeIterations(Middleware):
        async def process_turn(self, context: Any, call_next: Any) -> None:
            t0 = time.perf_counter()
            try:
                await call_next(context)
            finally:
                agent = (context.ctx.agent_id.type, context.ctx.agent_id.key)
                times[agent] = times.get(agent, 0.0) + time.perf_counter() - t0

    return TimeIterations()


@contextlib.contextmanager
def fake_provider() -> Iterator[str]:
    """The fake OpenAI provider in its own process (its CPU is not ours) until the block ends; its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.llm_bench", "--serve"], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise SystemExit(f"fake provider did not start: {line}")
        yield line[1]
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def _orchestrator(url: str) -> Iterator[None]:
    """The real orchestrator service, as `plexus orchestrator` runs it, until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "plexus.runtime.cli", "orchestrator", "--nats", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # it announces itself once its endpoints are up
            if line.startswith("plexus orchestrator "):
                break
        else:
            raise SystemExit("orchestrator exited before it was ready")
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--no-journal", action="store_true", help="measure without the per-step journal")
    parser.add_argument("--no-orchestrator", action="store_true", help="skip the orchestrated runs")
    parser.add_argument("--url", help="an existing nats-server (default: start one)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    with fake_provider() as base_url:
        metrics = asyncio.run(
            _measure(base_url, args.runs, not args.no_journal, args.url, not args.no_orchestrator)
        )
    for name, value in metrics.items():
        print(f"{name:<32} {value:8.2f}")
    result = {
        "metrics": {k: {"unit": "ms", "values": [v]} for k, v in metrics.items()},
        "info": {"runs": args.runs, "journal": not args.no_journal, "orchestrated": not args.no_orchestrator},
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
