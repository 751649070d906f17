"""Loop overhead of `plexus.llm.LLMAgent` per model turn, against a fake OpenAI provider on loopback.

``uv run --no-sync python -m bench.llm_bench [--runs N]``: starts a nats-server, the fake provider in its own
process (so its CPU is not counted; it keeps connections alive, as real providers do), and an in-process
worker. A Plexus run is one message to an `LLMAgent` making 2 model turns + 1 tool call (journaled, budget
consumed, deltas and progress published); the bare baseline is
``AsyncOpenAI.chat.completions.create(stream=True)`` with the very request bodies one Plexus run sends
(recorded, then replayed: tools and conversation included), reading every chunk.

Measured in rounds: a bare pair (the run's two requests, bare), then a Plexus run, then a second bare pair,
each after `PAUSE_S` of idle (what the previous one left behind is done by then). Each figure is the p50 over
rounds of that round's difference, so the two sides always see the same phase of the machine; the second
bare pair against the first is the method's own bias (the null control, ≈ 0 when the order favours
neither side). Per model turn:

- overhead, whole run = (run - bare pair) / 2: the message's request/reply through NATS, the new key's
  activation and its commit (EventLog + checkpoint) included, amortised over the two turns;
- overhead inside the handler = (the run's loop iterations - bare pair) / 2: a turn middleware (the public
  `Middleware.process_turn`) times each iteration (model step with its progress, deltas, journal write and
  budget consume; the first also runs the tool step) — the peers' runs (in-process function calls) compare
  with this one; also as a ratio to one bare call;
- CPU = (run CPU - bare pair CPU) / 2 (process CPU, means over rounds);
- the floor (journaled runs only): the same rounds for `bench.llm_floor.Floor`, the run's durable work
  hand-written on nats-py and the SDK with no framework (``llm.floor.*``), and the ratio of the two figures
  inside the handler: what the machine allows, beside what Plexus takes; for orchestrated runs the floor
  consumes its budget on a counter stream (``llm.orchestrated.floor.*``).

The same in orchestrated runs (``start_run`` with a token budget, the real orchestrator on the same server:
every model call's ``ctx.usage()`` is a counter increment on the server, the budget consume the issue's
goal includes); ``--no-orchestrator`` skips them. The plain rounds run once more over
`OpenAIResponsesModel` (``llm.responses.*``: a reasoning turn with a call, then the answer, against the bare
``responses.create`` pair of the same two bodies); ``--no-responses`` skips them. ``--no-journal`` measures
the loop without its journal writes. Prints a table and one ``RESULT <json>`` line (bench/common.py
protocol). Not asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.common import emit_once

REPO = Path(__file__).resolve().parents[1]


async def _serve() -> None:
    from tests.llm.fake_providers import FakeProvider, Sse, openai_frames
    from tests.llm.fake_responses import Reasoning, responses_frames

    reasoning = Reasoning(["Add the two numbers."], "ENC" * 200, id="rs_bench")

    def respond(body: dict[str, Any]) -> Sse:
        if "input" in body:  # the Responses API: a reasoning turn with a call, then the answer
            if any(i.get("type") == "function_call_output" for i in body["input"]):
                return Sse(responses_frames("The answer is 5."))
            return Sse(
                responses_frames("Adding.", [("call_1", "add", '{"a": 2, "b": 3}')], reasoning=reasoning)
            )
        if any(m["role"] == "tool" for m in body["messages"]):
            return Sse(openai_frames("The answer is 5."))
        return Sse(openai_frames("Adding.", [("call_1", "add", '{"a": 2, "b": 3}')]))

    # Keep-alive, as the real providers: every call of a run, bare or not, reuses the pooled connection.
    async with FakeProvider(respond, keep_alive=True) as fake:
        print(f"READY {fake.base_url}", flush=True)
        await asyncio.Event().wait()


#: Idle before every measured part of a round: the previous part's after-work (acks, the pull of the next
#: message, the orchestrator's bookkeeping) is over, and each part starts from the same state.
PAUSE_S = 0.005


@dataclasses.dataclass
class Rounds:
    """Per round: the first bare pair, the Plexus run and its loop iterations, the second bare pair (wall
    seconds), and CPU seconds of the first bare pair and of the run."""

    bare: list[float] = dataclasses.field(default_factory=list)
    run: list[float] = dataclasses.field(default_factory=list)
    loop: list[float] = dataclasses.field(default_factory=list)
    bare_again: list[float] = dataclasses.field(default_factory=list)
    bare_cpu: list[float] = dataclasses.field(default_factory=list)
    run_cpu: list[float] = dataclasses.field(default_factory=list)

    def metrics(self, prefix: str) -> dict[str, float]:
        def per_turn(a: list[float], b: list[float]) -> float:
            return statistics.median(x - y for x, y in zip(a, b, strict=True)) / 2 * 1e3

        bare_call = statistics.median(self.bare) / 2 * 1e3
        loop = per_turn(self.loop, self.bare)
        return {
            f"{prefix}bare_call.p50_ms": bare_call,
            f"{prefix}bare_call.cpu_ms": statistics.mean(self.bare_cpu) / 2 * 1e3,
            f"{prefix}run_2turns.p50_ms": statistics.median(self.run) * 1e3,
            f"{prefix}run_2turns.cpu_ms": statistics.mean(self.run_cpu) * 1e3,
            f"{prefix}overhead_per_turn.p50_ms": per_turn(self.run, self.bare),
            f"{prefix}loop_overhead_per_turn.p50_ms": loop,
            f"{prefix}loop_overhead_ratio": loop / bare_call,
            f"{prefix}cpu_per_turn_ms": (statistics.mean(self.run_cpu) - statistics.mean(self.bare_cpu))
            / 2
            * 1e3,
            f"{prefix}null_control_per_call.p50_ms": per_turn(self.bare_again, self.bare),
        }


def bare_pair(create: Any, bodies: list[dict[str, Any]]) -> Callable[[], Awaitable[tuple[float, float]]]:
    """A bare pair: ``bodies`` sent through ``create`` (``chat.completions.create``) one after the other,
    every chunk read, after `PAUSE_S` of idle; (wall, CPU) seconds."""

    async def pair() -> tuple[float, float]:
        await asyncio.sleep(PAUSE_S)
        t0, c0 = time.perf_counter(), time.process_time()
        for body in bodies:
            stream = await create(**body)
            async for _ in stream:
                pass
        return time.perf_counter() - t0, time.process_time() - c0

    return pair


async def measure_rounds(
    runs: int,
    pair: Callable[[], Awaitable[tuple[float, float]]],
    run: Callable[[int], Awaitable[object]],
    loop_time: Callable[[int], float] | None = None,
) -> Rounds:
    """`runs` rounds (after 20 that warm up) of: ``pair()``, ``run(i)``, ``pair()``, each after `PAUSE_S`
    of idle. ``loop_time(i)``: the part of run ``i`` that is the loop (default: all of it)."""
    rounds = Rounds()
    for i in range(20 + runs):
        bare, bare_cpu = await pair()
        await asyncio.sleep(PAUSE_S)
        t0, c0 = time.perf_counter(), time.process_time()
        await run(i)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        again, _ = await pair()
        if i >= 20:
            rounds.bare.append(bare)
            rounds.bare_cpu.append(bare_cpu)
            rounds.run.append(wall)
            rounds.run_cpu.append(cpu)
            rounds.loop.append(wall if loop_time is None else loop_time(i))
            rounds.bare_again.append(again)
    return rounds


async def _responses_metrics(
    rt: Any, client: Any, bodies: list[dict[str, Any]], runs: int, times: dict[tuple[str, str], float]
) -> dict[str, float]:
    """The plain rounds again over `OpenAIResponsesModel` (``llm.responses.*``): its run beside the bare
    ``responses.create`` pair replaying the two request bodies one run sent (reasoning item included)."""
    from plexus.core import AgentId, TextBlock

    await rt.send_message([TextBlock(text="2+3?")], AgentId("record_responses", "once"), timeout=30)
    if len(bodies) != 2:
        raise SystemExit(f"expected a responses run of 2 model calls, recorded {len(bodies)}")

    async def run(i: int) -> None:
        await rt.send_message([TextBlock(text="2+3?")], AgentId("bench_responses", f"k{i}"), timeout=30)

    pair = bare_pair(client.responses.create, bodies)
    rounds = await measure_rounds(runs, pair, run, lambda i: times[("bench_responses", f"k{i}")])
    return rounds.metrics("llm.responses.")


def _register_responses(
    app: Any, client: Any, bodies: list[dict[str, Any]], journal: bool, timing: list[Any]
) -> None:
    """Agent types ``bench_responses`` (timed) and ``record_responses`` (its SDK calls' bodies recorded)."""
    from plexus.llm import LLMAgent, OpenAIResponsesModel

    async def recording_create(**body: Any) -> Any:
        bodies.append(body)
        return await client.responses.create(**body)

    recorder: Any = SimpleNamespace(responses=SimpleNamespace(create=recording_create))
    tools = [_add_tool()]
    app.register(
        "bench_responses",
        lambda _id: LLMAgent(
            OpenAIResponsesModel(client, "m"), tools=tools, journal=journal, middleware=timing
        ),
    )
    app.register(
        "record_responses",
        lambda _id: LLMAgent(OpenAIResponsesModel(recorder, "m"), tools=tools, journal=journal),
    )


def _add_tool() -> Any:
    """The bench's one tool (its schema is part of every request body)."""
    from plexus.llm import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    return add


def register_recorder(app: Any, client: Any, bodies: list[dict[str, Any]], journal: bool = True) -> None:
    """Register agent type ``record`` on ``app``: the bench's LLMAgent, whose SDK calls append their request
    bodies to ``bodies``. The baseline is the same SDK work the loop does: the two requests of a run, byte for
    byte (tools and the growing conversation included), recorded from one Plexus run (`record_run`) and
    replayed bare. A bare call with a shorter body would count the SDK's own request/response handling of the
    longer one as our overhead."""
    from plexus.llm import LLMAgent, OpenAIChatModel

    async def recording_create(**body: Any) -> Any:
        bodies.append(body)
        return await client.chat.completions.create(**body)

    recorder = client_with(recording_create)
    tools = [_add_tool()]
    app.register("record", lambda _id: LLMAgent(OpenAIChatModel(recorder, "m"), tools=tools, journal=journal))


async def record_run(rt: Any, bodies: list[dict[str, Any]]) -> None:
    """One run of the ``record`` type (`register_recorder`): ``bodies`` then holds its two requests."""
    from plexus.core import AgentId, TextBlock

    await rt.send_message([TextBlock(text="2+3?")], AgentId("record", "once"), timeout=30)
    if len(bodies) != 2:
        raise SystemExit(f"expected a run of 2 model calls, recorded {len(bodies)}")


async def _measure(
    base_url: str,
    runs: int,
    journal: bool,
    nats_url: str | None,
    orchestrated: bool = True,
    responses: bool = True,
) -> dict[str, float]:
    import openai

    from plexus.core import AgentId, ExecutionBudget, TextBlock
    from plexus.llm import LLMAgent, OpenAIChatModel
    from plexus.runtime import App

    add = _add_tool()
    iteration_times: dict[tuple[str, str], float] = {}
    timing = [iteration_timer(iteration_times)]

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    bodies: list[dict[str, Any]] = []
    app = App()
    app.register(
        "bench",
        lambda _id: LLMAgent(OpenAIChatModel(client, "m"), tools=[add], journal=journal, middleware=timing),
    )
    register_recorder(app, client, bodies, journal)
    responses_bodies: list[dict[str, Any]] = []
    _register_responses(app, client, responses_bodies, journal, timing)
    async with worker_and_client(app, nats_url) as (rt, url):
        await record_run(rt, bodies)

        pair = bare_pair(client.chat.completions.create, bodies)

        async def plain_run(i: int) -> None:
            await rt.send_message([TextBlock(text="2+3?")], AgentId("bench", f"k{i}"), timeout=30)

        rounds = await measure_rounds(runs, pair, plain_run, lambda i: iteration_times[("bench", f"k{i}")])
        metrics = rounds.metrics("llm.")
        if journal:
            # The same durable work hand-written on nats-py (bench/llm_floor.py), same process and rounds.
            metrics.update(await _floor_metrics(url, runs, pair, client, bodies, metrics, orchestrated=False))
        if responses:
            metrics.update(await _responses_metrics(rt, client, responses_bodies, runs, iteration_times))
        if orchestrated:
            with _orchestrator(url):
                budget = ExecutionBudget(max_tokens=10**12)

                async def orchestrated_run(i: int) -> None:
                    run_id = await rt.start_run(
                        AgentId("bench", f"o{i}"), [TextBlock(text="2+3?")], budget=budget
                    )
                    await rt.run_result(run_id, timeout=30)

                rounds = await measure_rounds(
                    runs, pair, orchestrated_run, lambda i: iteration_times[("bench", f"o{i}")]
                )
                metrics.update(rounds.metrics("llm.orchestrated."))
                if journal:  # the floor again, its budget consumed on the server as an orchestrated run's is
                    floor = await _floor_metrics(url, runs, pair, client, bodies, metrics, orchestrated=True)
                    metrics.update(floor)
    return metrics


async def _floor_metrics(
    url: str,
    runs: int,
    pair: Any,
    client: Any,
    bodies: list[dict[str, Any]],
    plexus: dict[str, float],
    *,
    orchestrated: bool,
) -> dict[str, float]:
    """`bench.llm_floor.Floor` in the same kind of rounds (``orchestrated``: its budget on the server's
    counters), as ``llm[.orchestrated].floor.*``, and Plexus's figure inside the handler (from ``plexus``)
    ÷ the floor's."""
    prefix = "llm.orchestrated." if orchestrated else "llm."
    import nats

    from bench.llm_floor import Floor  # here: the peers' venvs import this module without msgspec

    nc = await nats.connect(url)
    try:
        floor = Floor(
            nc,
            client.chat.completions.create,
            bodies,
            lambda a, b: a + b,
            counters=orchestrated,
            name="o" if orchestrated else "k",
        )
        await floor.start()
        rounds = await measure_rounds(runs, pair, floor.run, lambda i: floor.loop_times[i])
    finally:
        await nc.close()
    metrics = rounds.metrics(f"{prefix}floor.")
    floor_loop = metrics[f"{prefix}floor.loop_overhead_per_turn.p50_ms"]
    if floor_loop > 0:
        plexus_loop = plexus[f"{prefix}loop_overhead_per_turn.p50_ms"]
        metrics[f"{prefix}loop_overhead_floor_ratio"] = plexus_loop / floor_loop
    return metrics


@contextlib.asynccontextmanager
async def worker_and_client(app: Any, nats_url: str | None = None) -> AsyncIterator[tuple[Any, str]]:
    """A nats-server of its own (unless ``nats_url``), an in-process worker serving ``app`` and a client
    ``Runtime``, until the block ends; (the client, the server's URL)."""
    from plexus.runtime import NatsServer, Runtime, Worker, WorkerConfig

    server = None if nats_url else NatsServer()
    if server is not None:
        server.start()
    url = nats_url or (server.url if server is not None else "")
    try:
        wrt = await Runtime.connect(url)
        worker = Worker(app, wrt, WorkerConfig())
        await worker.start()
        rt = await Runtime.connect(url)
        try:
            yield rt, url
        finally:
            await rt.close()
            await worker.stop(drain_timeout=5)
            await wrt.close()
    finally:
        if server is not None:
            server.stop()


def client_with(create: Callable[..., Awaitable[Any]]) -> Any:
    """What `OpenAIChatModel` uses of an ``AsyncOpenAI`` client, with ``chat.completions.create`` = ``create``
    (a recording or replaying stand-in for the real call)."""
    return SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))


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
    parser.add_argument("--no-responses", action="store_true", help="skip the Responses API runs")
    parser.add_argument("--url", help="an existing nats-server (default: start one)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    with fake_provider() as base_url:
        metrics = asyncio.run(
            _measure(
                base_url,
                args.runs,
                not args.no_journal,
                args.url,
                not args.no_orchestrator,
                not args.no_responses,
            )
        )
    for name, value in metrics.items():
        print(f"{name:<32} {value:8.2f}")
    emit_once(
        metrics, {"runs": args.runs, "journal": not args.no_journal, "orchestrated": not args.no_orchestrator}
    )


if __name__ == "__main__":
    main()
