"""The controllers as API clients under hub faults: 500s, conflicts, cut watch streams, a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.hub.testing import CONTROLLER_USER
from lab.hub_controllers.constants import HostState
from lab.hub_controllers.resources import AGENT_MACHINES, AGENTS, MACHINES
from lab.hub_controllers.testing import (
    Lab,
    Obj,
    create_agent_node_pool,
    create_infra_env,
    fetch_ignition,
    host_state,
    lab_hub,
    macs_for,
    start_lab,
    wait_state,
    wait_until,
)

API_FAULTS = "/lab/v1/faults/api"
SELECTOR = {"osac.openshift.io/clusterorder": "chaos", "osac.openshift.io/resource_class": "bm"}


@pytest.fixture(scope="module")
def chaos_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    running = start_lab(Path(tmp_path_factory.mktemp("chaos-hub")))
    try:
        yield running
    finally:
        running.stop()


def test_cut_watches_are_resumed_and_changes_still_seen(chaos_lab: Lab) -> None:
    lab = chaos_lab
    ns = lab.new_namespace()
    create_infra_env(lab.client, ns, "before")
    response = lab.client.http.post(f"{API_FAULTS}/close-watches")
    response.raise_for_status()
    assert response.json()["watchesCut"] >= 1
    create_infra_env(lab.client, ns, "after", with_secret=False)  # seen only through a new watch


def test_everything_converges_under_api_errors_conflicts_and_watch_cuts(chaos_lab: Lab) -> None:
    lab = chaos_lab
    ns = lab.new_namespace()
    faults = {
        "seed": 11,
        "errors": [
            {"code": 500, "users": [CONTROLLER_USER], "rate": 0.15},
            {"code": 409, "users": [CONTROLLER_USER], "verbs": ["update", "patch"], "rate": 0.3},
        ],
        "watch": {"closeRate": 0.2, "users": [CONTROLLER_USER]},
    }
    lab.client.http.put(API_FAULTS, json=faults).raise_for_status()
    try:
        infra_env = create_infra_env(lab.client, ns, agent_labels=SELECTOR, auto_approve=True)
        ignition = fetch_ignition(lab.client, infra_env)
        for index in range(2):
            lab.boot(f"chaos-{index}", macs_for(index), ignition)
        create_agent_node_pool(lab.client, ns, SELECTOR, replicas=2)
        for index in range(2):
            # Retries back off up to 5 s per failure: allow a slow machine plenty of time.
            wait_state(lab.client, ns, f"chaos-{index}", HostState.ADDED_TO_EXISTING_CLUSTER, timeout=120)
        status = lab.client.http.get(API_FAULTS).json()
        assert sum(status["injectedErrors"]) > 0 and status["watchesCut"] > 0  # the faults did bite
    finally:
        lab.client.http.delete(API_FAULTS).raise_for_status()

    # Exactly one Machine and one AgentMachine per Agent despite retries, each naming the Agent that
    # names it.
    def consistent() -> bool:
        machines = {m["metadata"]["name"]: m for m in lab.client.list(MACHINES, ns)}
        agent_machines = {am["metadata"]["uid"]: am for am in lab.client.list(AGENT_MACHINES, ns)}
        claims = {
            a["metadata"]["labels"].get("agentMachineRef"): a["metadata"]["name"]
            for a in lab.client.list(AGENTS, ns)
        }
        return (
            len(machines) == 2
            and sorted(am["metadata"]["name"] for am in agent_machines.values()) == sorted(machines)
            and set(claims) == set(agent_machines)
            and all(
                _names(am, machines[am["metadata"]["name"]], claims[uid])
                for uid, am in agent_machines.items()
            )
        )

    wait_until(consistent, "Machines, AgentMachines and claims to agree", timeout=60)


def _names(agent_machine: Obj, machine: Obj, agent: str) -> bool:
    """Whether an installed Agent's AgentMachine and Machine both name it."""
    provider_id = f"agent://{agent}"
    return (
        agent_machine["spec"].get("providerID") == provider_id
        and (agent_machine.get("status") or {}).get("agentRef", {}).get("name") == agent
        and (agent_machine.get("status") or {}).get("ready") is True
        and machine["spec"].get("providerID") == provider_id
    )


def test_a_restarted_provider_adopts_the_claim_its_agent_machine_does_not_record_yet(chaos_lab: Lab) -> None:
    """The controllers stop between the Agent write and the AgentMachine write of a claim: once back,
    the provider finds the Agent labelled with the AgentMachine's uid and records it there, and never
    claims a second Agent for that AgentMachine."""
    lab = chaos_lab
    ns = lab.new_namespace()
    infra_env = create_infra_env(lab.client, ns, agent_labels=SELECTOR, auto_approve=True)
    ignition = fetch_ignition(lab.client, infra_env)
    hosts = ["restart-0", "restart-1"]
    for index, host in enumerate(hosts):
        lab.boot(host, macs_for(index), ignition)
    for host in hosts:
        wait_state(lab.client, ns, host, HostState.KNOWN_UNBOUND)
    create_agent_node_pool(lab.client, ns, SELECTOR, replicas=1)

    def agent_named() -> Obj | None:
        items = lab.client.list(AGENT_MACHINES, ns)
        return next((am for am in items if (am.get("status") or {}).get("agentRef")), None)

    claimed = wait_until(agent_named, "an AgentMachine naming its Agent")
    name, agent = claimed["metadata"]["name"], claimed["status"]["agentRef"]["name"]
    (spare,) = set(hosts) - {agent}

    [service] = lab.behaviour.services
    lab.hub.call(service.stop())
    try:
        lab.client.patch(AGENT_MACHINES, ns, name, {"spec": {"providerID": None}})
        lab.client.patch(AGENT_MACHINES, ns, name, {"status": {"agentRef": None, "ready": None}}, status=True)
    finally:
        lab.hub.call(service.start())

    adopted = wait_until(agent_named, "the AgentMachine naming its Agent again")
    assert adopted["metadata"]["uid"] == claimed["metadata"]["uid"]
    assert adopted["status"]["agentRef"] == {"namespace": ns, "name": agent}
    assert adopted["spec"]["providerID"] == f"agent://{agent}"
    wait_state(lab.client, ns, agent, HostState.ADDED_TO_EXISTING_CLUSTER)
    wait_until(
        lambda: (
            ((lab.client.get(MACHINES, ns, name) or {}).get("spec") or {}).get("providerID")
            == f"agent://{agent}"
        ),
        "the Machine's providerID",
    )
    left = lab.client.get(AGENTS, ns, spare)
    assert left is not None and "agentMachineRef" not in (left["metadata"].get("labels") or {})
    assert host_state(left) == HostState.KNOWN_UNBOUND
    assert [m["metadata"]["name"] for m in lab.client.list(MACHINES, ns)] == [name]
    assert [am["metadata"]["name"] for am in lab.client.list(AGENT_MACHINES, ns)] == [name]


def test_controllers_and_agents_work_against_an_https_hub(tmp_path: Path) -> None:
    """The demo serves https for kubectl: controllers trust the hub's CA, agents run --insecure."""
    with lab_hub(tmp_path, tls=True) as lab:
        assert lab.url.startswith("https://")
        ns = lab.new_namespace()
        infra_env = create_infra_env(lab.client, ns)
        assert infra_env["status"]["bootArtifacts"]["discoveryIgnitionURL"].startswith("https://")
        lab.boot("host-tls", macs_for(1), fetch_ignition(lab.client, infra_env))
        wait_state(lab.client, ns, "host-tls", HostState.KNOWN_UNBOUND)
