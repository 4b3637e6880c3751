"""The Agent CR status for a host state: conditions, state info, role, kind and progress.

Pure functions; the condition tables mirror assisted-service's agent controller (`connected`,
`requirementsMet`, `validated`, `installed`, `bound`), so every state shows the same condition
statuses and reasons the real service writes (e.g. `Installed=True/InstallationCompleted` in
`added-to-existing-cluster`, `Bound=False/UnbindingPendingUserAction` after an installed host is
unbound).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lab.hub_controllers.constants import (
    UNBOUND_STATES,
    WORKER_STAGES,
    AgentConditionType,
    AgentReason,
    ConditionStatus,
    HostKind,
    HostRole,
    HostStage,
    HostState,
)

Condition = dict[str, str]

_STATE_INFO: dict[HostState, str] = {
    HostState.DISCOVERING_UNBOUND: "Waiting for host to send hardware details",
    HostState.KNOWN_UNBOUND: "Host is ready to be bound to a cluster",
    HostState.INSUFFICIENT_UNBOUND: "Host does not meet the minimum hardware requirements",
    HostState.DISCONNECTED_UNBOUND: "Host has stopped communicating with the installation service",
    HostState.BINDING: "Host is waiting to be bound to the cluster",
    HostState.DISCOVERING: "Waiting for host to send hardware details",
    HostState.KNOWN: "Host is ready to be installed",
    HostState.INSUFFICIENT: "Host does not meet the minimum hardware requirements",
    HostState.DISCONNECTED: "Host has stopped communicating with the installation service",
    HostState.PENDING_FOR_INPUT: "Waiting for user input",
    HostState.INSTALLING: "Installation is in progress",
    HostState.INSTALLING_IN_PROGRESS: "Installation is in progress",
    HostState.INSTALLING_PENDING_USER_ACTION: (
        "Expected the host to boot from disk, but it booted the installation image - please reboot "
        "and fix boot order to boot from disk"
    ),
    HostState.ADDED_TO_EXISTING_CLUSTER: (
        "Host has rebooted and no further updates will be posted. Please check console for "
        "progress and to possibly approve pending CSRs"
    ),
    HostState.ERROR: "Host failed to install",
    HostState.UNBINDING: "Host is being unbound from the cluster",
    HostState.UNBINDING_PENDING_USER_ACTION: (
        "Host is unbound from the cluster and needs to be rebooted with the discovery image to be used again"
    ),
}

_VALIDATIONS: dict[str, list[dict[str, str]]] = {
    "hardware": [
        {"id": "has-inventory", "status": "success", "message": "Valid inventory exists for the host"},
        {"id": "has-min-cpu-cores", "status": "success", "message": "Sufficient CPU cores"},
        {"id": "has-min-memory", "status": "success", "message": "Sufficient minimum RAM"},
        {"id": "has-min-valid-disks", "status": "success", "message": "Sufficient disk capacity"},
    ],
    "network": [
        {"id": "connected", "status": "success", "message": "Host is connected"},
        {"id": "ntp-synced", "status": "success", "message": "Host NTP is synced"},
    ],
}

_INSTALLING = {
    HostState.INSTALLING,
    HostState.INSTALLING_IN_PROGRESS,
    HostState.INSTALLING_PENDING_USER_ACTION,
}
_UNBINDING = {HostState.UNBINDING, HostState.UNBINDING_PENDING_USER_ACTION}
_NOT_STARTED = {
    HostState.INSUFFICIENT,
    HostState.INSUFFICIENT_UNBOUND,
    HostState.DISCONNECTED,
    HostState.DISCONNECTED_UNBOUND,
    HostState.DISCOVERING,
    HostState.DISCOVERING_UNBOUND,
    HostState.KNOWN,
    HostState.KNOWN_UNBOUND,
    HostState.PENDING_FOR_INPUT,
}


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(kind: AgentConditionType, status: ConditionStatus, reason: AgentReason, message: str) -> Condition:
    return {"type": kind.value, "status": status.value, "reason": reason.value, "message": message}


def _connected(state: HostState) -> Condition:
    if state in (HostState.DISCONNECTED, HostState.DISCONNECTED_UNBOUND):
        return _cond(
            AgentConditionType.CONNECTED,
            ConditionStatus.FALSE,
            AgentReason.AGENT_DISCONNECTED,
            "The agent has not contacted the installation service in some time, user action should be taken",
        )
    return _cond(
        AgentConditionType.CONNECTED,
        ConditionStatus.TRUE,
        AgentReason.AGENT_CONNECTED,
        "The agent's connection to the installation service is unimpaired",
    )


def _requirements_met(state: HostState, approved: bool) -> Condition:
    t = AgentConditionType.REQUIREMENTS_MET
    if state in (HostState.KNOWN, HostState.KNOWN_UNBOUND):
        if approved:
            return _cond(
                t,
                ConditionStatus.TRUE,
                AgentReason.AGENT_READY,
                "The agent is ready to begin the installation",
            )
        return _cond(t, ConditionStatus.FALSE, AgentReason.AGENT_NOT_APPROVED, "The agent is not approved")
    if state in _INSTALLING:
        return _cond(
            t,
            ConditionStatus.TRUE,
            AgentReason.AGENT_ALREADY_INSTALLING,
            "Installation already started and is in progress",
        )
    if state in (HostState.ADDED_TO_EXISTING_CLUSTER, HostState.ERROR):
        return _cond(
            t, ConditionStatus.TRUE, AgentReason.AGENT_INSTALLATION_STOPPED, "The agent installation stopped"
        )
    if state is HostState.BINDING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.BINDING,
            "The agent is currently binding to a cluster deployment",
        )
    if state in _UNBINDING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.UNBINDING,
            "The agent is currently unbinding from a cluster deployment",
        )
    return _cond(
        t,
        ConditionStatus.FALSE,
        AgentReason.AGENT_NOT_READY,
        "The agent is not ready to begin the installation",
    )


def _validated(state: HostState, validations_known: bool) -> Condition:
    t = AgentConditionType.VALIDATED
    if state is HostState.BINDING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.BINDING,
            "The agent is currently binding to a cluster deployment",
        )
    if state in _UNBINDING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.UNBINDING,
            "The agent is currently unbinding from a cluster deployment",
        )
    if state in (HostState.INSUFFICIENT, HostState.INSUFFICIENT_UNBOUND):
        return _cond(
            t, ConditionStatus.FALSE, AgentReason.VALIDATIONS_FAILING, "The agent's validations are failing:"
        )
    if not validations_known:
        return _cond(
            t,
            ConditionStatus.UNKNOWN,
            AgentReason.VALIDATIONS_UNKNOWN,
            "The agent's validations have not yet been calculated",
        )
    return _cond(
        t, ConditionStatus.TRUE, AgentReason.VALIDATIONS_PASSING, "The agent's validations are passing"
    )


def _installed(state: HostState, state_info: str) -> Condition:
    t = AgentConditionType.INSTALLED
    if state is HostState.ADDED_TO_EXISTING_CLUSTER:
        return _cond(
            t, ConditionStatus.TRUE, AgentReason.INSTALLED, f"The installation has completed: {state_info}"
        )
    if state is HostState.ERROR:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.INSTALLATION_FAILED,
            f"The installation has failed: {state_info}",
        )
    if state in _NOT_STARTED:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.INSTALLATION_NOT_STARTED,
            "The installation has not yet started",
        )
    if state in _INSTALLING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.INSTALLATION_IN_PROGRESS,
            f"The installation is in progress: {state_info}",
        )
    if state is HostState.BINDING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.BINDING,
            "The agent is currently binding to a cluster deployment",
        )
    return _cond(
        t,
        ConditionStatus.FALSE,
        AgentReason.UNBINDING,
        "The agent is currently unbinding from a cluster deployment",
    )


def _bound(state: HostState) -> Condition:
    t = AgentConditionType.BOUND
    if state is HostState.BINDING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.BINDING,
            "The agent is currently binding to a cluster deployment",
        )
    if state is HostState.UNBINDING:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.UNBINDING,
            "The agent is currently unbinding from a cluster deployment",
        )
    if state is HostState.UNBINDING_PENDING_USER_ACTION:
        return _cond(
            t,
            ConditionStatus.FALSE,
            AgentReason.UNBINDING_PENDING_USER_ACTION,
            "The agent is currently unbinding; Pending host reboot from infraenv image",
        )
    if state in UNBOUND_STATES:
        return _cond(
            t, ConditionStatus.FALSE, AgentReason.UNBOUND, "The agent is not bound to any cluster deployment"
        )
    return _cond(t, ConditionStatus.TRUE, AgentReason.BOUND, "The agent is bound to a cluster deployment")


def _spec_synced(error: str | None) -> Condition:
    if error:
        return _cond(
            AgentConditionType.SPEC_SYNCED,
            ConditionStatus.FALSE,
            AgentReason.INPUT_ERROR,
            f"The Spec could not be synced due to an input error: {error}",
        )
    return _cond(
        AgentConditionType.SPEC_SYNCED,
        ConditionStatus.TRUE,
        AgentReason.SYNC_OK,
        "The Spec has been successfully applied",
    )


def merge_conditions(old: list[Condition], new: list[Condition], now: str) -> list[Condition]:
    """Keep `lastTransitionTime` of conditions whose status did not change."""
    previous = {c.get("type"): c for c in old}
    merged = []
    for cond in new:
        before = previous.get(cond["type"])
        stamp = (
            before.get("lastTransitionTime") if before and before.get("status") == cond["status"] else None
        )
        merged.append({**cond, "lastTransitionTime": stamp or now})
    return merged


@dataclass(frozen=True)
class HostView:
    """Everything the status of an Agent is computed from."""

    state: HostState
    approved: bool
    bound: bool
    role: str = ""
    stage: HostStage | None = None
    state_info: str | None = None
    spec_sync_error: str | None = None


def state_info_for(state: HostState) -> str:
    return _STATE_INFO[state]


def render_status(previous: dict[str, Any], view: HostView) -> dict[str, Any]:
    """A new `status` for an Agent, built from the previous one (inventory etc. are kept)."""
    now = now_rfc3339()
    status = dict(previous)
    info = view.state_info or _STATE_INFO[view.state]
    validations_known = view.state not in (HostState.DISCOVERING_UNBOUND, HostState.DISCOVERING)
    conditions = [
        _spec_synced(view.spec_sync_error),
        _connected(view.state),
        _requirements_met(view.state, view.approved),
        _validated(view.state, validations_known),
        _installed(view.state, info),
        _bound(view.state),
    ]
    status["conditions"] = merge_conditions(previous.get("conditions") or [], conditions, now)
    debug = dict(previous.get("debugInfo") or {})
    debug.update(state=view.state.value, stateInfo=info)
    status["debugInfo"] = debug
    if validations_known:
        status["validationsInfo"] = _VALIDATIONS
    else:
        status.pop("validationsInfo", None)
    status["role"] = (view.role or HostRole.WORKER.value) if view.bound else HostRole.AUTO_ASSIGN.value
    status["kind"] = HostKind.ADD_TO_EXISTING_CLUSTER.value if view.bound else HostKind.HOST.value
    status["progress"] = _progress(previous.get("progress") or {}, view, now)
    return status


def _progress(previous: dict[str, Any], view: HostView, now: str) -> dict[str, Any]:
    if view.state is HostState.ADDED_TO_EXISTING_CLUSTER:
        stage: HostStage | None = HostStage.DONE
    elif view.state in _INSTALLING or view.state is HostState.ERROR:
        stage = view.stage
    else:
        return {}  # not installing: no progress to show (a re-registered host starts over)
    if stage is None:
        return {"progressStages": [s.value for s in WORKER_STAGES], "installationPercentage": 0}
    index = WORKER_STAGES.index(stage)
    same_stage = previous.get("currentStage") == stage.value
    return {
        "currentStage": stage.value,
        "progressStages": [s.value for s in WORKER_STAGES],
        "installationPercentage": int(100 * (index + 1) / len(WORKER_STAGES)),
        "stageStartTime": previous.get("stageStartTime", now) if same_stage else now,
        "stageUpdateTime": now,
    }
