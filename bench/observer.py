"""When hub objects changed, as seen by the harness's own watches (user `bench`, left out of counts).

The hub twin's timestamps have one-second resolution and a watch event arrives milliseconds after the
write, so the arrival time of each event is the change time the reaction figures start from (Agent
registered / installed / unbound) or end at (the ClusterOrder status write that tells about a worker).
Each watch runs on its own thread so a busy harness loop cannot delay the readings.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from contracts.hub import AGENT_MACHINE_REF_LABEL, AgentState

AGENTS_PATH = "/apis/agent-install.openshift.io/v1beta1/agents"
ORDERS_PATH = "/apis/osac.openshift.io/v1alpha1/clusterorders"
WORKER_ANNOTATION = "osac.openshift.io/worker"  # set on the Agent when it is handed to a worker slot


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    for cond in _dig(obj, "status", "conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            return bool(cond.get("status") == "True")
    return False


@dataclass
class AgentTimeline:
    """First sightings of the states the orchestrator waits for (wall-clock seconds)."""

    namespace: str
    name: str
    worker: str | None = None
    registered: float | None = None  # first seen with its NIC inventory (what correlation needs)
    approved: float | None = None  # first seen approved (the hand-off's first write, after correlation)
    claimed: float | None = None  # first seen claimed by the provider's Machine (or bound)
    installed: float | None = None  # first seen claimed and installed (what wait_agent_installed needs)
    unbound: float | None = None  # first seen released and unbound after having been claimed
    was_claimed: bool = False


@dataclass
class OrderTimeline:
    """Per worker slot: when a ClusterOrder status write first showed it in each phase, and first
    left it out after having shown it."""

    present: set[str] = field(default_factory=set)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # slot -> phase -> first seen
    gone: dict[str, float] = field(default_factory=dict)
    writes: int = 0


class HubObserver:
    def __init__(self, hub_url: str, token: str) -> None:
        self._url = hub_url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._ready = {AGENTS_PATH: threading.Event(), ORDERS_PATH: threading.Event()}
        self.agents: dict[str, AgentTimeline] = {}  # by uid
        self.orders: dict[str, OrderTimeline] = {}  # by namespace/name
        self.events = 0
        self.reconnects = 0

    def start(self, timeout: float = 30.0) -> HubObserver:
        for path in (AGENTS_PATH, ORDERS_PATH):
            thread = threading.Thread(target=self._run, args=(path,), name=f"observe{path}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for path, ready in self._ready.items():
            if not ready.wait(timeout):
                raise TimeoutError(f"the watch of {path} did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    # -- reading ---------------------------------------------------------------------------------

    def agent_timelines(self) -> list[AgentTimeline]:
        with self._lock:
            return list(self.agents.values())

    def order_timelines(self) -> dict[str, OrderTimeline]:
        with self._lock:
            return dict(self.orders)

    # -- watching --------------------------------------------------------------------------------

    def _run(self, path: str) -> None:
        version = ""
        with httpx.Client(base_url=self._url, headers=self._headers, timeout=None) as http:
            while not self._stop.is_set():
                params = {"watch": "true", "timeoutSeconds": "5", "allowWatchBookmarks": "true"}
                if version:
                    params["resourceVersion"] = version
                try:
                    with http.stream("GET", path, params=params) as response:
                        response.raise_for_status()
                        self._ready[path].set()
                        for line in response.iter_lines():
                            if self._stop.is_set():
                                return
                            if not line.strip():
                                continue
                            now = time.time()
                            event = json.loads(line)
                            obj = event.get("object") or {}
                            kind = event.get("type")
                            if kind == "ERROR":
                                version = ""  # expired: start over (sightings are first-seen anyway)
                                continue
                            version = str(_dig(obj, "metadata", "resourceVersion") or version)
                            if kind == "BOOKMARK":
                                continue
                            with self._lock:
                                self.events += 1
                                if path == AGENTS_PATH:
                                    self._on_agent(now, kind, obj)
                                else:
                                    self._on_order(now, obj)
                except httpx.HTTPError:
                    time.sleep(0.05)
                self.reconnects += 1

    def _on_agent(self, now: float, kind: str | None, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid or kind == "DELETED":
            return
        line = self.agents.get(uid)
        if line is None:
            line = self.agents[uid] = AgentTimeline(str(meta.get("namespace")), str(meta.get("name")))
        worker = (meta.get("annotations") or {}).get(WORKER_ANNOTATION)
        if worker:
            line.worker = str(worker)
        interfaces = _dig(obj, "status", "inventory", "interfaces") or []
        if line.registered is None and any(isinstance(i, dict) and i.get("macAddress") for i in interfaces):
            line.registered = now
        if line.approved is None and _dig(obj, "spec", "approved") is True:
            line.approved = now
        state = _dig(obj, "status", "debugInfo", "state")
        bound_to = _dig(obj, "spec", "clusterDeploymentName", "name")
        claimed = (
            AGENT_MACHINE_REF_LABEL in (meta.get("labels") or {})
            or bool(bound_to)
            or _condition_true(obj, "Bound")
        )
        installed = _condition_true(obj, "Installed") or state == AgentState.ADDED_TO_EXISTING_CLUSTER
        if claimed:
            line.was_claimed = True
            if line.claimed is None:
                line.claimed = now
            if installed and line.installed is None:
                line.installed = now
        unbound = not bound_to and (
            AgentState.is_unbound(state) or state == AgentState.UNBINDING_PENDING_USER_ACTION
        )
        if line.was_claimed and line.installed is not None and unbound and line.unbound is None:
            line.unbound = now

    def _on_order(self, now: float, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        workers = _dig(obj, "status", "workers")
        if not isinstance(workers, list):
            return
        line = self.orders.setdefault(key, OrderTimeline())
        line.writes += 1
        shown = {str(w.get("name")): w.get("phase") for w in workers if isinstance(w, dict)}
        for name, phase in shown.items():
            line.phases.setdefault(name, {}).setdefault(str(phase), now)
        for name in line.present - set(shown):
            line.gone.setdefault(name, now)
        line.present |= set(shown)
