"""Process telemetry: the Temporal runtime's Prometheus endpoint and OpenTelemetry tracing.

Metrics: the Temporal Core runtime serves `/metrics` on OSAC_METRICS_BIND (host:port). It carries the
SDK's own metrics (`temporal_*`: task latencies, slots, polls, failures) and the product metrics the
workflows record through `workflow.metric_meter()` (workflows/metrics.py), since a client connected
with that runtime hands it to its workers.

Tracing: configured by the standard OpenTelemetry variables.
- `OTEL_TRACES_EXPORTER`: comma list of `otlp`, `console`, `none`. When unset: `otlp` if an OTLP
  endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`),
  otherwise none, so an unconfigured process never exports to a default address.
- `otlp` needs the optional extra `opentelemetry-exporter-otlp` (`pip install '.[otlp]'`);
  `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` picks `http/protobuf` (default) or `grpc`; endpoint,
  headers, certificates and timeouts are read by the exporter itself.
- `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_BSP_*` work
  as usual; `OTEL_SDK_DISABLED=true` turns tracing off.
With tracing on, `connect()` adds Temporal's `TracingInterceptor` to the client (and so to its
workers): client calls, workflow runs, child workflows, signals and activities become spans, and the
BMaaS and hub calls inside activities are child spans of their activity.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from temporalio.client import Interceptor
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from workflows.metrics import HISTOGRAM_BUCKETS

log = logging.getLogger("osac.telemetry")

DEFAULT_SERVICE_NAME = "osac-workers"


class TracesExporter(StrEnum):
    OTLP = "otlp"
    CONSOLE = "console"
    NONE = "none"


class OtlpProtocol(StrEnum):
    HTTP_PROTOBUF = "http/protobuf"
    GRPC = "grpc"


# ---------------------------------------------------------------------------------------------
# Metrics


def build_runtime(metrics_bind: str | None) -> Runtime | None:
    """A Temporal runtime serving Prometheus metrics on `metrics_bind`, or None (the SDK default)."""
    if not metrics_bind:
        return None
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=metrics_bind,
                # Seconds, like the product histograms, so dashboards need no unit juggling.
                durations_as_seconds=True,
                histogram_bucket_overrides=dict(HISTOGRAM_BUCKETS),
            )
        )
    )


def metrics_url(metrics_bind: str) -> str:
    """Where to scrape a bind address from this host (a wildcard bind is reached on loopback)."""
    host, _, port = metrics_bind.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}/metrics"


# ---------------------------------------------------------------------------------------------
# Tracing


def traces_exporters(environ: Mapping[str, str]) -> list[TracesExporter]:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER")
    if raw is None:
        endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        return [TracesExporter.OTLP] if any(environ.get(name) for name in endpoints) else []
    chosen: list[TracesExporter] = []
    for name in (part.strip().lower() for part in raw.split(",")):
        if not name:
            continue
        try:
            exporter = TracesExporter(name)
        except ValueError:
            log.warning("OTEL_TRACES_EXPORTER: unsupported exporter %r ignored (otlp, console, none)", name)
            continue
        if exporter == TracesExporter.NONE:
            return []
        if exporter not in chosen:
            chosen.append(exporter)
    return chosen


def _otlp_exporter(environ: Mapping[str, str]) -> SpanExporter | None:
    raw = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    try:
        protocol = OtlpProtocol((raw or OtlpProtocol.HTTP_PROTOBUF).strip().lower())
    except ValueError:
        log.warning("OTLP protocol %r unsupported (http/protobuf, grpc): traces are not exported", raw)
        return None
    # Imported by name: the exporter is an optional extra, absent from most installs.
    transport = "grpc" if protocol == OtlpProtocol.GRPC else "http"
    module = f"opentelemetry.exporter.otlp.proto.{transport}.trace_exporter"
    try:
        exporter: SpanExporter = importlib.import_module(module).OTLPSpanExporter()
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER asks for otlp but opentelemetry-exporter-otlp is not installed"
            " (pip install 'osac-baremetal-workers[otlp]'): traces are not exported"
        )
        return None
    return exporter


def span_processors(environ: Mapping[str, str]) -> list[SpanProcessor]:
    processors: list[SpanProcessor] = []
    for kind in traces_exporters(environ):
        if kind == TracesExporter.CONSOLE:
            processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif kind == TracesExporter.OTLP:
            exporter = _otlp_exporter(environ)
            if exporter is not None:
                processors.append(BatchSpanProcessor(exporter))
    return processors


def build_tracer_provider(
    environ: Mapping[str, str], service_name: str = DEFAULT_SERVICE_NAME
) -> TracerProvider | None:
    """A tracer provider exporting as the OTEL_* variables say, or None when nothing is exported."""
    processors = span_processors(environ)
    if not processors:
        return None
    named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; ours is only the fallback.
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": service_name}))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


# ---------------------------------------------------------------------------------------------
# The process's telemetry


@dataclass
class Telemetry:
    runtime: Runtime | None = None
    tracer_provider: TracerProvider | None = None
    metrics_bind: str | None = None
    tracing: bool = False
    _interceptors: list[Interceptor] = field(default_factory=list)

    @property
    def metrics_url(self) -> str | None:
        return metrics_url(self.metrics_bind) if self.metrics_bind else None

    def interceptors(self) -> list[Interceptor]:
        """The client interceptors telemetry needs (workers inherit a client's interceptors)."""
        if self.tracing and not self._interceptors:
            self._interceptors.append(TracingInterceptor())
        return list(self._interceptors)

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.runtime is not None:
            options["runtime"] = self.runtime
        interceptors = self.interceptors()
        if interceptors:
            options["interceptors"] = interceptors
        return options

    def shutdown(self) -> None:
        """Flush buffered spans (the runtime lives until the process ends)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


_process_telemetry: Telemetry | None = None


def setup_telemetry(
    metrics_bind: str | None = None,
    *,
    service_name: str = DEFAULT_SERVICE_NAME,
    environ: Mapping[str, str] | None = None,
) -> Telemetry:
    """Once per process, before `connect()`: the metrics runtime and the global tracer provider.

    `connect()` then uses both by default, so the worker and the controller commands only call this.
    """
    global _process_telemetry
    if _process_telemetry is not None:
        return _process_telemetry
    env = os.environ if environ is None else environ
    provider = build_tracer_provider(env, service_name)
    if provider is not None:
        trace.set_tracer_provider(provider)
    telemetry = Telemetry(
        runtime=build_runtime(metrics_bind),
        tracer_provider=provider,
        metrics_bind=metrics_bind,
        tracing=provider is not None,
    )
    if metrics_bind:
        log.info("Temporal metrics on %s", metrics_url(metrics_bind))
    if provider is not None:
        log.info("tracing to %s", ", ".join(e.value for e in traces_exporters(env)))
    _process_telemetry = telemetry
    return telemetry


def process_telemetry() -> Telemetry | None:
    """What `setup_telemetry` configured in this process, if it ran."""
    return _process_telemetry
