"""OpenTelemetry by configuration: traces and metrics exported when the environment asks for them.

`configure_telemetry(service)` is called by every Plexus command at start-up:

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the standard variable; also ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
  ``..._METRICS_ENDPOINT``): spans and metrics go to that collector over OTLP/HTTP (batch span processor,
  metrics every ``OTEL_METRIC_EXPORT_INTERVAL`` ms, default 60 s);
- ``PLEXUS_METRICS_PORT``: a Prometheus ``/metrics`` endpoint on that port (``PLEXUS_METRICS_HOST``,
  default ``127.0.0.1``; ``0.0.0.0`` in a container).

Nothing set: nothing is installed and the instruments below are the OpenTelemetry API's no-ops. The
instruments are created at import through the API's proxy meter, so they report to whichever provider is
installed later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, propagate, trace

from ._settings import SettingsError

__all__ = ["INSTRUMENTS", "Telemetry", "configure_telemetry", "metrics_enabled", "trace_headers"]

_meter = metrics.get_meter("plexus")


class _Instruments:
    """Every Plexus instrument; docs/operations.md lists their Prometheus names and what each panel shows."""

    def __init__(self) -> None:
        m = _meter
        self.messages = m.create_counter(
            "plexus.messages", "{message}", "messages handled, by agent type and outcome"
        )
        self.handler_duration = m.create_histogram(
            "plexus.handler.duration", "s", "handler run time, by agent type"
        )
        self.redeliveries = m.create_counter(
            "plexus.redeliveries", "{message}", "durable messages delivered more than once"
        )
        self.dead_letters = m.create_counter(
            "plexus.dead_letters", "{message}", "messages dead-lettered, by reason"
        )
        self.activations = m.create_up_down_counter(
            "plexus.activations", "{activation}", "live agent activations, by type"
        )
        self.partitions_owned = m.create_up_down_counter(
            "plexus.partitions.owned", "{partition}", "inbox partitions owned, by type and worker"
        )
        self.tree_tokens = m.create_histogram(
            "plexus.run_tree.tokens", "{token}", "tokens a run tree used, at its end"
        )
        self.budget_used = m.create_histogram(
            "plexus.run_tree.budget_used",
            "1",
            "share of its ExecutionBudget a run tree used, at its end, by dimension",
        )
        self.decisions = m.create_counter(
            "plexus.orchestrator.decisions", "{decision}", "orchestrator decisions, by kind"
        )
        self.budget_tokens = m.create_counter(
            "plexus.budget.tokens", "{token}", "tokens charged to run trees, by agent type"
        )


INSTRUMENTS = _Instruments()
_enabled = False


def trace_headers() -> dict[str, str]:
    """The current trace context as NATS headers (W3C ``traceparent``...); empty when there is none."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def metrics_enabled() -> bool:
    """Whether a metrics exporter is installed (hot paths skip recording otherwise)."""
    return _enabled


@dataclass
class Telemetry:
    """What `configure_telemetry` installed; `shutdown()` flushes it."""

    tracing: bool = False
    prometheus_port: int | None = None
    otlp_metrics: bool = False
    _providers: list[Any] = field(default_factory=list)

    def shutdown(self) -> None:
        for provider in self._providers:
            provider.shutdown()


def configure_telemetry(service: str, env: Mapping[str, str] | None = None) -> Telemetry:
    """Install span and metric exporters as the environment asks (see the module docstring)."""
    global _enabled
    env = os.environ if env is None else env
    out = Telemetry()
    otlp = any(
        env.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    )
    port = env.get("PLEXUS_METRICS_PORT")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"PLEXUS_METRICS_PORT must be a TCP port, got {port!r}")
    if not otlp and port is None:
        return out
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": service})
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(tracer_provider)
        out.tracing = True
        out._providers.append(tracer_provider)
    readers: list[Any] = []
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        out.otlp_metrics = True
    if port is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        host = env.get("PLEXUS_METRICS_HOST", "127.0.0.1")
        try:
            start_http_server(int(port), addr=host)
        except OSError as exc:  # a taken port: one line naming it, not a traceback
            raise SettingsError(
                f"the metrics endpoint cannot listen on {host}:{port}: {exc.strerror or exc}"
                " ($PLEXUS_METRICS_PORT)"
            ) from None
        readers.append(PrometheusMetricReader())
        out.prometheus_port = int(port)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    metrics.set_meter_provider(meter_provider)
    out._providers.append(meter_provider)
    _enabled = True
    return out
