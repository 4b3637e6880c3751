"""`osac-workers worker`: run the worker process until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging

import typer

from worker.main import MissingSearchAttributes, install_stop_signals, run_worker
from worker.settings import Settings
from worker.temporal_client import connect


def worker_command(
    log_level: str = typer.Option("INFO", help="Python log level"),
) -> None:
    """Run workflows and activities (configuration from the environment: see the README)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()

    async def main() -> None:
        client = await connect()
        stop = asyncio.Event()
        install_stop_signals(stop)
        await run_worker(client, settings, stop)

    try:
        asyncio.run(main())
    except MissingSearchAttributes as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from err
    except RuntimeError as err:
        if "Failed client connect" in str(err) or "connection" in str(err).lower():
            typer.echo(f"error: cannot reach Temporal: {err}", err=True)
            raise typer.Exit(2) from err
        raise
