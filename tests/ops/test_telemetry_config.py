"""Telemetry configuration from the environment, the health probe server, the CLI entry points, and
settings checked when they load."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import httpx
import pytest
import typer
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from pydantic import ValidationError
from typer.testing import CliRunner

import worker.telemetry as telemetry
from worker.cli import codec_app, worker_command
from worker.codec import KeyRing
from worker.health import serve_health, split_bind
from worker.settings import ConfigError, Settings, load_settings
from worker.telemetry import (
    TracesExporter,
    build_runtime,
    build_tracer_provider,
    metrics_url,
    setup_telemetry,
    span_processors,
    traces_exporters,
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


OTLP_INSTALLED = _installed("opentelemetry.exporter.otlp.proto.http.trace_exporter")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, [TracesExporter.OTLP]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, [TracesExporter.OTLP]),
        ({"OTEL_TRACES_EXPORTER": "console"}, [TracesExporter.CONSOLE]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console,otlp"}, [TracesExporter.OTLP, TracesExporter.CONSOLE]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, []),
        ({"OTEL_TRACES_EXPORTER": "console,none"}, []),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, []),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_traces_exporters_follow_the_standard_variables(environ: dict[str, str], expected: list) -> None:
    assert traces_exporters(environ) == expected


def test_tracer_provider_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    assert build_tracer_provider({}) is None
    provider = build_tracer_provider({"OTEL_TRACES_EXPORTER": "console"}, service_name="svc-a")
    assert provider is not None and provider.resource.attributes["service.name"] == "svc-a"
    provider.shutdown()
    processors = span_processors({"OTEL_TRACES_EXPORTER": "console"})
    assert [type(p) for p in processors] == [SimpleSpanProcessor]

    caplog.set_level(logging.WARNING, logger="osac.telemetry")
    otlp = span_processors({"OTEL_TRACES_EXPORTER": "otlp"})
    if OTLP_INSTALLED:
        assert [type(p) for p in otlp] == [BatchSpanProcessor]
        for processor in otlp:
            processor.shutdown()
    else:
        # Without the optional extra, nothing is exported and the operator is told why.
        assert otlp == []
        assert "opentelemetry-exporter-otlp is not installed" in caplog.text
    caplog.clear()
    assert (
        span_processors({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})
        == []
    )
    assert "unsupported" in caplog.text


def test_setup_telemetry_without_configuration_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_process_telemetry", None)
    configured = setup_telemetry(None, environ={})
    assert configured.runtime is None and configured.tracer_provider is None and not configured.tracing
    assert configured.client_options() == {}
    assert telemetry.process_telemetry() is configured
    assert setup_telemetry("127.0.0.1:1", environ={}) is configured  # once per process


def test_metrics_bind_addresses() -> None:
    assert build_runtime(None) is None and build_runtime("") is None
    assert metrics_url("0.0.0.0:9464") == "http://127.0.0.1:9464/metrics"
    assert metrics_url(":9464") == "http://127.0.0.1:9464/metrics"
    assert metrics_url("10.1.2.3:9000") == "http://10.1.2.3:9000/metrics"
    assert split_bind("0.0.0.0:8081") == ("0.0.0.0", 8081)
    assert split_bind("[::1]:8081") == ("::1", 8081)
    with pytest.raises(ValueError):
        split_bind("8081x")


async def test_health_server_answers_probes() -> None:
    state = {"live": True, "ready": False}

    def broken() -> bool:
        raise RuntimeError("probe bug")

    async with serve_health("127.0.0.1:0", lambda: state["live"], lambda: state["ready"]) as server:
        assert server is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5.0) as http:
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/readyz")).status_code == 503
            state["ready"] = True
            assert (await http.get("/readyz")).status_code == 200
            assert (await http.head("/readyz")).status_code == 200
            state["live"] = False
            assert (await http.get("/healthz")).status_code == 503
            assert (await http.get("/metrics")).status_code == 404
            assert (await http.post("/healthz")).status_code == 404
    async with serve_health(None, broken, broken) as nothing:
        assert nothing is None
    async with serve_health("127.0.0.1:0", broken, broken) as server:
        assert server is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5.0) as http:
            assert (await http.get("/healthz")).status_code == 503


def test_codec_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    generated = runner.invoke(codec_app, ["keygen", "2025-06"])
    assert generated.exit_code == 0
    assert KeyRing.parse(generated.stdout.strip()).encode_key_id == "2025-06"
    assert runner.invoke(codec_app, ["keygen", "bad id"]).exit_code == 2
    for name in ("OSAC_CODEC_KEYS", "OSAC_CODEC_KEYS_FILE"):
        monkeypatch.delenv(name, raising=False)
    refused = runner.invoke(codec_app, ["serve", "--bind", "127.0.0.1:0"])
    assert refused.exit_code == 2 and "no codec keys" in refused.output


@pytest.mark.parametrize("content", [None, "k1=not-base64!!"], ids=["missing", "malformed"])
def test_a_bad_codec_keys_file_is_exit_2_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None
) -> None:
    """Not a FileNotFoundError traceback and exit 1, in the worker and the codec server alike."""
    keys_file = tmp_path / "codec-keys"
    if content is not None:
        keys_file.write_text(content)
    monkeypatch.delenv("OSAC_CODEC_KEYS", raising=False)
    monkeypatch.setenv("OSAC_CODEC_KEYS_FILE", str(keys_file))
    monkeypatch.setenv("OSAC_TEMPORAL_CONNECT_SECONDS", "0")  # never wait for a Temporal
    monkeypatch.setattr(telemetry, "_process_telemetry", None)  # the worker sets it up, once a process
    worker_app = typer.Typer()
    worker_app.command()(worker_command)
    for app, args in ((worker_app, []), (codec_app, ["serve", "--bind", "127.0.0.1:0"])):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit), result.exception
        assert f"OSAC_CODEC_KEYS_FILE={keys_file}" in result.output
        assert "not-base64" not in result.output  # key material is never shown


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("OSAC_HEALTH_BIND", "0.0.0.0:99999", "port 99999 is above 65535"),
        ("OSAC_HEALTH_BIND", "localhost", "expected host:port"),
        ("OSAC_METRICS_BIND", "metrics.local:9464", "expected ip:port"),
    ],
)
def test_bind_addresses_are_checked_when_the_settings_load(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, problem: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=problem):
        Settings()
    monkeypatch.setenv(variable, "[::1]:9464")
    assert getattr(Settings(), variable.removeprefix("OSAC_").lower()) == "[::1]:9464"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("host:8000", "expected an http:// or https:// URL"),
        ("127.0.0.1:8100", "expected an http:// or https:// URL"),
        ("fulfillment.example.com", "expected an http:// or https:// URL"),
        ("ftp://fulfillment.example.com", "expected an http:// or https:// URL"),
        ("https://", "no host"),
        ("https://:8100", "no host"),
        ("http://127.0.0.1:99999", "not a URL"),
        ("https://fulfillment.example.com?tenant=a", "query"),
        ("https://x/api/private/v1", "without /api/private/v1"),
        ("https://x/api/private/v1/", "without /api/private/v1"),
        ("https://x/api/private", "without /api/private/v1"),
        ("https://gw.example.com/fulfillment/api/private/v1/baremetal_instances", "without /api/private/v1"),
    ],
)
def test_the_fulfillment_url_is_checked_when_the_settings_load(
    monkeypatch: pytest.MonkeyPatch, url: str, problem: str
) -> None:
    """Without a scheme every BMaaS call failed (httpx UnsupportedProtocol); with the API's path every
    call 404ed (the client appends /api/private/v1/... itself)."""
    monkeypatch.setenv("OSAC_FULFILLMENT_URL", url)
    with pytest.raises(ConfigError) as err:
        load_settings(Settings)
    (line,) = err.value.problems
    assert line.startswith("OSAC_FULFILLMENT_URL: ") and problem in line
    # Echoed, unless it has a query or fragment (a token may ride in one).
    assert (repr(url) in line) is ("?" not in url), line


def test_a_fulfillment_url_with_credentials_is_refused_without_echoing_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for url in (
        "https://robot:s3cret-pass@fulfillment.example.com",
        "https://robot:s3cret/pass@fulfillment.example.com",  # a '/' in a token ends the netloc
        "https://robot:123/s3cret@fulfillment.example.com",
        "robot:s3cret@fulfillment.example.com",  # no scheme
        "https://robot:s3cr?et@fulfillment.example.com",  # a '?' in the password
        "https://robot:s3#cret@fulfillment.example.com",
    ):
        monkeypatch.setenv("OSAC_FULFILLMENT_URL", url)
        with pytest.raises(ConfigError) as err:
            load_settings(Settings)
        (line,) = err.value.problems
        assert "credentials do not belong in the URL" in line, line
        assert "s3cret" not in line and "robot" not in line, line
    for url in (
        "https://fulfillment.example.com/?access_token=s3cret",
        "https://fulfillment.example.com#s3cret",
    ):
        monkeypatch.setenv("OSAC_FULFILLMENT_URL", url)
        with pytest.raises(ConfigError) as err:
            load_settings(Settings)
        (line,) = err.value.problems
        assert "must not have a query or a fragment" in line and "s3cret" not in line, line


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("OSAC_GRACEFUL_SHUTDOWN_SECONDS", "inf", "finite number"),
        ("OSAC_STICKY_QUEUE_TIMEOUT_SECONDS", "1e300", "less than or equal to 86400"),
        ("OSAC_TEMPORAL_CONNECT_SECONDS", "nan", "finite number"),
        ("OSAC_CONTROLLER_RESYNC_SECONDS", "1e12", "less than or equal to 86400"),
        ("OSAC_BMAAS_ACTIVITIES_PER_SECOND", "inf", "finite number"),
    ],
)
def test_durations_a_process_cannot_use_are_refused_when_the_settings_load(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, problem: str
) -> None:
    """They loaded, and timedelta() raised OverflowError once Temporal was connected: a traceback."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as err:
        load_settings(Settings)
    (line,) = err.value.problems
    assert line.startswith(f"{variable}: ") and problem in line, line


