"""Fixtures for the hub activities: hub twins over real HTTP and helpers to run activities.

Two twins per test session:
- `lab`: the hub with its controllers (assisted-service, host state machine, HyperShift agent
  provider, cluster provisioning) at zero timings, for end-to-end paths;
- `api_hub`: the bare Kubernetes-compatible API (no controllers), where tests write Agents,
  NodePools and Machines themselves to pin exact situations (ambiguous MACs, conflicts, ...).
Each test works in a namespace of its own. Test modules import nothing from here: helpers reach
them as fixtures (`kit`, `api`, `lab_api`, `run`), so module names stay unambiguous for mypy.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from temporalio.testing import ActivityEnvironment

from activities.assisted import AssistedActivities
from activities.hub import HubActivities
from activities.kube import HubKube
from lab.hub.testing import RunningHub, start_hub
from lab.hub_controllers.testing import Lab, hub_requests_by, start_lab

SHARED_CRD_DIR = Path("/work/shared/crds")
LAB_CRD_DIR = Path(__file__).resolve().parents[2] / "lab" / "crds"
RELEASE_IMAGE = "quay.io/openshift-release-dev/ocp-release:4.17.0-x86_64"
# Distinctive, so a leak anywhere is found by a plain substring search.
PULL_SECRET = json.dumps({"auths": {"quay.io": {"auth": "c2VjcmV0LXB1bGwtdG9rZW4tREVBREJFRUY="}}})
PULL_SECRET_MARKER = "c2VjcmV0LXB1bGwtdG9rZW4tREVBREJFRUY"
WORKER_USER = "osac-workers"
WORKER_TOKEN = "worker-token-" + uuid.uuid4().hex
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0wmN/Cr3JXqmLW7u+g9pTh+wyqDHpSQEIQczXkVx9q test@osac"


# ---------------------------------------------------------------------------------------------
# CRD schemas (the real ones from /work/shared/crds; NodePool/Machine from the project's lab CRDs)


def _strict(schema: Any) -> Any:
    """Reject unknown fields where the CRD would prune them (typos in what we write show up)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _load_schemas() -> dict[str, dict[str, Any]]:
    schemas: dict[str, dict[str, Any]] = {}
    for directory in (LAB_CRD_DIR, SHARED_CRD_DIR):  # the shared (real) CRDs win
        for path in sorted(directory.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
            schemas[crd["spec"]["names"]["kind"]] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


_SCHEMAS = _load_schemas()


def assert_valid(kind: str, obj: dict[str, Any]) -> None:
    """Validate an object (as read back from the hub) against its CRD's openAPIV3Schema."""
    body = copy.deepcopy(obj)
    jsonschema.validate(body, _SCHEMAS[kind], cls=jsonschema.Draft7Validator)


# ---------------------------------------------------------------------------------------------
# A blocking REST helper for arranging and inspecting hub state from tests

PATHS = {
    "ClusterOrder": ("/apis/osac.openshift.io/v1alpha1", "clusterorders"),
    "InfraEnv": ("/apis/agent-install.openshift.io/v1beta1", "infraenvs"),
    "Agent": ("/apis/agent-install.openshift.io/v1beta1", "agents"),
    "NodePool": ("/apis/hypershift.openshift.io/v1beta1", "nodepools"),
    "Machine": ("/apis/cluster.x-k8s.io/v1beta1", "machines"),
    "AgentMachine": ("/apis/capi-provider.agent-install.openshift.io/v1beta1", "agentmachines"),
    "Secret": ("/api/v1", "secrets"),
    "Event": ("/api/v1", "events"),
}


@dataclass
class Api:
    http: httpx.Client
    ns: str

    def path(
        self, kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None
    ) -> str:
        root, plural = PATHS[kind]
        path = f"{root}/namespaces/{namespace or self.ns}/{plural}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    def create(self, kind: str, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        root, _ = PATHS[kind]
        body = {"apiVersion": root.removeprefix("/apis/").removeprefix("/api/"), "kind": kind, **body}
        body["metadata"].setdefault("namespace", namespace or self.ns)
        response = self.http.post(self.path(kind, body["metadata"]["namespace"]), json=body)
        response.raise_for_status()
        return dict(response.json())

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        response = self.http.get(self.path(kind, namespace, name))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    def items(
        self, kind: str, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        response = self.http.get(self.path(kind, namespace), params=params)
        response.raise_for_status()
        return list(response.json()["items"])

    def patch(
        self,
        kind: str,
        name: str,
        patch: dict[str, Any],
        *,
        status: bool = False,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        response = self.http.patch(
            self.path(kind, namespace, name, "status" if status else None),
            content=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        response.raise_for_status()
        return dict(response.json())

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        response = self.http.delete(self.path(kind, namespace, name))
        if response.status_code != 404:
            response.raise_for_status()

    def set_faults(self, config: dict[str, Any]) -> None:
        """The hub twin's API fault knobs (`/lab/v1/faults/api`)."""
        self.http.put("/lab/v1/faults/api", json=config).raise_for_status()

    def clear_faults(self) -> None:
        self.http.delete("/lab/v1/faults/api").raise_for_status()

    def requests_by(self, user: str, verb: str | None = None, resource_prefix: str = "") -> int:
        return hub_requests_by(self.http, user, verb, resource_prefix)

    # -- domain objects ---------------------------------------------------------------------

    def order(self, name: str = "order-1", **spec: Any) -> dict[str, Any]:
        body_spec: dict[str, Any] = {
            "templateID": "ocp_4_17_small",
            "releaseImage": RELEASE_IMAGE,
            "pullSecret": PULL_SECRET,
            "sshPublicKey": SSH_KEY,
            "nodeRequests": [{"numberOfNodes": 2, "bareMetal": {"instanceType": "small"}}],
        }
        body_spec.update(spec)
        return self.create("ClusterOrder", {"metadata": {"name": name}, "spec": body_spec})

    def nodepool(self, name: str, selector: dict[str, str], replicas: int = 0) -> dict[str, Any]:
        return self.create(
            "NodePool",
            {
                "metadata": {"name": name},
                "spec": {
                    "clusterName": "cluster",
                    "replicas": replicas,
                    "release": {"image": RELEASE_IMAGE},
                    "platform": {"type": "Agent", "agent": {"agentLabelSelector": {"matchLabels": selector}}},
                },
            },
        )

    def agent(
        self,
        name: str,
        macs: list[str],
        *,
        infraenv: str = "order-1-infraenv",
        labels: dict[str, str] | None = None,
        state: str = "known-unbound",
        approved: bool = False,
    ) -> dict[str, Any]:
        """An Agent as assisted-service registers it (then its status, through the subresource)."""
        self.agent_registered(name, infraenv=infraenv, labels=labels, approved=approved)
        return self.agent_inventory(name, macs, state=state)

    def agent_registered(
        self,
        name: str,
        *,
        infraenv: str = "order-1-infraenv",
        labels: dict[str, str] | None = None,
        approved: bool = False,
    ) -> None:
        """An Agent just created, before assisted-service wrote the host's inventory."""
        all_labels = {"infraenvs.agent-install.openshift.io": infraenv, **(labels or {})}
        self.create(
            "Agent",
            {"metadata": {"name": name, "labels": all_labels}, "spec": {"approved": approved, "role": ""}},
        )

    def agent_inventory(self, name: str, macs: list[str], *, state: str = "known-unbound") -> dict[str, Any]:
        interfaces = [
            {"name": f"eth{i}", "macAddress": mac, "flags": ["up"], "ipV4Addresses": [], "ipV6Addresses": []}
            for i, mac in enumerate(macs)
        ]
        return self.patch(
            "Agent",
            name,
            {
                "status": {
                    "inventory": {"interfaces": interfaces},
                    "debugInfo": {"state": state},
                    "conditions": [
                        {"type": "Bound", "status": "False", "reason": "Unbound"},
                        {"type": "Installed", "status": "False", "reason": "InstallationNotStarted"},
                    ],
                }
            },
            status=True,
        )


def random_macs(count: int = 2) -> list[str]:
    """Well-formed, locally administered MACs, unique per call."""
    return ["0a:" + ":".join(f"{random.randrange(256):02x}" for _ in range(5)) for _ in range(count)]


def new_namespace(client: httpx.Client, name: str | None = None) -> str:
    name = name or f"t-{uuid.uuid4().hex[:10]}"
    response = client.post(
        "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    response.raise_for_status()
    return name


# ---------------------------------------------------------------------------------------------
# Running activities


@dataclass
class Run:
    """One ActivityEnvironment with its captured heartbeats."""

    env: ActivityEnvironment = field(default_factory=ActivityEnvironment)
    heartbeats: list[Any] = field(default_factory=list)
    beat: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.env.on_heartbeat = self._on_heartbeat
        self.env.info = _with_heartbeat_timeout(self.env.info, timedelta(seconds=1))

    def _on_heartbeat(self, *details: Any) -> None:
        self.heartbeats.append(details)
        self.beat.set()

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.env.run(fn, *args)

    def start(self, fn: Callable[..., Any], *args: Any) -> asyncio.Task[Any]:
        return asyncio.create_task(self(fn, *args))

    async def first_heartbeat(self) -> None:
        """Once the activity heartbeated it is past its set-up and waiting (30 s at most)."""
        await asyncio.wait_for(self.beat.wait(), 30)


def _with_heartbeat_timeout(info: Any, timeout: timedelta) -> Any:
    return dataclasses.replace(info, heartbeat_timeout=timeout)


def dumps(value: Any) -> str:
    """Everything an activity hands back to Temporal, as text (to search for leaks)."""
    if hasattr(value, "model_dump_json"):
        return str(value.model_dump_json())
    return json.dumps(value, default=str)


# ---------------------------------------------------------------------------------------------
# Twins and clients


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    running = start_lab(tmp_path_factory.mktemp("lab-hub"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def api_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    running = start_hub(
        tmp_path_factory.mktemp("api-hub"), crd_dirs=[SHARED_CRD_DIR], tokens={WORKER_TOKEN: WORKER_USER}
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
async def lab_kube(lab: Lab) -> AsyncIterator[HubKube]:
    kube = HubKube.from_kubeconfig(str(lab.hub.kubeconfig))
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture(scope="session")
async def api_kube(api_hub: RunningHub, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[HubKube]:
    """The activities' client, as its own hub user so the hub's stats count its requests alone."""
    path = api_hub.write_kubeconfig(tmp_path_factory.mktemp("worker") / "kubeconfig", token=WORKER_TOKEN)
    # Session-long: a stream the hub ends at its timeout and the informer opens again would be
    # counted by whichever test's window it falls in.
    kube = HubKube.from_kubeconfig(str(path), watch_timeout_seconds=3600)
    try:
        yield kube
    finally:
        await kube.close()


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def lab_assisted(lab_kube: HubKube, http: httpx.AsyncClient) -> AssistedActivities:
    return AssistedActivities(lab_kube, http, heartbeat_every=0.2)


@pytest.fixture
async def lab_hub_acts(lab_kube: HubKube) -> AsyncIterator[HubActivities]:
    acts = HubActivities(lab_kube, heartbeat_every=0.2)
    yield acts
    await acts.events.close()


@pytest.fixture
def api_assisted(api_kube: HubKube, http: httpx.AsyncClient) -> AssistedActivities:
    return AssistedActivities(api_kube, http, heartbeat_every=0.2)


@pytest.fixture
async def api_hub_acts(api_kube: HubKube) -> AsyncIterator[HubActivities]:
    acts = HubActivities(api_kube, heartbeat_every=0.2)
    yield acts
    await acts.events.close()


@pytest.fixture
def api(api_hub: RunningHub) -> Iterator[Api]:
    with httpx.Client(base_url=api_hub.url, headers=api_hub.headers(), timeout=30.0) as client:
        yield Api(client, new_namespace(client))


@pytest.fixture
def lab_api(lab: Lab) -> Iterator[Api]:
    with httpx.Client(base_url=lab.url, headers=lab.hub.headers(), timeout=30.0) as client:
        yield Api(client, new_namespace(client))


@pytest.fixture
def run() -> Run:
    return Run()


@dataclass(frozen=True)
class Kit:
    """Constants and pure helpers for the test modules."""

    pull_secret: str = PULL_SECRET
    pull_secret_marker: str = PULL_SECRET_MARKER
    ssh_key: str = SSH_KEY
    release_image: str = RELEASE_IMAGE
    validate: Callable[[str, dict[str, Any]], None] = assert_valid
    random_macs: Callable[..., list[str]] = random_macs
    dumps: Callable[[Any], str] = dumps
    run: Callable[[], Run] = Run
    worker_user: str = WORKER_USER
    worker_token: str = WORKER_TOKEN


@pytest.fixture(scope="session")
def kit() -> Kit:
    return Kit()
