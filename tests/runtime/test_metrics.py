"""`MetricsInterceptor` in a real worker on a real nats-server, read in process through an OpenTelemetry SDK
`InMemoryMetricReader`: ``plexus.budget.tokens`` (Prometheus ``plexus_budget_tokens_total``) counts the tokens
a handler charges with ``ctx.usage``, once per call, next to ``plexus.messages`` from the handle chain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from plexus.core import AgentId, BaseBlock, BudgetExhaustedError, ExecutionBudget, TextBlock, Usage
from plexus.runtime import Agent, App, Context, Interceptor, Runtime, UsageInput, new_root_run
from plexus.runtime.ops import _telemetry

from .apps_misc import DEADLINE
from .conftest import StartWorker


@pytest.fixture(scope="module")
def meter_provider() -> MeterProvider:
    """The process's SDK meter provider: the global one can be set once per process, so reuse an SDK
    provider another module installed, else install one. Plexus's instruments are created at import through
    the API's proxy meter, so they report to it even though it comes later."""
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider())
    provider = metrics.get_meter_provider()
    if not isinstance(provider, MeterProvider):
        pytest.skip("a non-SDK global meter provider is installed; metrics cannot be read here")
    return provider


@pytest.fixture
def reader(meter_provider: MeterProvider, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryMetricReader]:
    """A reader of this test's measurements only (a reader sees what is recorded after it is added), with
    recording switched on as `configure_telemetry` does when it installs an exporter."""
    memory = InMemoryMetricReader()
    meter_provider.add_metric_reader(memory)
    monkeypatch.setattr(_telemetry, "_enabled", True)
    try:
        yield memory
    finally:
        meter_provider.remove_metric_reader(memory)


def points(reader: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
    """The data points of metric `name` (OpenTelemetry name), by their sorted attributes."""
    data = reader.get_metrics_data()
    found: dict[tuple[tuple[str, Any], ...], Any] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        found[tuple(sorted((point.attributes or {}).items()))] = point
    return found


async def handled(reader: InMemoryMetricReader, agent_type: str, count: int) -> None:
    """Until ``plexus.messages`` counts `count` ok messages of `agent_type` (recorded as the handle chain
    unwinds, which may be just after the reply reached the client)."""
    key = (("agent_type", agent_type), ("outcome", "ok"))
    deadline = time.monotonic() + DEADLINE
    while (point := points(reader, "plexus.messages").get(key)) is None or point.value < count:
        if time.monotonic() > deadline:
            pytest.fail(f"plexus.messages never counted {count} for {agent_type}: {point}")
        await asyncio.sleep(0.02)


class Spender(Agent):
    """Charges 30 + 12 tokens as a model call would (`Usage`), then 5 more as plain totals."""

    async def on_message(self, blocks: list[BaseBlock], ctx: Context) -> list[BaseBlock]:
        await ctx.usage(Usage(input_tokens=30, output_tokens=12), turns=1)
        await ctx.usage(tokens=5)
        return [TextBlock(text="spent")]


def budget_tokens(reader: InMemoryMetricReader) -> dict[tuple[tuple[str, Any], ...], int]:
    return {k: int(p.value) for k, p in points(reader, "plexus.budget.tokens").items()}


async def test_tokens_a_handler_charges_are_counted_by_agent_type(
    runtime: Runtime, start_worker: StartWorker, reader: InMemoryMetricReader
) -> None:
    app = App()
    app.register("spender", lambda _id: Spender())
    await start_worker(app)
    for key in ("a", "b"):
        reply = await runtime.send_message([TextBlock(text="go")], AgentId("spender", key), timeout=20)
        assert [getattr(b, "text", "") for b in reply] == ["spent"]
    await handled(reader, "spender", 2)  # the reader sees the worker's metrics: the handle chain's
    # Each usage call recorded once: 2 messages x (42 + 5) tokens.
    assert budget_tokens(reader) == {(("agent_type", "spender"),): 94}


async def test_an_apps_usage_interceptor_runs_and_the_metric_counts_what_it_charges(
    runtime: Runtime, start_worker: StartWorker, reader: InMemoryMetricReader
) -> None:
    """The app's interceptors still see every usage call, in the app's order; the metric is recorded once per
    call, after them, so it counts the usage that reached the run tree (here halved by the first one)."""
    seen: list[tuple[str, int]] = []

    class Halve(Interceptor):
        async def usage(self, inp: UsageInput, call_next: Any) -> None:
            seen.append(("halve", inp.usage.total_tokens))
            half = Usage(input_tokens=inp.usage.input_tokens // 2, output_tokens=inp.usage.output_tokens // 2)
            await call_next(replace(inp, usage=half))

    class Look(Interceptor):
        async def usage(self, inp: UsageInput, call_next: Any) -> None:
            seen.append(("look", inp.usage.total_tokens))
            await call_next(inp)

    app = App(interceptors=[Halve(), Look()])
    app.register("spender", lambda _id: Spender())
    await start_worker(app)
    await runtime.send_message([TextBlock(text="go")], AgentId("spender", "k"), timeout=20)
    await handled(reader, "spender", 1)
    assert seen == [("halve", 42), ("look", 21), ("halve", 5), ("look", 2)]
    assert budget_tokens(reader) == {(("agent_type", "spender"),): 23}


async def test_nothing_is_recorded_without_an_exporter(
    runtime: Runtime, start_worker: StartWorker, reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_telemetry, "_enabled", False)
    app = App()
    app.register("spender", lambda _id: Spender())
    await start_worker(app)
    await runtime.send_message([TextBlock(text="go")], AgentId("spender", "k"), timeout=20)
    await asyncio.sleep(0.2)
    assert budget_tokens(reader) == {}
    assert points(reader, "plexus.messages") == {}


async def test_the_call_that_exhausts_the_budget_is_counted_too(
    runtime: Runtime, start_worker: StartWorker, reader: InMemoryMetricReader
) -> None:
    """The tokens of the call that crosses the run's budget were charged before it was refused: the metric
    counts them (it once recorded only calls that returned)."""
    app = App()
    app.register("spender", lambda _id: Spender())
    await start_worker(app)
    with pytest.raises(BudgetExhaustedError):
        await runtime.send_message(
            [TextBlock(text="go")],
            AgentId("spender", "k"),
            timeout=20,
            run=new_root_run(budget=ExecutionBudget(max_tokens=40)),
        )
    deadline = time.monotonic() + DEADLINE
    while not budget_tokens(reader):  # recorded as the chain unwinds, maybe just after the reply
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert budget_tokens(reader) == {(("agent_type", "spender"),): 42}  # the first call, refused at 42 > 40
