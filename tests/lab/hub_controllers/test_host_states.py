"""The assisted host state machine driven through Agent CRs: bind, install, unbind, re-register."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.hub_controllers.constants import WORKER_STAGES, HostState
from lab.hub_controllers.resources import AGENTS
from lab.hub_controllers.testing import (
    AgentHistory,
    Lab,
    condition,
    create_infra_env,
    fetch_ignition,
    host_state,
    is_subsequence,
    macs_for,
    start_lab,
    wait_agent,
    wait_state,
    wait_until,
)
from lab.hub_controllers.timings import AgentTimings

S = HostState


def _conditions(agent: dict[str, object]) -> dict[str, tuple[str, str]]:
    status = agent["status"]
    assert isinstance(status, dict)
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def _known_unbound_agent(lab: Lab, ns: str, host_id: str) -> tuple[str, str, tuple[str, ...]]:
    """Boot a host into a fresh InfraEnv; returns (agent name, its ignition, its MACs)."""
    infra_env = create_infra_env(lab.client, ns)
    ignition, macs = fetch_ignition(lab.client, infra_env), macs_for(1)
    lab.boot(host_id, macs, ignition)
    wait_state(lab.client, ns, host_id, S.KNOWN_UNBOUND)
    return host_id, ignition, macs


def _bind(lab: Lab, ns: str, name: str, approved: bool) -> None:
    lab.client.patch(
        AGENTS,
        ns,
        name,
        {
            "spec": {
                "approved": approved,
                "role": "worker",
                "clusterDeploymentName": {"name": "c1", "namespace": ns},
            }
        },
    )


def _unbind(lab: Lab, ns: str, name: str) -> None:
    lab.client.patch(AGENTS, ns, name, {"spec": {"clusterDeploymentName": None}})


def test_bound_and_approved_agent_installs_through_every_stage(lab: Lab, ns: str) -> None:
    name, ignition, macs = _known_unbound_agent(lab, ns, "host-install")
    history = AgentHistory(lab, ns).start()
    try:
        _bind(lab, ns, name, approved=True)
        agent = wait_state(lab.client, ns, name, S.ADDED_TO_EXISTING_CLUSTER)
        wait_until(lambda: S.ADDED_TO_EXISTING_CLUSTER in history.states(name), "the watch to see the end")
        path = [S.KNOWN_UNBOUND, S.BINDING, S.DISCOVERING, S.KNOWN, S.INSTALLING, S.INSTALLING_IN_PROGRESS]
        assert is_subsequence([*path, S.ADDED_TO_EXISTING_CLUSTER], history.states(name)), history.states(
            name
        )
        assert is_subsequence([s.value for s in WORKER_STAGES], history.stages(name)), history.stages(name)
    finally:
        history.stop()

    conditions = _conditions(agent)
    assert conditions["Installed"] == ("True", "InstallationCompleted")
    assert conditions["Bound"] == ("True", "Bound")
    assert conditions["Validated"] == ("True", "ValidationsPassing")
    assert conditions["Connected"] == ("True", "AgentIsConnected")
    assert conditions["RequirementsMet"] == ("True", "AgentInstallationStopped")
    assert conditions["SpecSynced"] == ("True", "SyncOK")
    assert agent["status"]["role"] == "worker"
    assert agent["status"]["kind"] == "AddToExistingClusterHost"
    assert agent["status"]["progress"]["currentStage"] == "Done"
    assert agent["status"]["progress"]["installationPercentage"] == 100

    # Unbinding an installed host needs the host rebooted: it waits for the user.
    _unbind(lab, ns, name)
    released = wait_state(lab.client, ns, name, S.UNBINDING_PENDING_USER_ACTION)
    assert _conditions(released)["Bound"] == ("False", "UnbindingPendingUserAction")
    assert _conditions(released)["Validated"][0] == "False"

    # Booting the discovery image again (what the wipe-and-reuse path does) frees it.
    lab.boot(name, macs, ignition)
    freed = wait_state(lab.client, ns, name, S.KNOWN_UNBOUND)
    assert _conditions(freed)["Bound"] == ("False", "Unbound")
    assert "progress" not in freed["status"] or not freed["status"]["progress"].get("currentStage")


def test_bound_but_unapproved_agent_waits_in_known_and_unbinds_back_to_known_unbound(
    lab: Lab, ns: str
) -> None:
    name, _, _ = _known_unbound_agent(lab, ns, "host-unapproved")
    history = AgentHistory(lab, ns).start()
    try:
        _bind(lab, ns, name, approved=False)
        known = wait_state(lab.client, ns, name, S.KNOWN)
        assert _conditions(known)["RequirementsMet"] == ("False", "AgentIsNotApproved")
        assert _conditions(known)["Bound"] == ("True", "Bound")

        _unbind(lab, ns, name)
        wait_agent(
            lab.client,
            ns,
            name,
            lambda a: (
                host_state(a) == S.KNOWN_UNBOUND and "spec" in a and "clusterDeploymentName" not in a["spec"]
            ),
            "back to known-unbound",
        )
        wait_until(lambda: history.states(name)[-1:] == [S.KNOWN_UNBOUND], "the watch to see known-unbound")
        states = history.states(name)
        assert is_subsequence([S.BINDING, S.KNOWN, S.UNBINDING, S.KNOWN_UNBOUND], states), states
        assert S.INSTALLING not in states  # approval is what starts an install
    finally:
        history.stop()


@pytest.fixture(scope="module")
def slow_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Discovery never finishes here, so an Agent stays in discovering-unbound."""
    timings = AgentTimings.zero().model_copy(update={"discovery_s": 3600})
    running = start_lab(Path(tmp_path_factory.mktemp("slow-hub")), timings)
    try:
        yield running
    finally:
        running.stop()


def test_bind_is_refused_until_the_agent_is_known_unbound(slow_lab: Lab) -> None:
    ns = slow_lab.new_namespace()
    infra_env = create_infra_env(slow_lab.client, ns)
    slow_lab.boot("host-early", macs_for(2), fetch_ignition(slow_lab.client, infra_env))
    wait_state(slow_lab.client, ns, "host-early", S.DISCOVERING_UNBOUND)
    _bind(slow_lab, ns, "host-early", approved=True)
    refused = wait_agent(
        slow_lab.client,
        ns,
        "host-early",
        lambda a: (condition(a, "SpecSynced") or {}).get("status") == "False",
        "SpecSynced=False",
    )
    assert condition(refused, "SpecSynced")["reason"] == "InputError"  # type: ignore[index]
    assert "known-unbound" in condition(refused, "SpecSynced")["message"]  # type: ignore[index]
    assert host_state(refused) == S.DISCOVERING_UNBOUND
