"""Test helpers: a hub twin with the hub controllers mounted, on a free port, plus blocking helpers.

    with lab_hub(tmp_path, AgentTimings.zero()) as lab:
        infra_env = create_infra_env(lab.client, "ns1")        # Secret + InfraEnv, waits ImageCreated
        lab.boot("host-1", ("0a:00:00:00:00:01",), fetch_ignition(infra_env))
        wait_state(lab.client, "ns1", "host-1", "known-unbound")

Everything talks to the hub over HTTP (httpx, admin token) like any client would; waits poll a
condition until a generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from lab.boot import BootedHost
from lab.http_server import free_port
from lab.hub.testing import CONTROLLER_USER, RunningHub, shared_crd_dir, start_hub
from lab.hub_controllers.compose import HubBehaviour, build_hub_behaviour
from lab.hub_controllers.faults import FAULTS_PATH, AgentFaults
from lab.hub_controllers.resources import AGENTS, INFRA_ENVS, NAMESPACES, NODE_POOLS, SECRETS, ApiResource
from lab.hub_controllers.timings import AgentTimings

T = TypeVar("T")
Obj = dict[str, Any]

DEADLINE_S = 30.0
HUB_CA_FILE_NAME = "hub-tls.crt"  # where lab.hub.testing writes its self-signed certificate
PULL_SECRET = json.dumps(
    {
        "auths": {
            registry: {"auth": base64.b64encode(f"robot+{registry}:{'s3cr3t' * 40}".encode()).decode()}
            for registry in (
                "cloud.openshift.com",
                "quay.io",
                "registry.connect.redhat.com",
                "registry.redhat.io",
            )
        }
    }
)
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0wmN/Cr3JXqmLW7u+g9pTh+wyqDHpSQEIQczXkVx9q lab@osac"


def wait_until(probe: Callable[[], T | None], what: str, timeout: float = DEADLINE_S) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def hub_requests_by(http: httpx.Client, user: str, verb: str | None = None, resource_prefix: str = "") -> int:
    """Resource requests the hub served for `user` (its `/lab/v1/stats`), optionally only of one
    verb on resources whose name starts with `resource_prefix` (`agents.`)."""
    response = http.get("/lab/v1/stats")
    response.raise_for_status()
    stats = response.json()
    if verb is None and not resource_prefix:
        return int(stats["byUser"].get(user, 0))
    return sum(
        int(r["count"])
        for r in stats["requests"]
        if r["user"] == user
        and (verb is None or r["verb"] == verb)
        and r["resource"].startswith(resource_prefix)
    )


class HubClient:
    """Blocking REST calls with the admin token; errors raise `httpx.HTTPStatusError`."""

    def __init__(self, url: str, token: str, verify: bool | ssl.SSLContext = True) -> None:
        self.url = url
        self.verify = verify  # the hub's CA file when it serves https
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0, verify=verify
        )

    def get(self, res: ApiResource, namespace: str | None, name: str) -> Obj | None:
        response = self.http.get(res.object_path(namespace, name))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        result: Obj = response.json()
        return result

    def list(self, res: ApiResource, namespace: str | None = None, selector: str | None = None) -> list[Obj]:
        params = {"labelSelector": selector} if selector else None
        response = self.http.get(res.collection_path(namespace), params=params)
        response.raise_for_status()
        items: list[Obj] = response.json()["items"]
        return items

    def create(self, res: ApiResource, body: Obj) -> Obj:
        body = {"apiVersion": res.api_version, "kind": res.kind, **body}
        response = self.http.post(res.collection_path(body["metadata"].get("namespace")), json=body)
        response.raise_for_status()
        result: Obj = response.json()
        return result

    def patch(
        self, res: ApiResource, namespace: str | None, name: str, patch: Obj, status: bool = False
    ) -> Obj:
        response = self.http.patch(
            res.object_path(namespace, name, "status" if status else None),
            content=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        response.raise_for_status()
        result: Obj = response.json()
        return result

    def delete(self, res: ApiResource, namespace: str | None, name: str) -> None:
        response = self.http.delete(res.object_path(namespace, name))
        if response.status_code != 404:
            response.raise_for_status()


@dataclass
class Lab:
    hub: RunningHub
    behaviour: HubBehaviour
    client: HubClient
    timings: AgentTimings

    @property
    def url(self) -> str:
        return self.hub.url

    @property
    def boot_seam(self) -> Any:
        return self.behaviour.boot_seam

    def boot(self, host_id: str, macs: tuple[str, ...], user_data: str) -> None:
        """Boot a host through the seam, on the hub's loop (tests have no fulfillment twin)."""
        self.hub.call(self.boot_seam.boot(BootedHost(host_id, macs), user_data))

    def set_faults(self, faults: AgentFaults) -> None:
        response = self.client.http.put(FAULTS_PATH, json=faults.model_dump(mode="json"))
        response.raise_for_status()

    def reset_faults(self) -> None:
        self.client.http.delete(FAULTS_PATH).raise_for_status()

    def new_namespace(self) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        self.client.create(NAMESPACES, {"metadata": {"name": name}})
        return name

    def stop(self) -> None:
        self.boot_seam.close()
        self.hub.stop()


