r"""`osac-workers lab serve`: run the lab twins on 127.0.0.1 until SIGINT or SIGTERM.

Files written to `--state-dir`:
    admin-token      the fulfillment private API's admin token (random per start, mode 0600)
    tenant-token     a public-API token of tenant `tenant-a` (random per start, mode 0600)
    endpoints.json   {"fulfillment_url": "http://127.0.0.1:8100"}; one key per running twin (the hub
                     twin will add "hub_url"). Written last and atomically: once it exists every twin
                     is up. Removed again on a clean stop.

Composition: `LabOptions` says what to run, `start_lab(options, boot_seam=...)` starts the servers and
writes the files, `run_lab(options)` does that and waits for a signal. A hub twin plugs in by being
started first in `start_lab` and handing its `BootSeam` to the fulfillment twin.

A whole BMI life with curl (run with STATE set to the --state-dir; this exact script is tested;
`-w '\n'` only ends each answer with a newline):

# --- curl walkthrough ---
STATE=${STATE:-/tmp/osac-lab}
URL=$(sed -nE 's/.*"fulfillment_url": *"([^"]+)".*/\1/p' "$STATE/endpoints.json")
AUTH="Authorization: Bearer $(cat "$STATE/admin-token")"
API="$URL/api/private/v1"

# Watch BMI events of one cluster order in the background (one JSON object per line).
ORDER_FILTER="event.bare_metal_instance.metadata.labels['osac.openshift.io/cluster-order'] == 'curl'"
curl -sSN -H "$AUTH" -G "$API/events/watch" --data-urlencode "filter=$ORDER_FILTER" > "$STATE/watch.ndjson" &
WATCH=$!
until curl -sSf -H "$AUTH" "$URL/lab/v1/stats" | grep -q '"watchers":[1-9]'; do sleep 0.1; done

# Create a worker BMI the way CaaS does: tenant system, the pass-through catalog item.
ID=$(curl -sSf -H "$AUTH" -X POST "$API/baremetal_instances" -d '{
  "metadata": {"name": "curl-worker-0", "labels": {"osac.openshift.io/cluster-order": "curl"}},
  "spec": {"catalog_item": {"name": "caas-system-bmi"}, "instance_type": "bm-standard",
           "image": {"source_type": "disk_image", "source_ref": "rhcos-4.18"},
           "user_data": "{\"ignition\": {\"version\": \"3.4.0\"}}",
           "network_attachments": [{"interface": "data-0", "primary": true}]}}' \
  | sed -nE 's/^\{"id":"([^"]+)".*/\1/p')

# PROVISIONING -> RUNNING, then the NIC MACs are in status.hardware.nics.
until curl -sSf -H "$AUTH" "$API/baremetal_instances/$ID" | grep -q BARE_METAL_INSTANCE_STATE_RUNNING; do
  sleep 0.1
done
curl -sSf -w '\n' -H "$AUTH" -G "$API/baremetal_instances" \
  --data-urlencode "filter=this.metadata.labels['osac.openshift.io/cluster-order'] == 'curl'"
# PATCH replaces a map whole (labels, annotations, ...): send every label to keep.
curl -sSf -w '\n' -H "$AUTH" -X PATCH "$API/baremetal_instances/$ID" \
  -d '{"metadata": {"labels": {"osac.openshift.io/cluster-order": "curl", "stage": "ready"}}}'

# Delete: DELETING, the host is wiped and released, then the object is gone (404).
curl -sSf -w '\n' -H "$AUTH" -X DELETE "$API/baremetal_instances/$ID"
until [ "$(curl -s -o /dev/null -w '%{http_code}' -H "$AUTH" "$API/baremetal_instances/$ID")" = 404 ]; do
  sleep 0.1
done
curl -sSf -w '\n' -H "$AUTH" "$URL/lab/v1/audit?bmi_id=$ID"
until grep -q EVENT_TYPE_OBJECT_DELETED "$STATE/watch.ndjson"; do sleep 0.1; done
kill $WATCH
# --- end ---

Lab knobs, same token: `curl -X PUT -H "$AUTH" "$URL/lab/v1/faults" -d '{"error_rate": 0.2}'`,
`curl -X PATCH -H "$AUTH" "$URL/lab/v1/timings" -d '{"wipe_s": 30}'`, `curl -H "$AUTH" "$URL/lab/v1/hosts"`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lab.boot import BootSeam
from lab.fulfillment.app import create_fulfillment_app
from lab.fulfillment.lab import FulfillmentConfig, FulfillmentLab, new_token
from lab.fulfillment.timings import TimingProfile, Timings
from lab.http_server import ThreadedServer

ENDPOINTS_FILE = "endpoints.json"
ADMIN_TOKEN_FILE = "admin-token"
TENANT_TOKEN_FILE = "tenant-token"
FULFILLMENT_URL_KEY = "fulfillment_url"
LAB_HOST = "127.0.0.1"


class LabOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: Path
    fulfillment_port: int = Field(default=8100, ge=0, le=65535, description="0: any free port")
    hosts: int = Field(default=8, ge=0)
    gpu_hosts: int | None = Field(default=None, ge=0)
    timing: TimingProfile = TimingProfile.DEMO
    timing_overrides: dict[str, float] = Field(default_factory=dict, description="Timings field -> seconds")
    seed: int = 0
    tenant: str = "tenant-a"

    def timings(self) -> Timings:
        return Timings.for_profile(self.timing).with_overrides(self.timing_overrides)


def write_secret(path: Path, value: str) -> None:
    """Create the file 0600 from the start, so the token is never readable by others, not even briefly."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    os.replace(tmp, path)


