"""Agent fault knobs at /lab/v1/faults/agents and what each one does to hosts and Agents."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from lab.hub_controllers.agent_boot import BootOutcome
from lab.hub_controllers.constants import HostStage, HostState
from lab.hub_controllers.faults import (
    FAULTS_PATH,
    AgentFaults,
    ExtraNic,
    FaultTarget,
    InstallError,
    SlowRegistration,
)
from lab.hub_controllers.resources import AGENTS
from lab.hub_controllers.testing import (
    Lab,
    agent_macs,
    condition,
    create_infra_env,
    fetch_ignition,
    macs_for,
    wait_state,
    wait_until,
)

SetFaults = Callable[[AgentFaults], None]


def _bind(lab: Lab, ns: str, name: str) -> None:
    cluster = {"name": "c1", "namespace": ns}
    lab.client.patch(AGENTS, ns, name, {"spec": {"approved": True, "clusterDeploymentName": cluster}})


def test_fault_api_round_trip_validation_and_auth(lab: Lab, faults: SetFaults) -> None:
    http = lab.client.http
    assert http.get(FAULTS_PATH).json() == AgentFaults().model_dump(mode="json")
    wanted = AgentFaults(seed=3, never_register=FaultTarget(macs=["0A:00:00:00:00:99"], rate=0.25))
    assert http.put(FAULTS_PATH, json=wanted.model_dump(mode="json")).status_code == 200
    shown = http.get(FAULTS_PATH).json()
    assert shown["never_register"] == {"macs": ["0a:00:00:00:00:99"], "agents": [], "rate": 0.25}
    assert http.put(FAULTS_PATH, json={"never_register": {"rate": 2}}).status_code == 422
    assert http.put(FAULTS_PATH, json={"no_such_fault": {}}).status_code == 422
    assert httpx.get(f"{lab.url}{FAULTS_PATH}", timeout=30).status_code == 401
    assert http.delete(FAULTS_PATH).json() == AgentFaults().model_dump(mode="json")


def test_never_register_by_mac_or_rate(lab: Lab, ns: str, faults: SetFaults) -> None:
    ignition = fetch_ignition(lab.client, create_infra_env(lab.client, ns))
    silent = macs_for(1)
    faults(AgentFaults(never_register=FaultTarget(macs=[silent[1]])))
    lab.boot("host-silent", silent, ignition)
    lab.boot("host-loud", macs_for(2), ignition)
    wait_state(lab.client, ns, "host-loud", HostState.KNOWN_UNBOUND)
    wait_until(lambda: lab.boot_seam.records_for("host-silent"), "the silent host's boot record")
    assert [r.outcome for r in lab.boot_seam.records_for("host-silent")] == [BootOutcome.SUPPRESSED]

    faults(AgentFaults(never_register=FaultTarget(rate=1.0)))
    lab.boot("host-unlucky", macs_for(3), ignition)
    wait_until(lambda: lab.boot_seam.records_for("host-unlucky"), "the unlucky host's boot record")
    assert [r.outcome for r in lab.boot_seam.records_for("host-unlucky")] == [BootOutcome.SUPPRESSED]
    assert [a["metadata"]["name"] for a in lab.client.list(AGENTS, ns)] == ["host-loud"]


def test_slow_registration_delays_only_its_victims(lab: Lab, ns: str, faults: SetFaults) -> None:
    ignition = fetch_ignition(lab.client, create_infra_env(lab.client, ns))
    faults(AgentFaults(slow_registration=SlowRegistration(agents=["host-slow"], extra_delay_s=3600)))
    lab.boot("host-slow", macs_for(4), ignition)
    lab.boot("host-fast", macs_for(5), ignition)  # booted later, registers first
    wait_state(lab.client, ns, "host-fast", HostState.KNOWN_UNBOUND)
    assert lab.boot_seam.records_for("host-slow") == []
    assert lab.client.get(AGENTS, ns, "host-slow") is None


def test_install_error_by_agent_or_mac(lab: Lab, ns: str, faults: SetFaults) -> None:
    ignition = fetch_ignition(lab.client, create_infra_env(lab.client, ns))
    by_mac = macs_for(6)
    faults(
        AgentFaults(
            install_error=InstallError(
                agents=["host-broken"],
                macs=[by_mac[0]],
                stage=HostStage.WAITING_FOR_IGNITION,
                message="disk on fire",
            )
        )
    )
    for name, macs in (("host-broken", macs_for(7)), ("host-broken-nic", by_mac), ("host-fine", macs_for(8))):
        lab.boot(name, macs, ignition)
        wait_state(lab.client, ns, name, HostState.KNOWN_UNBOUND)
        _bind(lab, ns, name)
    for name in ("host-broken", "host-broken-nic"):
        failed = wait_state(lab.client, ns, name, HostState.ERROR)
        installed = condition(failed, "Installed") or {}
        assert (installed.get("status"), installed.get("reason")) == ("False", "InstallationFailed")
        assert "disk on fire" in installed.get("message", "")
        assert failed["status"]["progress"]["currentStage"] == HostStage.WAITING_FOR_IGNITION.value
    wait_state(lab.client, ns, "host-fine", HostState.ADDED_TO_EXISTING_CLUSTER)


def test_installing_pending_user_action_when_the_host_boots_the_iso_again(
    lab: Lab, ns: str, faults: SetFaults
) -> None:
    ignition = fetch_ignition(lab.client, create_infra_env(lab.client, ns))
    macs = macs_for(9)
    faults(AgentFaults(installing_pending_user_action=FaultTarget(macs=[macs[0]])))
    lab.boot("host-bootorder", macs, ignition)
    wait_state(lab.client, ns, "host-bootorder", HostState.KNOWN_UNBOUND)
    _bind(lab, ns, "host-bootorder")
    stuck = wait_state(lab.client, ns, "host-bootorder", HostState.INSTALLING_PENDING_USER_ACTION)
    assert stuck["status"]["progress"]["currentStage"] == HostStage.REBOOTING.value
    installed = condition(stuck, "Installed") or {}
    assert (installed.get("status"), installed.get("reason")) == ("False", "InstallationInProgress")
    assert "boot order" in stuck["status"]["debugInfo"]["stateInfo"]


def test_duplicate_mac_registers_a_second_agent_with_the_same_mac(
    lab: Lab, ns: str, faults: SetFaults
) -> None:
    ignition = fetch_ignition(lab.client, create_infra_env(lab.client, ns))
    macs = macs_for(10)
    faults(AgentFaults(duplicate_mac=FaultTarget(agents=["host-twin"])))
    lab.boot("host-twin", macs, ignition)
    records = wait_until(
        lambda: (r := lab.boot_seam.records_for("host-twin")) and len(r) == 2 and r, "both registrations"
    )
    phantom = next(r for r in records if r.duplicate_of == "host-twin")
    assert phantom.outcome is BootOutcome.REGISTERED and phantom.agent_name
    real = wait_state(lab.client, ns, "host-twin", HostState.KNOWN_UNBOUND)
    twin = wait_state(lab.client, ns, phantom.agent_name, HostState.KNOWN_UNBOUND)
    assert agent_macs(real) == set(macs)
    assert agent_macs(real) & agent_macs(twin) == {macs[0]}


def test_extra_nic_reports_one_more_interface_than_the_host_has(lab: Lab, ns: str, faults: SetFaults) -> None:
    ignition = fetch_ignition(lab.client, create_infra_env(lab.client, ns))
    macs = macs_for(11)
    faults(AgentFaults(extra_nic=ExtraNic(agents=["host-usb"])))
    lab.boot("host-usb", macs, ignition)
    agent = wait_state(lab.client, ns, "host-usb", HostState.KNOWN_UNBOUND)
    extra = agent_macs(agent) - set(macs)
    assert agent_macs(agent) >= set(macs) and len(extra) == 1
    # Locally administered, like a USB gadget's.
    assert int(next(iter(extra)).split(":")[0], 16) & 0x02
