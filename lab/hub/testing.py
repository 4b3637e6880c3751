"""Start a hub twin on a free localhost port for tests (the blocking kubernetes client and kubectl can
talk to it from the test thread): url, tokens and a kubeconfig.

    with running_hub(tmp_path, tls=True) as hub:
        core = kubernetes.client.CoreV1Api(hub.api_client())
        subprocess.run(["kubectl", "--kubeconfig", str(hub.kubeconfig), "get", "ns"])

kubectl sends credentials only over https, hence `tls=True` (a self-signed certificate made with
openssl; the kubeconfig trusts it, httpx clients pass `verify=hub.verify`). Plain http is the
default and is enough for the kubernetes Python client and httpx.
"""

from __future__ import annotations

import json
import secrets
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, FastAPI

from lab.http_server import ThreadedServer
from lab.hub.app import HubService, create_hub_app
from lab.hub.config import HubConfig
from lab.hub.hub import Hub
from lab.hub.kubeconfig import write_kubeconfig
from lab.hub.tls import self_signed_certificate

ADMIN_USER = "admin"
CONTROLLER_USER = "lab-controllers"  # the lab controllers' identity; benchmarks leave it out of counts


def shared_crd_dir() -> Path | None:
    """The real CRDs (InfraEnv, Agent, ClusterOrder) in the workplace's shared/ folder, if present."""
    repo = Path(__file__).resolve().parents[2]
    for candidate in (repo.parent / "shared" / "crds", Path("/work/shared/crds")):
        if candidate.is_dir() and any(candidate.glob("*.yaml")):
            return candidate
    return None


class TlsThreadedServer(ThreadedServer):
    """ThreadedServer serving https."""

    def __init__(
        self, app: Any, certfile: Path, keyfile: Path, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(app, host, port)
        config = uvicorn.Config(
            app,
            host=host,
            port=self.port,
            log_level="warning",
            lifespan="on",
            access_log=False,
            ssl_certfile=str(certfile),
            ssl_keyfile=str(keyfile),
            # A TLS close waits for the peer's close_notify (asyncio allows 30 s): bound the wait for
            # connections that clients keep open but never read again.
            timeout_graceful_shutdown=3,
        )
        self._server = uvicorn.Server(config)
        self._uvicorn = self._server

    def stop(self, timeout: float = 30.0) -> None:
        loop = self.loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self._abort_idle_connections)
        super().stop(timeout)

    def _abort_idle_connections(self) -> None:
        for connection in list(self._uvicorn.server_state.connections):
            cycle = getattr(connection, "cycle", None)
            transport = getattr(connection, "transport", None)
            if transport is not None and (cycle is None or cycle.response_complete):
                transport.abort()

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"


@dataclass
class RunningHub:
    url: str
    token: str  # admin
    controller_token: str  # lab-controllers
    kubeconfig: Path  # admin token, namespace "default"
    app: FastAPI
    server: ThreadedServer
    ca_file: Path | None = None  # set when serving https

    @property
    def hub(self) -> Hub:
        hub: Hub = self.app.state.hub
        return hub

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the server's loop (to touch hub state from the test thread)."""
        return self.server.call(coro, timeout)

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A `kubernetes.client.ApiClient` configured from the kubeconfig (not the global default)."""
        import kubernetes  # local: only tests that use the official client need it imported

        return kubernetes.config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def write_kubeconfig(self, path: Path, token: str | None = None, namespace: str = "default") -> Path:
        return write_kubeconfig(
            path, self.url, token or self.token, namespace=namespace, ca_file=self.ca_file
        )

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What to pass as httpx's `verify=`: trusts the hub's own certificate when it serves https."""
        return ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else True

    def stop(self) -> None:
        loop = self.server.loop
        if loop is not None and loop.is_running():
            # Watch streams would otherwise hold the server open until their timeouts.
            loop.call_soon_threadsafe(self.hub.begin_shutdown)
        self.server.stop()


