r"""`osac-workers lab serve`: run the lab twins on 127.0.0.1 until SIGINT or SIGTERM.

Files written to `--state-dir`:
    admin-token      the fulfillment private API's admin token (random per start, mode 0600)
    tenant-token     a public-API token of tenant `tenant-a` (random per start, mode 0600)
    kubeconfig       the hub twin's admin credentials (bearer token, mode 0600) for kubectl and the
                     official client; trusts the hub's certificate when it serves https
    hub-tls.crt/.key the hub's self-signed certificate (https only; the .crt is also its CA)
    endpoints.json   {"fulfillment_url": "http://127.0.0.1:8100", "hub_url": "https://127.0.0.1:8101"};
                     one key per running twin. Written last and atomically: once it exists every
                     twin is up. Removed again on a clean stop.

Composition: `LabOptions` says what to run, `start_lab(options)` starts the hub twin (with the
assisted-service / HyperShift behaviour mounted, its agent timings following `--timing`), then the
fulfillment twin with the hub's `BootSeam` (a booted host runs its discovery ignition and registers
an Agent on the hub), and writes the files; `run_lab(options)` does that and waits for a signal.
The hub serves https by default because kubectl only sends a token over TLS.

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
import logging
import os
import secrets
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from lab.boot import BootSeam
from lab.fulfillment.app import create_fulfillment_app
from lab.fulfillment.lab import FulfillmentConfig, FulfillmentLab, new_token
from lab.fulfillment.timings import TimingProfile, Timings
from lab.http_server import ThreadedServer, free_port
from lab.hub.app import create_hub_app
from lab.hub.config import HubConfig
from lab.hub.kubeconfig import write_kubeconfig
from lab.hub.testing import ADMIN_USER, CONTROLLER_USER, TlsThreadedServer
from lab.hub.tls import openssl_available, self_signed_certificate
from lab.hub_controllers.compose import HubBehaviour, build_hub_behaviour
from lab.hub_controllers.timings import AgentTimings

log = logging.getLogger(__name__)

ENDPOINTS_FILE = "endpoints.json"
ADMIN_TOKEN_FILE = "admin-token"
TENANT_TOKEN_FILE = "tenant-token"
KUBECONFIG_FILE = "kubeconfig"
FULFILLMENT_URL_KEY = "fulfillment_url"
HUB_URL_KEY = "hub_url"
LAB_HOST = "127.0.0.1"

AGENT_TIMINGS: dict[TimingProfile, Callable[[], AgentTimings]] = {
    TimingProfile.DEMO: AgentTimings.demo,
    TimingProfile.REALISTIC: AgentTimings.realistic,
    TimingProfile.ZERO: AgentTimings.zero,
}


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
    hub: bool = Field(default=True, description="also run the hub twin (and boot hosts into it)")
    hub_port: int = Field(default=8101, ge=0, le=65535, description="0: any free port")
    hub_tls: bool = Field(default=True, description="https (kubectl sends tokens only over TLS)")
    crd_dirs: list[Path] = Field(default_factory=list, description="extra CRD files or directories")

    def timings(self) -> Timings:
        return Timings.for_profile(self.timing).with_overrides(self.timing_overrides)

    def agent_timings(self) -> AgentTimings:
        return AGENT_TIMINGS[self.timing]()


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
class RunningHubTwin:
    url: str
    app: FastAPI
    server: ThreadedServer
    behaviour: HubBehaviour
    kubeconfig: Path
    ca_file: Path | None

    def stop(self) -> None:
        self.behaviour.boot_seam.close()
        loop = self.server.loop
        if loop is not None and loop.is_running():
            # Open watch streams would otherwise hold the server until their timeouts.
            loop.call_soon_threadsafe(self.app.state.hub.begin_shutdown)
        self.server.stop()


@dataclass
class RunningLab:
    options: LabOptions
    fulfillment: FulfillmentLab
    fulfillment_server: ThreadedServer
    endpoints: dict[str, str]
    hub: RunningHubTwin | None = field(default=None)

    def stop(self) -> None:
        (self.options.state_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
        server = self.fulfillment_server
        if server.loop is not None and server.loop.is_running():
            server.call(self.fulfillment.aclose())
        server.stop()
        # After the fulfillment twin: no host boots into a hub that is going away.
        if self.hub is not None:
            self.hub.stop()


def start_hub_twin(options: LabOptions) -> RunningHubTwin:
    """The hub twin with the lab controllers mounted, admin kubeconfig in the state dir."""
    state_dir = options.state_dir
    tls = options.hub_tls and openssl_available()
    if options.hub_tls and not tls:
        log.warning("openssl is not installed: the hub twin serves plain http (kubectl will not send tokens)")
    port = options.hub_port or free_port(LAB_HOST)
    url = f"{'https' if tls else 'http'}://{LAB_HOST}:{port}"
    admin_token, controller_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    ca_file = None
    if tls:
        files = self_signed_certificate(state_dir)
        ca_file = files.cert
    behaviour = build_hub_behaviour(
        url, controller_token, options.agent_timings(), seed=options.seed, ca_file=ca_file
    )
    config = HubConfig(
        tokens={admin_token: ADMIN_USER, controller_token: CONTROLLER_USER},
        crd_dirs=list(options.crd_dirs),
        fault_seed=options.seed,
    )
    app = create_hub_app(config, routers=behaviour.routers, services=behaviour.services)
    server: ThreadedServer
    if tls:
        assert ca_file is not None
        server = TlsThreadedServer(app, ca_file, files.key, host=LAB_HOST, port=port)
    else:
        server = ThreadedServer(app, host=LAB_HOST, port=port)
    server.start()
    kubeconfig = state_dir / KUBECONFIG_FILE
    kubeconfig.unlink(missing_ok=True)  # recreated 0600 (it holds the admin token)
    write_kubeconfig(kubeconfig, url, admin_token, ca_file=ca_file)
    return RunningHubTwin(
        url=url, app=app, server=server, behaviour=behaviour, kubeconfig=kubeconfig, ca_file=ca_file
    )


def start_lab(options: LabOptions, *, boot_seam: BootSeam | None = None) -> RunningLab:
    state_dir = options.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / ENDPOINTS_FILE).unlink(missing_ok=True)  # a stale file would announce dead servers
    admin_token, tenant_token = new_token(), new_token()
    write_secret(state_dir / ADMIN_TOKEN_FILE, admin_token)
    write_secret(state_dir / TENANT_TOKEN_FILE, tenant_token)

    hub = start_hub_twin(options) if options.hub else None
    try:
        lab = FulfillmentLab(
            FulfillmentConfig(
                admin_token=admin_token,
                tenant_tokens={tenant_token: options.tenant},
                hosts=options.hosts,
                gpu_hosts=options.gpu_hosts,
                timings=options.timings(),
                seed=options.seed,
            ),
            boot_seam=boot_seam or (hub.behaviour.boot_seam if hub is not None else None),
        )
        server = ThreadedServer(
            create_fulfillment_app(lab), host=LAB_HOST, port=options.fulfillment_port
        ).start()
    except BaseException:
        if hub is not None:
            hub.stop()
        raise
    endpoints = {FULFILLMENT_URL_KEY: server.url}
    if hub is not None:
        endpoints[HUB_URL_KEY] = hub.url
    write_endpoints(state_dir, endpoints)
    return RunningLab(
        options=options, fulfillment=lab, fulfillment_server=server, endpoints=endpoints, hub=hub
    )


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
            if running.hub is not None:
                announce(f"hub twin: {running.hub.url} (kubectl --kubeconfig {running.hub.kubeconfig} ...)")
            files = "endpoints.json, admin-token, tenant-token" + (", kubeconfig" if running.hub else "")
            announce(f"state: {options.state_dir} ({files})")
            while not stop.wait(0.5):
                pass
        finally:
            running.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
