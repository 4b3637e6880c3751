"""`osac-workers worker` (run the worker process until SIGTERM/SIGINT) and `osac-workers codec ...`
(the payload codec server for the Temporal Web UI, and key generation)."""

from __future__ import annotations

import asyncio
import logging
import os

import typer
import uvicorn

from worker.codec import CodecConfigError, codec_from_env, data_converter, generate_key_entry
from worker.codec_server import DEFAULT_UI_ORIGIN, AuthFile, create_codec_app, is_loopback
from worker.health import split_bind
from worker.main import (
    BackendRejectedCredentials,
    HubUnusable,
    MissingSearchAttributes,
    hub_kube,
    install_stop_signals,
    run_worker,
)
from worker.rotation import ROTATED_EXIT_CODE, read_once, run_until_rotated, stamps
from worker.settings import CodecSettings, ConfigError, Settings, env_variable, load_settings
from worker.telemetry import setup_telemetry
from worker.temporal_client import connect_patiently

# Client libraries that log every request URL at INFO; some URLs (the discovery ignition's) carry a
# token, so they only speak up for warnings.
QUIET_LOGGERS = ("httpx", "httpcore", "urllib3", "kubernetes")

log = logging.getLogger(__name__)


def configure_logging(level: str) -> None:
    """The root logger at `level` (`--log-level`: an unknown one is bad usage, exit 2), the noisy
    client libraries at WARNING at least."""
    if level.upper() not in logging.getLevelNamesMapping():
        raise typer.BadParameter(f"{level!r} is not a log level", param_hint="'--log-level'")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))


def _config_failure(err: ConfigError) -> typer.Exit:
    """One line per bad variable, exit 2 (the README's exit codes)."""
    for problem in err.problems:
        typer.echo(f"error: configuration: {problem}", err=True)
    return typer.Exit(2)


def worker_command(
    log_level: str = typer.Option("INFO", help="Python log level"),
) -> None:
    """Run workflows and activities (configuration from the environment: see the README)."""
    configure_logging(log_level)
    try:
        settings = load_settings(Settings)
        # The key ring is read here, before anything starts, and handed to connect().
        codec = codec_from_env(load_settings(CodecSettings))
    except ConfigError as err:
        raise _config_failure(err) from None
    except CodecConfigError as err:
        typer.echo(f"error: payload codec: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        telemetry = setup_telemetry(settings.metrics_bind, service_name="osac-workers-worker")
    except RuntimeError as err:  # e.g. the metrics port is taken
        typer.echo(f"error: cannot start telemetry: {err}", err=True)
        raise typer.Exit(2) from err

    try:
        kube = hub_kube(settings)  # before Temporal: a configuration error shows at once
    except HubUnusable as err:
        typer.echo(f"error: {err}", err=True)
        telemetry.shutdown()
        raise typer.Exit(3) from err

    async def main() -> None:
        tls = stamps(read_once(settings))  # before the connection reads them
        try:
            client = await connect_patiently(
                settings.temporal_connect_seconds, data_converter=data_converter(codec)
            )
        except RuntimeError as err:
            address = os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233 (default)")
            typer.echo(
                f"error: cannot reach Temporal at {address} after {settings.temporal_connect_seconds:.0f}s"
                f" (OSAC_TEMPORAL_CONNECT_SECONDS): {err}",
                err=True,
            )
            raise typer.Exit(3) from err
        stop = asyncio.Event()
        install_stop_signals(stop)
        if await run_until_rotated(tls, stop, lambda: run_worker(client, settings, stop, kube)):
            raise typer.Exit(ROTATED_EXIT_CODE)

    try:
        asyncio.run(main())
    except (MissingSearchAttributes, BackendRejectedCredentials) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    finally:
        telemetry.shutdown()


codec_app = typer.Typer(
    help="The optional payload encryption (AES-GCM) and its codec server.", no_args_is_help=True
)


@codec_app.command("serve")
def codec_serve_command(
    bind: str = typer.Option(
        "127.0.0.1:8089", envvar="OSAC_CODEC_SERVER_BIND", help="host:port to listen on"
    ),
    ui_origin: list[str] = typer.Option(
        [DEFAULT_UI_ORIGIN],
        "--ui-origin",
        envvar="OSAC_CODEC_UI_ORIGINS",
        help="origin of the Temporal Web UI allowed by CORS (repeatable)",
    ),
    log_level: str = typer.Option("INFO", help="Python log level"),
) -> None:
    """Serve /encode and /decode for the Web UI (`temporal server start-dev --ui-codec-endpoint URL`)."""
    configure_logging(log_level)
    try:
        settings = load_settings(CodecSettings)
        codec = codec_from_env(settings)
        auth = AuthFile(settings.server_auth_file) if settings.server_auth_file is not None else None
        host, port = split_bind(bind)
    except ConfigError as err:
        raise _config_failure(err) from None
    except (CodecConfigError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    if codec is None:
        typer.echo("error: no codec keys configured (OSAC_CODEC_KEYS or OSAC_CODEC_KEYS_FILE)", err=True)
        raise typer.Exit(2)
    if auth is None and not is_loopback(host):
        # Not refused: it may sit behind a proxy that authenticates; but say what it exposes.
        log.warning(
            "the codec server listens on %s without a credential: anyone who can reach it can decrypt"
            " and encrypt payloads. Set %s, or keep it behind an authenticating proxy",
            bind,
            env_variable(CodecSettings, "server_auth_file"),
        )
    typer.echo(f"codec server on http://{bind} for {', '.join(ui_origin)}", err=True)
    uvicorn.run(create_codec_app(codec, ui_origin, auth), host=host, port=port, log_level=log_level.lower())


@codec_app.command("keygen")
def codec_keygen_command(key_id: str = typer.Argument(..., help="id of the new key, e.g. 2025-06")) -> None:
    """Print a new AES-256 key ring entry `id=base64` (add it to OSAC_CODEC_KEYS or the keys file)."""
    try:
        typer.echo(generate_key_entry(key_id))
    except CodecConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