def _worker_app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    monkeypatch.setenv("OSAC_TEMPORAL_CONNECT_SECONDS", "0")  # never wait for a Temporal
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")  # none there
    monkeypatch.setattr(telemetry, "_process_telemetry", None)  # the worker sets it up, once a process
    app = typer.Typer()
    app.command()(worker_command)
    return app


def test_an_unknown_log_level_is_bad_usage_naming_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """It was a ValueError traceback from logging.basicConfig, exit 1."""
    for app, args in (
        (_worker_app(monkeypatch), ["--log-level", "chatty"]),
        (codec_app, ["serve", "--log-level", "chatty"]),
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "--log-level" in result.output and "'chatty' is not a log level" in result.output


def test_a_worker_without_a_usable_kubeconfig_says_so_before_it_connects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 3 naming the hub configuration (the README's promise), before any attempt to reach
    Temporal; it was a ConfigException traceback, exit 1, once Temporal had answered."""
    app = _worker_app(monkeypatch)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    for kubeconfig in (tmp_path / "missing", tmp_path):
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        result = CliRunner().invoke(app, [])
        assert result.exit_code == 3, result.output
        assert "no usable hub configuration (set KUBECONFIG)" in result.output, result.output
        assert "cannot reach Temporal" not in result.output


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8100",
        "https://fulfillment.example.com",
        "https://fulfillment.example.com/",
        "http://[::1]:8100",
        "https://gw.example.com/fulfillment",  # a proxy's path prefix
    ],
)
def test_root_fulfillment_urls_are_accepted(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("OSAC_FULFILLMENT_URL", url)
    assert load_settings(Settings).fulfillment_url == url
