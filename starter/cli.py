"""The `osac-workers` command line."""

from __future__ import annotations

import typer

from lab.cli import lab_app
from worker.cli import worker_command

app = typer.Typer(help="Durable bare-metal worker provisioning for OSAC, on Temporal.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
app.command("worker")(worker_command)


@app.command()
def demo() -> None:
    """Run the end-to-end demo on the embedded default (arrives with the starter issue)."""
    typer.echo(
        "make demo will start a Temporal dev server, the lab twins, the worker and the controller,\n"
        "then drive a ClusterOrder through scale-up, a targeted scale-down and decommission.\n"
        "It is not wired up yet (see the starter issue).",
        err=True,
    )
    raise typer.Exit(1)
