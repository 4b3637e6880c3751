"""assisted-service's host state machine, driven through Agent CRs (late-binding, day-2 path).

    discovering-unbound -> known-unbound -(clusterDeploymentName set)-> binding -> discovering
    -> known -(approved)-> installing -> installing-in-progress (worker stages) -> added-to-existing-cluster

Binding is accepted only from `known-unbound` (elsewhere `SpecSynced=False/InputError` until it
is). Clearing `clusterDeploymentName` before the install started goes `unbinding` ->
`discovering-unbound` -> `known-unbound`; after it started (installing…, added-to-existing-cluster,
error) it goes to `unbinding-pending-user-action`, where the host stays until it boots the
discovery image again and re-registers. Each step waits its `AgentTimings` duration; Agents
without `status.debugInfo.state` (not registered through the twin) are left alone.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from lab.hub_controllers.agent_status import HostView, render_status
from lab.hub_controllers.constants import (
    INSTALL_STARTED_STATES,
    UNBOUND_STATES,
    WORKER_STAGES,
    EventType,
    HostStage,
    HostState,
)
from lab.hub_controllers.events import EventRecorder
from lab.hub_controllers.faults import FaultBook, FaultKind
from lab.hub_controllers.informer import Informer
from lab.hub_controllers.kube import KubeApi, Obj, split_key
from lab.hub_controllers.registration import host_state_of, is_bound
from lab.hub_controllers.resources import AGENTS
from lab.hub_controllers.timings import AgentTimings
from lab.hub_controllers.workqueue import Controller

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    state: HostState
    stage: HostStage | None = None
    state_info: str | None = None


@dataclass(frozen=True)
class InstallFate:
    fails: bool
    boots_iso_again: bool


def stage_of(agent: Obj) -> HostStage | None:
    raw = (agent.get("status", {}).get("progress") or {}).get("currentStage")
    try:
        return HostStage(raw) if raw else None
    except ValueError:
        return None


def _agent_macs(agent: Obj) -> list[str]:
    interfaces = (agent.get("status", {}).get("inventory") or {}).get("interfaces") or []
    return [str(i.get("macAddress")) for i in interfaces if i.get("macAddress")]


def _summary(status: dict[str, Any]) -> tuple[object, ...]:
    """What a refresh may change; timestamps excluded so that an idle Agent is never rewritten."""
    conditions = status.get("conditions") or []
    return (
        tuple((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conditions),
        status.get("role"),
        status.get("kind"),
        (status.get("debugInfo") or {}).get("state"),
    )


class AgentStateController(Controller):
    name = "assisted-host-state"
    # Two workers, the default. 16 (assisted-service moves every host on its own) installed hosts
    # sooner but starved the rest of the process: claims and the orchestrator's requests waited
    # longer, measured side by side at 500 workers (bench/README.md, round 7).

    def __init__(
        self,
        api: KubeApi,
        agents: Informer,
        *,
        timings: AgentTimings,
        faults: FaultBook,
        events: EventRecorder,
    ) -> None:
        super().__init__()
        self._api, self._agents, self._timings, self._faults, self._events = (
            api,
            agents,
            timings,
            faults,
            events,
        )
        self._entered: dict[str, tuple[str, float]] = {}  # uid -> (state|stage, loop time first seen)
        self._fates: dict[str, InstallFate] = {}  # uid -> fault decisions for the current install
        self._uids: dict[str, str] = {}  # key -> uid, to drop the two tables above when an Agent goes
        self.watch(agents)

    def _forget(self, key: str) -> None:
        uid = self._uids.pop(key, None)
        if uid is not None:
            self._entered.pop(uid, None)
            self._fates.pop(uid, None)

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def reconcile(self, key: str) -> float | None:
        agent = self._agents.get(key)
        if agent is None:
            self._forget(key)
            return None
        uid = str(agent["metadata"].get("uid") or key)
        if self._uids.get(key) not in (None, uid):
            self._forget(key)  # a re-created namesake starts from scratch
        self._uids[key] = uid
        state = host_state_of(agent)
        if state is None or agent["metadata"].get("deletionTimestamp"):
            return None
        stage = stage_of(agent)
        marker = f"{state.value}|{stage.value if stage else ''}"
        entered = self._entered.get(uid)
        if entered is None or entered[0] != marker:
            entered = self._entered[uid] = (marker, self._now())
        elapsed = self._now() - entered[1]

        decision = self._next(agent, uid, state, stage, elapsed)
        if isinstance(decision, float):
            await self._refresh(agent, state, stage)
            return decision
        if decision is None:
            await self._refresh(agent, state, stage)
            return None
        await self._transition(agent, state, stage, decision)
        return None  # the write comes back as a watch event, which schedules the next step

    # -- the state table ---------------------------------------------------------------------------
    def _next(
        self, agent: Obj, uid: str, state: HostState, stage: HostStage | None, elapsed: float
    ) -> Step | float | None:
        """The step to take now, or seconds until one may be due, or None (nothing to do)."""
        t = self._timings
        bound = is_bound(agent)
        approved = bool(agent.get("spec", {}).get("approved"))

        def after(seconds: float, step: Step) -> Step | float:
            return step if elapsed >= seconds else seconds - elapsed

        if state is HostState.DISCOVERING_UNBOUND:
            return after(t.discovery_s, Step(HostState.KNOWN_UNBOUND))
        if state is HostState.KNOWN_UNBOUND:
            return Step(HostState.BINDING) if bound else None
        if state in UNBOUND_STATES or state is HostState.UNBINDING_PENDING_USER_ACTION:
            return None  # bind refused here; see _spec_error
        if state is HostState.UNBINDING:
            return after(t.unbinding_s, Step(HostState.DISCOVERING_UNBOUND))
        if not bound:
            if state in INSTALL_STARTED_STATES:
                return Step(HostState.UNBINDING_PENDING_USER_ACTION)
            return Step(HostState.UNBINDING)
        if state is HostState.BINDING:
            return after(t.binding_s, Step(HostState.DISCOVERING))
        if state is HostState.DISCOVERING:
            return after(t.discovery_s, Step(HostState.KNOWN))
        if state is HostState.KNOWN:
            # Day-2: a bound, approved, known host is installed without further ado.
            return after(t.install_start_s, Step(HostState.INSTALLING)) if approved else None
        if state is HostState.INSTALLING:
            return after(t.install_start_s, Step(HostState.INSTALLING_IN_PROGRESS, WORKER_STAGES[0]))
        if state is HostState.INSTALLING_IN_PROGRESS:
            return self._next_stage(agent, uid, stage, elapsed)
        return (
            None  # installing-pending-user-action, added-to-existing-cluster, error, …: terminal while bound
        )

    def _next_stage(self, agent: Obj, uid: str, stage: HostStage | None, elapsed: float) -> Step | float:
        if stage is None:
            return Step(HostState.INSTALLING_IN_PROGRESS, WORKER_STAGES[0])
        if elapsed < self._timings.install_stage_s:
            return self._timings.install_stage_s - elapsed
        fate = self._fate(agent, uid)
        error = self._faults.config.install_error
        if fate.fails and stage is error.stage:
            return Step(HostState.ERROR, stage, f"Host failed to install: {error.message}")
        if fate.boots_iso_again and stage is HostStage.REBOOTING:
            return Step(HostState.INSTALLING_PENDING_USER_ACTION, stage)
        if stage is HostStage.DONE:
            return Step(HostState.ADDED_TO_EXISTING_CLUSTER, HostStage.DONE)
        return Step(HostState.INSTALLING_IN_PROGRESS, WORKER_STAGES[WORKER_STAGES.index(stage) + 1])

    def _fate(self, agent: Obj, uid: str) -> InstallFate:
        """Fault draws happen once per install, when it first needs them."""
        fate = self._fates.get(uid)
        if fate is None:
            name, macs = agent["metadata"]["name"], _agent_macs(agent)
            fate = self._fates[uid] = InstallFate(
                fails=self._faults.decide(FaultKind.INSTALL_ERROR, name, macs),
                boots_iso_again=self._faults.decide(FaultKind.INSTALLING_PENDING_USER_ACTION, name, macs),
            )
        return fate

    @staticmethod
    def _spec_error(agent: Obj, state: HostState) -> str | None:
        if is_bound(agent) and (state in UNBOUND_STATES or state is HostState.UNBINDING_PENDING_USER_ACTION):
            if state is not HostState.KNOWN_UNBOUND:
                return f"Cannot bind host in state {state.value}: binding is accepted only in known-unbound"
        return None

    # -- writes ----------------------------------------------------------------------------------
    def _view(self, agent: Obj, step: Step) -> HostView:
        spec = agent.get("spec") or {}
        return HostView(
            state=step.state,
            approved=bool(spec.get("approved")),
            bound=is_bound(agent),
            role=str(spec.get("role") or ""),
            stage=step.stage,
            state_info=step.state_info,
            spec_sync_error=self._spec_error(agent, step.state),
        )

    async def _transition(self, agent: Obj, state: HostState, stage: HostStage | None, step: Step) -> None:
        namespace, name = split_key(f"{agent['metadata'].get('namespace', '')}/{agent['metadata']['name']}")
        uid = str(agent["metadata"].get("uid") or name)

        def apply(fresh: Obj) -> Obj | None:
            # The step was decided on the cached object; only apply it to that same state.
            if host_state_of(fresh) is not state or stage_of(fresh) is not stage:
                return None
            fresh["status"] = render_status(fresh.get("status") or {}, self._view(fresh, step))
            return fresh

        stored = await self._api.mutate(AGENTS, namespace, name, apply, subresource="status", cached=agent)
        if stored is None or host_state_of(stored) is not step.state or stage_of(stored) is not step.stage:
            return
        self._entered[uid] = (f"{step.state.value}|{step.stage.value if step.stage else ''}", self._now())
        if step.state in (HostState.KNOWN, HostState.KNOWN_UNBOUND, HostState.UNBINDING_PENDING_USER_ACTION):
            self._fates.pop(uid, None)  # a later install draws its faults afresh
        await self._announce(stored, step)

    async def _refresh(self, agent: Obj, state: HostState, stage: HostStage | None) -> None:
        """Same state, but spec changes (approval, role, a refused bind) may change conditions."""
        status = agent.get("status") or {}
        step = Step(state, stage, (status.get("debugInfo") or {}).get("stateInfo"))
        if _summary(render_status(status, self._view(agent, step))) == _summary(status):
            return
        m = agent["metadata"]

        def apply(fresh: Obj) -> Obj | None:
            if host_state_of(fresh) is not state:
                return None
            fresh_status = fresh.get("status") or {}
            rendered = render_status(fresh_status, self._view(fresh, step))
            if _summary(rendered) == _summary(fresh_status):
                return None
            fresh["status"] = rendered
            return fresh

        await self._api.mutate(
            AGENTS, m.get("namespace"), m["name"], apply, subresource="status", cached=agent
        )

    async def _announce(self, agent: Obj, step: Step) -> None:
        name = agent["metadata"]["name"]
        if step.state is HostState.BINDING:
            await self._events.emit(
                agent, EventType.NORMAL, "Binding", f"Host {name} is binding to a cluster"
            )
        elif step.state is HostState.ADDED_TO_EXISTING_CLUSTER:
            await self._events.emit(
                agent, EventType.NORMAL, "InstallationCompleted", f"Host {name} joined the cluster"
            )
        elif step.state is HostState.ERROR:
            await self._events.emit(agent, EventType.WARNING, "InstallationFailed", step.state_info or "")
        elif step.state is HostState.INSTALLING_PENDING_USER_ACTION:
            await self._events.emit(
                agent,
                EventType.WARNING,
                "InstallingPendingUserAction",
                f"Host {name} booted the discovery image again",
            )
        elif step.state is HostState.UNBINDING_PENDING_USER_ACTION:
            await self._events.emit(
                agent,
                EventType.NORMAL,
                "UnbindingPendingUserAction",
                f"Host {name} must be rebooted to be reused",
            )