def write_endpoints(state_dir: Path, endpoints: dict[str, str]) -> None:
    tmp = state_dir / f".{ENDPOINTS_FILE}.tmp"
    tmp.write_text(json.dumps(endpoints, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, state_dir / ENDPOINTS_FILE)


def read_endpoints(state_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state_dir / ENDPOINTS_FILE).read_text())
    return data


@dataclass
class RunningLab:
    options: LabOptions
    fulfillment: FulfillmentLab
    fulfillment_server: ThreadedServer
    endpoints: dict[str, str]

    def stop(self) -> None:
        (self.options.state_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
        server = self.fulfillment_server
        if server.loop is not None and server.loop.is_running():
            server.call(self.fulfillment.aclose())
        server.stop()


def start_lab(options: LabOptions, *, boot_seam: BootSeam | None = None) -> RunningLab:
    state_dir = options.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / ENDPOINTS_FILE).unlink(missing_ok=True)  # a stale file would announce dead servers
    admin_token, tenant_token = new_token(), new_token()
    write_secret(state_dir / ADMIN_TOKEN_FILE, admin_token)
    write_secret(state_dir / TENANT_TOKEN_FILE, tenant_token)

    lab = FulfillmentLab(
        FulfillmentConfig(
            admin_token=admin_token,
            tenant_tokens={tenant_token: options.tenant},
            hosts=options.hosts,
            gpu_hosts=options.gpu_hosts,
            timings=options.timings(),
            seed=options.seed,
        ),
        boot_seam=boot_seam,
    )
    server = ThreadedServer(create_fulfillment_app(lab), host=LAB_HOST, port=options.fulfillment_port).start()
    endpoints = {FULFILLMENT_URL_KEY: server.url}
    write_endpoints(state_dir, endpoints)
    return RunningLab(options=options, fulfillment=lab, fulfillment_server=server, endpoints=endpoints)


def run_lab(
    options: LabOptions,
    *,
    boot_seam: BootSeam | None = None,
    stop: threading.Event | None = None,
    announce: Callable[[str], None] = print,
) -> None:
    """Start the twins, wait for SIGINT/SIGTERM (or `stop`), then stop them cleanly."""
    stop = stop or threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        running = start_lab(options, boot_seam=boot_seam)
        try:
            announce(f"fulfillment twin: {running.endpoints[FULFILLMENT_URL_KEY]}")
            announce(f"state: {options.state_dir} (endpoints.json, admin-token, tenant-token)")
            while not stop.wait(0.5):
                pass
        finally:
            running.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
