"""Start a seeded fulfillment twin on a free port, for anyone's tests.

    from lab.fulfillment.testing import fulfillment_twin

    with fulfillment_twin(hosts=4) as twin:          # zero timings unless `timings=` says otherwise
        httpx.get(f"{twin.url}/api/private/v1/baremetal_instances", headers=twin.admin_headers)
        twin.lab                                     # the state; touch it only via twin.call(coro)

`start_fulfillment_twin(...)` does the same without the context manager (call `.stop()`).
`bmi_body(name)` builds a valid private-API create body; `wait_until(fn)` polls with a deadline.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lab.boot import BootSeam
from lab.fulfillment.app import create_fulfillment_app
from lab.fulfillment.lab import FulfillmentConfig, FulfillmentLab, new_token
from lab.fulfillment.timings import TimingProfile, Timings
from lab.http_server import ThreadedServer

DEFAULT_TENANT = "tenant-a"
T = TypeVar("T")


@dataclass
class RunningFulfillmentTwin:
    url: str
    admin_token: str = field(repr=False)
    tenant_tokens: dict[str, str] = field(repr=False)  # tenant -> token
    lab: FulfillmentLab
    server: ThreadedServer

    @property
    def tenant(self) -> str:
        return next(iter(self.tenant_tokens))

    @property
    def tenant_token(self) -> str:
        return self.tenant_tokens[self.tenant]

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    @property
    def tenant_headers(self) -> dict[str, str]:
        return self.headers_for(self.tenant)

    def headers_for(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tenant_tokens[tenant]}"}

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        """Run a coroutine on the twin's loop (the only safe way to touch `lab` from a test)."""
        return self.server.call(coro, timeout)

    def stop(self) -> None:
        if self.server.loop is not None and self.server.loop.is_running():
            self.server.call(self.lab.aclose())
        self.server.stop()


def start_fulfillment_twin(
    *,
    hosts: int = 8,
    gpu_hosts: int | None = None,
    timings: Timings | None = None,
    seed: int = 0,
    boot_seam: BootSeam | None = None,
    tenants: Sequence[str] = (DEFAULT_TENANT,),
    port: int = 0,
) -> RunningFulfillmentTwin:
    tenant_tokens = {tenant: new_token() for tenant in tenants}
    config = FulfillmentConfig(
        hosts=hosts,
        gpu_hosts=gpu_hosts,
        timings=timings if timings is not None else Timings.for_profile(TimingProfile.ZERO),
        seed=seed,
        tenant_tokens={token: tenant for tenant, token in tenant_tokens.items()},
    )
    lab = FulfillmentLab(config, boot_seam=boot_seam)
    server = ThreadedServer(create_fulfillment_app(lab), port=port).start()
    return RunningFulfillmentTwin(
        url=server.url, admin_token=config.admin_token, tenant_tokens=tenant_tokens, lab=lab, server=server
    )


@contextmanager
def fulfillment_twin(**kwargs: Any) -> Iterator[RunningFulfillmentTwin]:
    twin = start_fulfillment_twin(**kwargs)
    try:
        yield twin
    finally:
        twin.stop()


def wait_until(
    probe: Callable[[], T | None], *, timeout: float = 20.0, interval: float = 0.02, what: str = "condition"
) -> T:
    """Call `probe` until it returns something truthy and return that; TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s (last: {result!r})")
        time.sleep(interval)


@contextmanager
def lab_serving(state: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`osac-workers lab serve ARGS...` as a real process, up once it wrote STATE/endpoints.json;
    stopped with SIGTERM (a test of the clean stop reads the process's output afterwards)."""
    cli = str(Path(sys.executable).parent / "osac-workers")
    command = [cli, "lab", "serve", *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(
            lambda: (state / "endpoints.json").exists() or proc.poll() is not None, timeout=60, what="lab up"
        )
        assert proc.poll() is None, proc.communicate()
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise


def bmi_body(
    name: str,
    *,
    instance_type: str = "bm-standard",
    catalog_item: str = "caas-system-bmi",
    user_data: str = '{"ignition": {"version": "3.4.0"}}',
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A create body like the CaaS controller sends (tenant `system`, the pass-through catalog item)."""
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "catalog_item": {"name": catalog_item},
            "instance_type": instance_type,
            "image": {"source_type": "disk_image", "source_ref": "rhcos-4.18"},
            "user_data": user_data,
            "network_attachments": [{"interface": "data-0", "primary": True}],
            **spec,
        },
    }
