"""What assisted-service does when a discovery agent registers: create or refresh its Agent CR.

A new host becomes an Agent named after the host id in the InfraEnv's namespace, labelled
`infraenvs.agent-install.openshift.io=<infraenv>` plus the InfraEnv's `spec.agentLabels`, with
`spec.approved = spec.agentApproval.autoApprove` and `spec.role: ""` (the real service leaves the
role empty; `status.role` shows the effective role), state `discovering-unbound`.

A host registering again keeps its Agent; where it goes depends on where it was:
installing -> `installing-pending-user-action` (it booted the ISO instead of the disk),
`added-to-existing-cluster` -> refused with 409 (the host is installed), anything else -> a fresh
discovery (`discovering-unbound`, or `discovering` while still bound), with the new inventory.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from lab.hub_controllers.agent_status import HostView, render_status
from lab.hub_controllers.constants import EventType, HostRole, HostStage, HostState, Label
from lab.hub_controllers.events import EventRecorder
from lab.hub_controllers.inventory import Inventory, to_agent_inventory
from lab.hub_controllers.kube import ApiError, KubeApi, Obj
from lab.hub_controllers.resources import AGENTS

log = logging.getLogger(__name__)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def valid_host_id(host_id: str) -> bool:
    return 0 < len(host_id) <= 253 and bool(_DNS_SUBDOMAIN.match(host_id))


class RegistrationRefused(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Registered:
    agent: Obj
    state: HostState
    created: bool


def is_bound(agent: Obj) -> bool:
    return bool((agent.get("spec", {}).get("clusterDeploymentName") or {}).get("name"))


def host_state_of(agent: Obj) -> HostState | None:
    raw = (agent.get("status", {}).get("debugInfo") or {}).get("state")
    try:
        return HostState(raw) if raw else None
    except ValueError:
        return None


def _state_after_registration(previous: HostState | None, bound: bool) -> HostState | None:
    """None means the registration is refused."""
    if previous in (
        HostState.INSTALLING,
        HostState.INSTALLING_IN_PROGRESS,
        HostState.INSTALLING_PENDING_USER_ACTION,
    ):
        return HostState.INSTALLING_PENDING_USER_ACTION
    if previous is HostState.ADDED_TO_EXISTING_CLUSTER:
        return None
    return HostState.DISCOVERING if bound else HostState.DISCOVERING_UNBOUND


class AgentRegistrar:
    def __init__(self, api: KubeApi, events: EventRecorder) -> None:
        self._api = api
        self._events = events

    async def register(self, infra_env: Obj, host_id: str, inventory: Inventory) -> Registered:
        m = infra_env["metadata"]
        spec = infra_env.get("spec") or {}
        labels: dict[str, str] = {Label.INFRAENV.value: m["name"], **(spec.get("agentLabels") or {})}
        body: Obj = {
            "metadata": {"name": host_id, "namespace": m["namespace"], "labels": labels},
            "spec": {
                "approved": bool((spec.get("agentApproval") or {}).get("autoApprove", False)),
                "role": HostRole.UNSET.value,
            },
        }
        created = True
        try:
            await self._api.create(AGENTS, body)
        except ApiError as exc:
            if not exc.is_already_exists:
                raise
            created = False

        outcome: dict[str, Any] = {}

        def apply(agent: Obj) -> Obj | None:
            previous = host_state_of(agent)
            state = _state_after_registration(previous, is_bound(agent))
            outcome["state"] = state
            if state is None:
                return None
            status = dict(agent.get("status") or {})
            status["inventory"] = to_agent_inventory(inventory)
            view = HostView(
                state=state,
                approved=bool(agent.get("spec", {}).get("approved")),
                bound=is_bound(agent),
                role=str(agent.get("spec", {}).get("role") or ""),
                stage=None,
            )
            if state is HostState.INSTALLING_PENDING_USER_ACTION:
                # Keep the stage it reached: the install is stuck there, not restarted.
                current = (status.get("progress") or {}).get("currentStage")
                stage = HostStage(current) if current in {s.value for s in HostStage} else None
                view = HostView(view.state, view.approved, view.bound, view.role, stage)
            agent["status"] = render_status(status, view)
            return agent

        stored = await self._api.mutate(AGENTS, m["namespace"], host_id, apply, subresource="status")
        if stored is None:
            raise RegistrationRefused(409, f"host {host_id} vanished while registering; retry")
        state = outcome.get("state")
        if state is None:
            raise RegistrationRefused(409, f"Host {host_id} is already installed")
        reason = "AgentRegistered" if created else "AgentReRegistered"
        await self._events.emit(
            stored, EventType.NORMAL, reason, f"Host {host_id} registered ({state.value})"
        )
        return Registered(stored, state, created)
