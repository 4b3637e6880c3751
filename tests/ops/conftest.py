"""Fixtures for the operations tests: spans captured in memory, a Temporal runtime with a Prometheus
endpoint, and a client carrying both (so the worker built on it is traced and measured)."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.testing import WorkflowEnvironment

from worker.telemetry import build_runtime


class GatedProcessor(SpanProcessor):
    """Forwards finished spans to the in-memory exporter only while a test records: the global
    tracer provider outlives the test, and other tests' spans are none of its business."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self._inner = SimpleSpanProcessor(exporter)
        self._lock = threading.Lock()
        self.armed = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            if self.armed:
                self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@dataclass
class SpanCapture:
    exporter: InMemorySpanExporter
    processor: GatedProcessor

    def start(self) -> None:
        self.exporter.clear()
        self.processor.armed = True

    def stop(self) -> list[ReadableSpan]:
        self.processor.armed = False
        return list(self.exporter.get_finished_spans())


@pytest.fixture(scope="session")
def span_capture() -> SpanCapture:
    """The process's global tracer provider, with an in-memory exporter behind a gate.

    Global because the BMaaS and hub spans use the global tracer, as in production."""
    exporter = InMemorySpanExporter()
    processor = GatedProcessor(exporter)
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another global tracer provider is set"
    provider.add_span_processor(processor)
    return SpanCapture(exporter, processor)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MetricsRuntime:
    runtime: Runtime
    url: str

    def scrape(self) -> str:
        response = httpx.get(self.url, timeout=10.0)
        response.raise_for_status()
        return response.text


@pytest.fixture(scope="session")
def metrics_runtime() -> MetricsRuntime:
    """A runtime serving Prometheus on a free loopback port (retried: a port can be taken between
    the probe and the bind)."""
    last: Exception | None = None
    for _ in range(5):
        port = _free_port()
        try:
            runtime = build_runtime(f"127.0.0.1:{port}")
        except Exception as err:
            last = err
            continue
        assert runtime is not None
        return MetricsRuntime(runtime, f"http://127.0.0.1:{port}/metrics")
    raise RuntimeError(f"could not bind a metrics port: {last}")


@pytest.fixture(scope="session")
async def observed_client(
    temporal_env: WorkflowEnvironment, metrics_runtime: MetricsRuntime, span_capture: SpanCapture
) -> AsyncIterator[Client]:
    """A client on the session's dev server with the tracing interceptor and the metrics runtime."""
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        namespace=temporal_env.client.namespace,
        data_converter=pydantic_data_converter,
        interceptors=[TracingInterceptor()],
        runtime=metrics_runtime.runtime,
    )
    yield client


@pytest.fixture
def recording(span_capture: SpanCapture) -> Iterator[SpanCapture]:
    span_capture.start()
    try:
        yield span_capture
    finally:
        span_capture.processor.armed = False
