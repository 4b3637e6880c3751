"""Both twins in a process of their own, with a benchmark delay profile.

`python -m bench.twins --profile 1x --hosts 600 --state-dir DIR` serves the hub twin (with the
assisted-service / HyperShift controllers) and the fulfillment twin on free ports until SIGTERM, and
writes `DIR/twins.json` once both answer. A process of their own keeps the twins' CPU apart from the
worker's and from the harness's own clock readings.

Identities on the hub: the worker uses the kubeconfig (user `admin`), the controllers are
`lab-controllers`, and the harness uses its own token (user `bench`), so the hub's counters can leave
out everything that is not the orchestrator.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "twins.json"
BENCH_USER = "bench"


@dataclass(frozen=True)
class TwinsInfo:
    fulfillment_url: str
    admin_token_file: Path
    hub_url: str
    kubeconfig: Path
    bench_token: str

    @property
    def admin_token(self) -> str:
        return self.admin_token_file.read_text().strip()


def _serve(profile_name: str, hosts: int, state_dir: Path) -> None:
    # Imported here: the parent only needs the dataclass and the launcher.
    from bench.profiles import profile
    from lab.fulfillment.testing import start_fulfillment_twin
    from lab.http_server import free_port
    from lab.hub.testing import CONTROLLER_USER, shared_crd_dir, start_hub
    from lab.hub_controllers.compose import build_hub_behaviour

    chosen = profile(profile_name)
    state_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    controller_token, bench_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    behaviour = build_hub_behaviour(url, controller_token, chosen.agents, signing_key=b"bench", seed=7)
    shared = shared_crd_dir()
    hub = start_hub(
        state_dir,
        crd_dirs=[shared] if shared is not None else [],
        routers=behaviour.routers,
        services=behaviour.services,
        port=port,
        tokens={controller_token: CONTROLLER_USER, bench_token: BENCH_USER},
    )
    fulfillment = start_fulfillment_twin(
        hosts=hosts, gpu_hosts=0, timings=chosen.bmaas, boot_seam=behaviour.boot_seam
    )
    token_file = state_dir / "fulfillment-token"
    token_file.write_text(fulfillment.admin_token)
    token_file.chmod(0o600)
    info = {
        "fulfillment_url": fulfillment.url,
        "admin_token_file": str(token_file),
        "hub_url": hub.url,
        "kubeconfig": str(hub.kubeconfig),
        "bench_token": bench_token,
    }
    tmp = state_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, state_dir / STATE_FILE)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    fulfillment.stop()
    behaviour.boot_seam.close()
    hub.stop()


class TwinsProcess:
    """The parent's handle: start, read the endpoints, stop."""

    def __init__(self, profile_name: str, hosts: int, state_dir: Path, log: Path, *, nice: int = 0) -> None:
        self.profile_name = profile_name
        self.hosts = hosts
        self.state_dir = state_dir
        self.log = log
        self.nice = nice  # added to ours: the twins stand in for remote services, so they yield the cores
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> TwinsInfo:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.twins",
                    "--profile",
                    self.profile_name,
                    "--hosts",
                    str(self.hosts),
                    "--state-dir",
                    str(self.state_dir),
                ],
                stdout=out,
                stderr=out,
            )
        if self.nice:
            # From here, not in the child before exec (`preexec_fn` is unsafe with threads running).
            niceness = min(19, os.getpriority(os.PRIO_PROCESS, 0) + self.nice)
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, niceness)
        deadline = time.monotonic() + timeout
        state = self.state_dir / STATE_FILE
        while not state.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the twins exited with {self.proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the twins did not start within {timeout}s; see {self.log}")
            time.sleep(0.1)
        raw: dict[str, Any] = json.loads(state.read_text())
        return TwinsInfo(
            fulfillment_url=raw["fulfillment_url"],
            admin_token_file=Path(raw["admin_token_file"]),
            hub_url=raw["hub_url"],
            kubeconfig=Path(raw["kubeconfig"]),
            bench_token=raw["bench_token"],
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    _serve(args.profile, args.hosts, args.state_dir)


if __name__ == "__main__":
    main()