def start_lab(workdir: Path, timings: AgentTimings | None = None, *, tls: bool = False) -> Lab:
    """A hub (real CRDs from /work/shared/crds when present) with the controllers mounted; `tls`
    serves https with the hub's self-signed certificate, which the controllers then trust."""
    port = free_port()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    controller_token = secrets.token_urlsafe(24)
    timings = timings or AgentTimings.zero()
    ca_file = Path(workdir) / HUB_CA_FILE_NAME if tls else None
    behaviour = build_hub_behaviour(
        url, controller_token, timings, signing_key=b"test-signing-key", seed=7, ca_file=ca_file
    )
    shared = shared_crd_dir()  # test against the real CRDs where the workplace has them
    crd_dirs = [shared] if shared is not None else []
    hub = start_hub(
        workdir,
        crd_dirs=crd_dirs,
        routers=behaviour.routers,
        services=behaviour.services,
        port=port,
        tls=tls,
        tokens={controller_token: CONTROLLER_USER},
    )
    assert hub.ca_file == ca_file, "the hub's certificate is not where the controllers look for it"
    verify: bool | ssl.SSLContext = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
    return Lab(hub, behaviour, HubClient(hub.url, hub.token, verify), timings)


@contextmanager
def lab_hub(workdir: Path, timings: AgentTimings | None = None, *, tls: bool = False) -> Iterator[Lab]:
    running = start_lab(workdir, timings, tls=tls)
    try:
        yield running
    finally:
        running.stop()


# -- domain helpers -------------------------------------------------------------------------------


def condition(obj: Obj | None, kind: str) -> Obj | None:
    for cond in (obj or {}).get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def host_state(agent: Obj | None) -> str | None:
    return ((agent or {}).get("status", {}).get("debugInfo") or {}).get("state")


def agent_macs(agent: Obj) -> set[str]:
    return {i["macAddress"] for i in (agent.get("status", {}).get("inventory") or {}).get("interfaces") or []}


def create_pull_secret(client: HubClient, namespace: str, name: str = "pull-secret") -> Obj:
    return client.create(
        SECRETS,
        {
            "metadata": {"name": name, "namespace": namespace},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(PULL_SECRET.encode()).decode()},
        },
    )


def create_infra_env(
    client: HubClient,
    namespace: str,
    name: str = "infraenv",
    *,
    agent_labels: dict[str, str] | None = None,
    auto_approve: bool = False,
    with_secret: bool = True,
    wait: bool = True,
) -> Obj:
    if with_secret:
        create_pull_secret(client, namespace)
    spec: Obj = {"pullSecretRef": {"name": "pull-secret"}, "sshAuthorizedKey": SSH_KEY}
    if agent_labels:
        spec["agentLabels"] = agent_labels
    if auto_approve:
        spec["agentApproval"] = {"autoApprove": True}
    client.create(INFRA_ENVS, {"metadata": {"name": name, "namespace": namespace}, "spec": spec})
    if not wait:
        return client.get(INFRA_ENVS, namespace, name) or {}
    return wait_until(lambda: ready_infra_env(client, namespace, name), f"InfraEnv {namespace}/{name} image")


def create_agent_node_pool(
    client: HubClient, namespace: str, selector: dict[str, str], replicas: int = 0, name: str = "np1"
) -> Obj:
    """An Agent-platform NodePool whose provider claims the Agents `selector` matches."""
    return client.create(
        NODE_POOLS,
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "clusterName": "c1",
                "replicas": replicas,
                "release": {"image": "quay.io/openshift-release-dev/ocp-release:4.17.10-x86_64"},
                "platform": {"type": "Agent", "agent": {"agentLabelSelector": {"matchLabels": selector}}},
            },
        },
    )


