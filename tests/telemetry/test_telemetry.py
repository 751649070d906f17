"""Issue 15, item 4: traces across processes and metrics, wired by configuration only.

A real `plexus worker` process and a client process, both configured by the standard OTLP environment
variables, export to a collector on loopback that speaks OTLP/HTTP (protobuf, decoded with
opentelemetry-proto); the worker also serves Prometheus `/metrics`. The trace of one request must be one
tree across the two processes: client span → send → handle relay → send → handle ledger.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from plexus.core import AgentId, TextBlock
from plexus.runtime import NatsServer, Runtime
from plexus.runtime.kernel import configure_telemetry

REPO = Path(__file__).resolve().parents[2]
APP = "tests.telemetry.app:app"

pytestmark = pytest.mark.timeout(120)


class Collector:
    """Spans and metric names received over OTLP/HTTP, by service name."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.metric_names: dict[str, set[str]] = {}
        self.lock = threading.Lock()

    def take(self, path: str, body: bytes) -> None:
        with self.lock:
            if path == "/v1/traces":
                traces = ExportTraceServiceRequest.FromString(body)
                for rs in traces.resource_spans:
                    service = _service(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            self.spans.append(
                                {
                                    "service": service,
                                    "name": span.name,
                                    "trace": span.trace_id.hex(),
                                    "id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(),
                                }
                            )
            elif path == "/v1/metrics":
                exported = ExportMetricsServiceRequest.FromString(body)
                for rm in exported.resource_metrics:
                    names = self.metric_names.setdefault(_service(rm.resource.attributes), set())
                    for sm in rm.scope_metrics:
                        names.update(m.name for m in sm.metrics)


def _service(attributes: Any) -> str:
    for kv in attributes:
        if kv.key == "service.name":
            return str(kv.value.string_value)
    return ""


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    store = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            store.take(self.path, body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield store, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _client_trace(store: Collector) -> list[dict[str, Any]]:
    """Every span of the trace the client's "client request" span started."""
    root = next(s for s in store.spans if s["name"] == "client request")
    return [s for s in store.spans if s["trace"] == root["trace"]]


def _paths(tree: list[dict[str, Any]]) -> Callable[[dict[str, Any]], list[str]]:
    """span -> its ``service:name`` and those of its ancestors up to the root of `tree`."""
    by_id = {s["id"]: s for s in tree}

    def path_to_root(span: dict[str, Any]) -> list[str]:
        names = [f"{span['service']}:{span['name']}"]
        while span["parent"] in by_id:
            span = by_id[span["parent"]]
            names.append(f"{span['service']}:{span['name']}")
        return names

    return path_to_root


async def _until_hosted(rt: Runtime, agent_type: str) -> None:
    """Until the worker process serves `agent_type`."""
    async with asyncio.timeout(30):
        while not await rt.workers(agent_type):  # noqa: ASYNC110 - another process's state
            await asyncio.sleep(0.1)


async def _run_client(endpoint: str, url: str, *args: str) -> None:
    """`tests.telemetry.client` as its own process, exporting to `endpoint`; it must succeed."""
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.telemetry.client", url, *args, env=_env(endpoint), cwd=REPO
    )
    assert await asyncio.wait_for(client.wait(), 60) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(endpoint: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # spans leave within 0.1 s (default 5 s)
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        **extra,
    }


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _value(text: str, metric: str, **labels: str) -> float:
    """The sample of `metric` whose labels include `labels` (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


async def test_one_trace_across_processes_and_metrics_by_configuration(
    nats_server: NatsServer, tmp_path: Path, collector: tuple[Collector, str]
) -> None:
    store, endpoint = collector
    metrics_port = _free_port()
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(  # noqa: ASYNC220 - test setup: the worker must be a real process
        [sys.executable, "-m", "plexus.runtime.cli", "worker", APP, "--nats", nats_server.url],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(endpoint, PLEXUS_METRICS_PORT=str(metrics_port)),
        cwd=REPO,
    )
    try:
        rt = await Runtime.connect(nats_server.url)
        try:
            await _until_hosted(rt, "relay")
            for _ in range(3):
                await rt.send_message([TextBlock(text="x")], AgentId("ledger", "m"), timeout=30)
        finally:
            await rt.close()
        await _run_client(endpoint, nats_server.url, "t1")

        metrics = await asyncio.to_thread(_scrape, metrics_port)
        assert _value(metrics, "plexus_messages_total", agent_type="ledger", outcome="ok") == 4.0
        assert _value(metrics, "plexus_messages_total", agent_type="relay", outcome="ok") == 1.0
        assert _value(metrics, "plexus_handler_duration_seconds_count", agent_type="ledger") == 4.0
        assert _value(metrics, "plexus_activations", agent_type="ledger") == 2.0  # keys m and t1

        async with asyncio.timeout(20):  # the worker's batch of spans and a metrics export arrive
            while not (  # noqa: ASYNC110 - filled by the collector's thread
                any(
                    s["name"] == "plexus.handle ledger" and s["service"] == "plexus-worker"
                    for s in store.spans
                )
                and "plexus.messages" in store.metric_names.get("plexus-worker", set())
            ):
                await asyncio.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()

    tree = _client_trace(store)
    path_to_root = _paths(tree)

    leaf = next(s for s in tree if s["name"] == "plexus.handle ledger")
    assert path_to_root(leaf) == [
        "plexus-worker:plexus.handle ledger",
        "plexus-worker:plexus.send ledger",
        "plexus-worker:plexus.handle relay",
        "telemetry-test-client:plexus.send relay",
        "telemetry-test-client:client request",
    ]
    assert {"plexus.handler.duration", "plexus.activations"} <= store.metric_names["plexus-worker"]


def test_nothing_is_installed_without_configuration() -> None:
    telemetry = configure_telemetry("idle", env={})
    assert (telemetry.tracing, telemetry.prometheus_port, telemetry.otlp_metrics) == (False, None, False)


def test_a_bad_metrics_port_is_refused() -> None:
    with pytest.raises(ValueError, match="PLEXUS_METRICS_PORT must be a TCP port"):
        configure_telemetry("bad", env={"PLEXUS_METRICS_PORT": "http"})


_EXPORT_ALL = """
import re, sys, urllib.request
from plexus.runtime.kernel import INSTRUMENTS, configure_telemetry
configure_telemetry("names", env={"PLEXUS_METRICS_PORT": sys.argv[1]})
for instrument in vars(INSTRUMENTS).values():  # every instrument Plexus has, whatever its kind
    if hasattr(instrument, "add"):
        instrument.add(1, {"k": "v"})
    else:
        instrument.record(0.1, {"k": "v"})
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(" ".join(sorted({m.group(1) for m in re.finditer(r"^(plexus_[a-z_]+)", text, re.M)})))
"""


def test_the_grafana_dashboard_queries_only_metrics_plexus_exports() -> None:
    """docs/grafana/plexus.json must not chart a metric that no longer exists (or was renamed)."""
    import json
    import re

    done = subprocess.run(
        [sys.executable, "-c", _EXPORT_ALL, str(_free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    exported = set(done.stdout.split())
    dashboard = json.loads((REPO / "docs" / "grafana" / "plexus.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"plexus_[a-z_]+", target["expr"])
    }
    assert len(dashboard["panels"]) >= 8
    assert queried - exported == set(), exported


def _render(tree: list[dict[str, Any]]) -> str:
    """The trace as an indented list of `service: span` lines, children under their parents."""
    children: dict[str, list[dict[str, Any]]] = {}
    for span in tree:
        children.setdefault(span["parent"], []).append(span)
    ids = {s["id"] for s in tree}
    lines: list[str] = []

    def walk(span: dict[str, Any], depth: int) -> None:
        lines.append(f"{'  ' * depth}{span['service']}: {span['name']}")
        for child in children.get(span["id"], []):
            walk(child, depth + 1)

    for top in [s for s in tree if s["parent"] not in ids]:
        walk(top, 0)
    return "\n".join(lines)


async def test_a_run_tree_is_one_trace_through_the_orchestrator(
    nats_server: NatsServer, tmp_path: Path, collector: tuple[Collector, str]
) -> None:
    """client → orchestrator start → decision → root handler → spawn request → orchestrator spawn →
    decision → child's inbox → child handler → its end reported → orchestrator finished → decision."""
    store, endpoint = collector
    procs = []
    try:
        for name, argv in (
            ("orchestrator", ["orchestrator", "--nats", nats_server.url]),
            ("worker", ["worker", APP, "--nats", nats_server.url]),
        ):
            procs.append(
                subprocess.Popen(  # noqa: ASYNC220 - test setup: real processes
                    [sys.executable, "-m", "plexus.runtime.cli", *argv],
                    stdout=(tmp_path / f"{name}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                    env=_env(endpoint),
                    cwd=REPO,
                )
            )
        rt = await Runtime.connect(nats_server.url)
        try:
            await _until_hosted(rt, "lead")
        finally:
            await rt.close()
        await _run_client(endpoint, nats_server.url, "tree1", "tree")

        def decided(name: str) -> int:
            return sum(s["name"] == f"plexus.decision {name}" for s in store.spans)

        async with asyncio.timeout(20):  # the orchestrator's and the worker's span batches arrive
            while not (  # noqa: ASYNC110 - filled by the collector's thread
                decided("completed") == 2 and any(s["name"] == "plexus.handle ledger" for s in store.spans)
            ):
                await asyncio.sleep(0.1)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)

    tree = _client_trace(store)
    path_to_root = _paths(tree)
    print("\n" + _render(tree))

    child = next(s for s in tree if s["name"] == "plexus.handle ledger")
    assert path_to_root(child) == [
        "plexus-worker:plexus.handle ledger",
        "plexus-worker:plexus.send ledger",
        "plexus-worker:plexus.handle lead",
        "plexus-orchestrator:plexus.orchestrator start",
        "telemetry-test-client:plexus.orchestrator.call start",
        "telemetry-test-client:client request",
    ]
    spawned = next(s for s in tree if s["name"] == "plexus.decision spawned")
    assert path_to_root(spawned)[:4] == [
        "plexus-orchestrator:plexus.decision spawned",
        "plexus-orchestrator:plexus.orchestrator spawn",
        "plexus-worker:plexus.orchestrator.call spawn",
        "plexus-worker:plexus.handle lead",
    ]
    completed = [path_to_root(s) for s in tree if s["name"] == "plexus.decision completed"]
    # Both runs' ends are decisions in the trace: the child's reported from inside the root's handler,
    # the root's after its handler returned.
    assert len(completed) == 2, _render(tree)
    assert all(p[1] == "plexus-orchestrator:plexus.orchestrator finished" for p in completed)
