"""`osac-workers lab ...`: run the local twins."""

from __future__ import annotations

import typer

lab_app = typer.Typer(help="The lab twins of the fulfillment-service and the hub.", no_args_is_help=True)