def ready_infra_env(client: HubClient, namespace: str, name: str) -> Obj | None:
    obj = client.get(INFRA_ENVS, namespace, name)
    cond = condition(obj, "ImageCreated")
    return obj if cond and cond["status"] == "True" else None


def fetch_ignition(client: HubClient, infra_env: Obj) -> str:
    url = infra_env["status"]["bootArtifacts"]["discoveryIgnitionURL"]
    # The URL is self-authenticating (api_key), like the real one.
    response = httpx.get(url, timeout=30.0, verify=client.verify)
    response.raise_for_status()
    return response.text


def infra_env_id_from(infra_env: Obj) -> str:
    url = infra_env["status"]["bootArtifacts"]["discoveryIgnitionURL"]
    return str(url.split("/infra-envs/")[1].split("/")[0])


def macs_for(index: int, count: int = 2) -> tuple[str, ...]:
    """Unique, well-formed MACs per test host (locally administered range)."""
    base = uuid.uuid4().int & 0xFFFFFFFF
    return tuple(
        "0a:" + ":".join(f"{((base + index * 16 + n) >> shift) & 0xFF:02x}" for shift in (24, 16, 8, 0))
        for n in range(count)
    )


def wait_agent(
    client: HubClient,
    namespace: str,
    name: str,
    predicate: Callable[[Obj], bool],
    what: str,
    timeout: float = DEADLINE_S,
) -> Obj:
    def probe() -> Obj | None:
        agent = client.get(AGENTS, namespace, name)
        return agent if agent is not None and predicate(agent) else None

    return wait_until(probe, f"Agent {namespace}/{name}: {what}", timeout)


def wait_state(client: HubClient, namespace: str, name: str, state: str, timeout: float = DEADLINE_S) -> Obj:
    return wait_agent(client, namespace, name, lambda a: host_state(a) == state, f"state {state}", timeout)


@dataclass
class AgentHistory:
    """Every (agent, state, stage) a watch saw in one namespace, so tests can check a state sequence
    even when zero timings make states last only one write."""

    lab: Lab
    namespace: str
    seen: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: threading.Event = field(default_factory=threading.Event)

    def start(self) -> AgentHistory:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._started.wait(DEADLINE_S), "agent watch did not start"
        return self

    def _run(self) -> None:
        path = AGENTS.collection_path(self.namespace)
        with httpx.Client(
            base_url=self.lab.url,
            headers={"Authorization": f"Bearer {self.lab.hub.token}"},
            timeout=None,
            verify=self.lab.client.verify,
        ) as http:
            # Each stream resumes where the last one ended: a state written and overwritten
            # between two streams would be missed by a watch that starts from the current objects.
            since: str | None = None
            while not self._stop.is_set():
                params = {"watch": "true", "timeoutSeconds": "2"}
                if since is not None:
                    params["resourceVersion"] = since
                try:
                    with http.stream("GET", path, params=params) as response:
                        self._started.set()
                        for line in response.iter_lines():
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            obj = event["object"]
                            if event.get("type") == "ERROR":  # expired: start from the objects again
                                since = None
                                break
                            since = obj["metadata"].get("resourceVersion", since)
                            if event.get("type") == "BOOKMARK":
                                continue
                            stage = (obj.get("status", {}).get("progress") or {}).get("currentStage")
                            self.seen.append((obj["metadata"]["name"], host_state(obj), stage))
                except httpx.HTTPError:
                    time.sleep(0.05)

    def states(self, name: str) -> list[str]:
        result: list[str] = []
        for agent, state, _ in list(self.seen):
            if agent == name and state and (not result or result[-1] != state):
                result.append(state)
        return result

    def stages(self, name: str) -> list[str]:
        result: list[str] = []
        for agent, _, stage in list(self.seen):
            if agent == name and stage and (not result or result[-1] != stage):
                result.append(stage)
        return result

    def stop(self) -> None:
        self._stop.set()


def is_subsequence(wanted: list[str], seen: list[str]) -> bool:
    iterator = iter(seen)
    return all(any(item == s for s in iterator) for item in wanted)
