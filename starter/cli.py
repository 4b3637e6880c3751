"""The `osac-workers` command line.

Configuration comes from the same environment as the worker (README: configuration reference):
TEMPORAL_* for Temporal, KUBECONFIG for the hub, OSAC_FULFILLMENT_* for BMaaS, OSAC_TASK_QUEUE.
Exit codes: 0 done, 1 refused / not found / did not settle, 2 bad usage or configuration (each bad
variable named), 3 a server is unreachable.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from temporalio.service import RPCError, RPCStatusCode

from activities.kube import HubApiError, HubUnavailable
from contracts.refs import DNS_LABEL, OrderRef
from contracts.workflows import ClusterWorkersStatus
from lab.cli import lab_app
from starter.api import CommandError
from starter.controller import ClusterOrderController
from starter.demo import demo_command
from starter.dev import dev_app
from starter.operations import DEFAULT_SCALE_TIMEOUT
from starter.orders import OrderChangeError
from starter.render import follow, settled, status_feed, summary_line, workers_table
from starter.runtime import (
    Unreachable,
    bmaas_client,
    connect_temporal,
    load_configuration,
    open_callers,
    open_hub,
    workers_api,
)
from starter.validation import InstanceTypeCatalog
from worker.cli import codec_app, configure_logging, worker_command
from worker.codec import CodecConfigError
from worker.health import serve_health
from worker.main import install_stop_signals
from worker.rotation import ROTATED_EXIT_CODE, read_once, run_until_rotated, stamps
from worker.settings import ConfigError
from worker.telemetry import setup_telemetry

T = TypeVar("T")


class _Cli(typer.Typer):
    """The console script: ends with `os._exit` once the command has finished.

    The Temporal client's native threads can outlive the event loop and abort CPython's
    finalization ("PyGILState_Release ... finalizing", temporalio/sdk-python#300), turning a
    finished command into exit code 134. Every command has cleaned up by the time it returns, so
    the interpreter's teardown is skipped. Tests invoke the click command and are unaffected."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        code = 0
        try:
            super().__call__(*args, **kwargs)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except ConfigError as err:  # a command that did not map it: still the README's exit 2
            config_failure(err)
            code = ExitCode.USAGE
        except BaseException:
            traceback.print_exc()
            code = 1
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


app = _Cli(help="Durable bare-metal worker provisioning for OSAC, on Temporal.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
app.add_typer(dev_app, name="dev")
app.add_typer(codec_app, name="codec")
app.command("worker")(worker_command)
app.command("demo")(demo_command)

err_console = Console(stderr=True)


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    RESTART_FOR_ROTATED_TLS = ROTATED_EXIT_CODE  # the long-running processes: start me again


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


def parse_order(value: str) -> OrderRef:
    namespace, sep, name = value.partition("/")
    try:
        if not sep:
            raise ValueError("missing '/'")
        return OrderRef(namespace=namespace, name=name)
    except ValueError as err:
        raise typer.BadParameter(f"expected <namespace>/<order> (DNS labels), got {value!r}") from err


ORDER_ARG = typer.Argument(..., metavar="NAMESPACE/ORDER", help="The ClusterOrder, e.g. tenant-a/my-cluster.")


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(int(code))


def config_failure(err: ConfigError) -> typer.Exit:
    """One line per problem, each naming its environment variable; exit 2 (bad configuration)."""
    for problem in err.problems:
        err_console.print(f"[bold red]error:[/] configuration: {problem}", highlight=False, soft_wrap=True)
    return typer.Exit(int(ExitCode.USAGE))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command; map known failures to a message and an exit code."""
    try:
        return asyncio.run(coro)
    except ConfigError as err:
        raise config_failure(err) from None
    except Unreachable as err:
        raise fail(str(err), ExitCode.UNREACHABLE) from None
    except CodecConfigError as err:
        raise fail(f"payload codec: {err}", ExitCode.USAGE) from None
    except HubUnavailable as err:
        raise fail(f"cannot reach the hub: {err}", ExitCode.UNREACHABLE) from None
    except (CommandError, OrderChangeError) as err:
        raise fail(str(err)) from None
    except HubApiError as err:
        raise fail(f"hub: {err}") from None
    except RPCError as err:
        code = ExitCode.UNREACHABLE if err.status == RPCStatusCode.UNAVAILABLE else ExitCode.FAILED
        raise fail(f"temporal: {err}", code) from None


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def print_status(status: ClusterWorkersStatus, output: OutputFormat) -> None:
    if output == OutputFormat.JSON:
        typer.echo(json.dumps(status.model_dump(mode="json", by_alias=True), indent=2))
    else:
        Console().print(workers_table(status))


async def _status_only(order: OrderRef) -> ClusterWorkersStatus:
    settings, starter = load_configuration()
    client = await connect_temporal()
    return await workers_api(client, settings, starter).status(order)


@app.command()
def status(
    order: str = ORDER_ARG,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o", help="table or json"),
) -> None:
    """Workers of an order: phase, BMI, attempt, last failure, next retry."""
    ref = parse_order(order)
    print_status(run(_status_only(ref)), output)


@app.command()
def scale(
    order: str = ORDER_ARG,
    node_set: str = typer.Option(..., "--node-set", help="The node set (its instance type)."),
    count: int = typer.Option(..., "--count", help="The new number of workers."),
    timeout: float = typer.Option(
        DEFAULT_SCALE_TIMEOUT, "--timeout", min=0.001, help="Seconds to wait for the workflow."
    ),
    confirm: bool = typer.Option(
        False, "--confirm", help="Confirm a mass scale-down (over half the order and over 2 workers)."
    ),
) -> None:
    """Set a node set's count on the ClusterOrder and wait until the workflow took it."""
    ref = parse_order(order)

    async def main() -> ClusterWorkersStatus:
        async with open_callers(warn) as callers:
            return await callers.operations.scale(
                ref, node_set, count, timeout=timeout, confirm_scale_down=confirm
            )

    result = run(main())
    typer.echo(f"{ref.key}: {node_set} = {count} taken by the workflow; {summary_line(result)}")


@app.command("scale-down")
def scale_down(
    order: str = ORDER_ARG,
    worker: str = typer.Argument(..., help="The worker to release, e.g. my-cluster-worker-1."),
) -> None:
    """Release one named worker (its host is wiped) and lower its node set's count to match."""
    ref = parse_order(order)

    async def main() -> Any:
        async with open_callers(warn) as callers:
            return await callers.operations.scale_down_worker(ref, worker)

    lowered = run(main())
    typer.echo(f"{ref.key}: releasing {worker}; {lowered.name} now {lowered.count}")


@app.command()
def decommission(
    order: str = ORDER_ARG,
    force: bool = typer.Option(False, "--force", help="Even while the ClusterOrder still asks for workers."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until every host is wiped and released."),
    timeout: float = typer.Option(1800.0, "--timeout", min=0.001, help="Seconds to wait with --wait."),
) -> None:
    """Release every worker of an order (deleting the ClusterOrder does this for managed orders)."""
    ref = parse_order(order)

    async def main() -> ClusterWorkersStatus | None:
        async with open_callers(warn) as callers:
            await callers.operations.decommission(ref, force=force)
            if not wait:
                return None
            # Follow this run: after it completes the controller may start a new one (--force).
            run_id = await callers.api.run_id(ref)
            return await _follow(lambda order: callers.api.run_status(order, run_id), ref, timeout)

    final = run(main())
    if final is None:
        typer.echo(f"{ref.key}: decommissioning")
    elif not final.finished:
        raise fail(f"{ref.key}: not decommissioned within {timeout:.0f}s: {summary_line(final)}")
    else:
        typer.echo(f"{ref.key}: decommissioned; every host wiped and released")


async def _follow(
    fetch_status: Callable[[OrderRef], Awaitable[ClusterWorkersStatus]], ref: OrderRef, timeout: float | None
) -> ClusterWorkersStatus | None:
    # A mistyped name would otherwise wait in silence.
    missing = (
        f"order {ref.key}: no workers workflow yet; waiting for the controller to start one"
        " (is the order's name right?)"
    )
    return await follow(status_feed(fetch_status, ref, warn, missing=missing), timeout=timeout)


@app.command()
def watch(
    order: str = ORDER_ARG,
    timeout: float = typer.Option(0, "--timeout", min=0, help="Give up after this many seconds (0: never)."),
) -> None:
    """Live progress until the order settles (every worker Ready, or decommissioned)."""
    ref = parse_order(order)

    async def main() -> ClusterWorkersStatus | None:
        settings, starter = load_configuration()
        client = await connect_temporal()
        api = workers_api(client, settings, starter)
        return await _follow(api.live_status, ref, timeout or None)

    final = run(main())
    if final is None:
        raise fail(f"order {ref.key}: no workers workflow appeared within {timeout:.0f}s")
    if not settled(final):
        raise fail(f"{ref.key} did not settle within {timeout:.0f}s: {summary_line(final)}")


@app.command()
def controller(
    namespace: list[str] = typer.Option(
        [],
        "--namespace",
        "-n",
        help="Watch only these namespaces (repeatable; default OSAC_CONTROLLER_NAMESPACES, else all).",
    ),
    resync_seconds: float | None = typer.Option(
        None, "--resync-seconds", min=0.001, help="Full pass period (default OSAC_CONTROLLER_RESYNC_SECONDS)."
    ),
    health_file: Path | None = typer.Option(
        None, "--health-file", help="Keep a JSON health report here (for `dev status` and probes)."
    ),
    log_level: str = typer.Option("INFO", help="Python log level"),
) -> None:
    """Run the ClusterOrder controller until SIGTERM/SIGINT."""
    wrong = [n for n in namespace if not re.fullmatch(DNS_LABEL, n)]
    if wrong:  # a name no namespace can have would filter every order out, silently
        raise typer.BadParameter(
            f"not a namespace name: {', '.join(map(repr, wrong))}", param_hint="'--namespace'"
        )
    configure_logging(log_level)
    try:
        settings, starter = load_configuration()
    except ConfigError as err:
        raise config_failure(err) from None
    try:
        telemetry = setup_telemetry(settings.metrics_bind, service_name="osac-workers-controller")
    except RuntimeError as err:  # e.g. the metrics port is taken
        raise fail(f"cannot start telemetry: {err}", ExitCode.USAGE) from None

    async def main() -> None:
        tls = stamps(read_once(settings))  # before the clients read them
        client = await connect_temporal(settings.temporal_connect_seconds)
        kube = open_hub(settings)
        bmaas = bmaas_client(settings)
        try:
            loop = ClusterOrderController(
                kube,
                workers_api(client, settings, starter),
                InstanceTypeCatalog(bmaas),
                namespaces=namespace or settings.controller_namespaces,
                resync_seconds=resync_seconds
                if resync_seconds is not None
                else settings.controller_resync_seconds,
                health_file=health_file,
                meter=telemetry.runtime.metric_meter if telemetry.runtime is not None else None,
            )
            stop = asyncio.Event()
            install_stop_signals(stop)

            async def serve() -> None:
                # Live while the loop answers at all; ready once the ClusterOrders are listed.
                async with serve_health(settings.health_bind, lambda: True, lambda: loop.synced):
                    await loop.run(stop)

            if await run_until_rotated(tls, stop, serve):
                raise typer.Exit(ExitCode.RESTART_FOR_ROTATED_TLS)
        finally:
            await bmaas.aclose()
            await kube.close()

    try:
        run(main())
    finally:
        telemetry.shutdown()