def start_hub(
    workdir: Path,
    *,
    crd_dirs: Sequence[Path] = (),
    routers: Sequence[APIRouter] = (),
    services: Sequence[HubService] = (),
    port: int = 0,
    tls: bool = False,
    **config: Any,
) -> RunningHub:
    """Start a hub; `config` holds other HubConfig fields (e.g. watch_window=5)."""
    token, controller_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    hub_config = HubConfig(
        tokens={token: ADMIN_USER, controller_token: CONTROLLER_USER, **config.pop("tokens", {})},
        crd_dirs=list(crd_dirs),
        **config,
    )
    app = create_hub_app(hub_config, routers=routers, services=services)
    ca_file: Path | None = None
    server: ThreadedServer
    if tls:
        files = self_signed_certificate(Path(workdir))
        ca_file = files.cert
        server = TlsThreadedServer(app, files.cert, files.key, port=port)
    else:
        server = ThreadedServer(app, port=port)
    server.start()
    path = write_kubeconfig(Path(workdir) / "hub.kubeconfig", server.url, token, ca_file=ca_file)
    return RunningHub(server.url, token, controller_token, path, app, server, ca_file)


@contextmanager
def running_hub(workdir: Path, **kwargs: Any) -> Iterator[RunningHub]:
    running = start_hub(workdir, **kwargs)
    try:
        yield running
    finally:
        running.stop()


# -- helpers for tests: waiting, and sample objects valid against the hub's CRDs ---------------------

T = TypeVar("T")


def api_status(exc: Exception) -> dict[str, Any]:
    """The `kind: Status` body of a failed kubernetes-client call (a `kubernetes.client.ApiException`)."""
    body: dict[str, Any] = json.loads(getattr(exc, "body", None) or "{}")
    assert body.get("kind") == "Status" and body.get("status") == "Failure", body
    assert body["code"] == getattr(exc, "status", None), body
    return body


# (group, version, plural) of the served custom kinds
CO = ("osac.openshift.io", "v1alpha1", "clusterorders")
AGENT = ("agent-install.openshift.io", "v1beta1", "agents")
INFRAENV = ("agent-install.openshift.io", "v1beta1", "infraenvs")
NODEPOOL = ("hypershift.openshift.io", "v1beta1", "nodepools")
MACHINE = ("cluster.x-k8s.io", "v1beta1", "machines")
AGENTMACHINE = ("capi-provider.agent-install.openshift.io", "v1beta1", "agentmachines")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll until `predicate()` is truthy; generous deadline for a noisy 2-core machine."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def sample_cluster_order(name: str, **spec: Any) -> dict[str, Any]:
    body_spec: dict[str, Any] = {
        "templateID": "ocp_4_17_small",
        "nodeRequests": [{"numberOfNodes": 2, "bareMetal": {"instanceType": "gpu-large"}}],
    }
    body_spec.update(spec)
    return {
        "apiVersion": "osac.openshift.io/v1alpha1",
        "kind": "ClusterOrder",
        "metadata": {"name": name},
        "spec": body_spec,
    }


def sample_agent(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "Agent",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"approved": False, "role": "worker", **spec},
    }


def sample_infraenv(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "agent-install.openshift.io/v1beta1",
        "kind": "InfraEnv",
        "metadata": {"name": name},
        "spec": {"pullSecretRef": {"name": "pull-secret"}, "agentLabels": {"a": "b"}},
    }


def sample_nodepool(name: str, replicas: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "hypershift.openshift.io/v1beta1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "clusterName": "hc1",
            "replicas": replicas,
            "release": {"image": "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64"},
            "platform": {
                "type": "Agent",
                "agent": {"agentLabelSelector": {"matchLabels": {"osac.openshift.io/clusterorder": "o1"}}},
            },
        },
    }


def sample_machine(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": {"name": name},
        "spec": {
            "clusterName": "hc1",
            "bootstrap": {"dataSecretName": "worker-user-data"},
            "infrastructureRef": {
                "apiVersion": "capi-provider.agent-install.openshift.io/v1beta1",
                "kind": "AgentMachine",
                "name": name,
            },
        },
    }


def sample_agent_machine(name: str) -> dict[str, Any]:
    """An AgentMachine as CAPI makes one for Machine `name` (its owner reference left out: a sample
    stands alone), before the agent provider claimed an Agent for it."""
    return {
        "apiVersion": "capi-provider.agent-install.openshift.io/v1beta1",
        "kind": "AgentMachine",
        "metadata": {"name": name},
        "spec": {"agentLabelSelector": {"matchLabels": {"osac.openshift.io/clusterorder": "o1"}}},
    }
