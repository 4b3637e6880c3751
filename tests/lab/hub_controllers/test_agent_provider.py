"""The HyperShift agent provider: NodePool replicas create Machines and their AgentMachines, which
claim Agents; scale down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.hub_controllers.agent_provider import NodePoolController
from lab.hub_controllers.constants import HostState
from lab.hub_controllers.faults import AgentFaults, FaultTarget
from lab.hub_controllers.resources import AGENT_MACHINES, AGENTS, MACHINES, NODE_POOLS
from lab.hub_controllers.testing import (
    Lab,
    condition,
    create_agent_node_pool,
    create_infra_env,
    fetch_ignition,
    host_state,
    lab_hub,
    macs_for,
    wait_state,
    wait_until,
)
from lab.hub_controllers.timings import AgentTimings

SELECTOR = {"osac.openshift.io/clusterorder": "o1", "osac.openshift.io/resource_class": "bm-standard"}
MACHINE_REF = "agentMachineRef"
MACHINE_NAMESPACE = "agentMachineRefNamespace"


def _node_pool(lab: Lab, ns: str, replicas: int = 0) -> None:
    create_agent_node_pool(lab.client, ns, SELECTOR, replicas)


def _scale(lab: Lab, ns: str, replicas: int) -> None:
    lab.client.patch(NODE_POOLS, ns, "np1", {"spec": {"replicas": replicas}})


def _machines(lab: Lab, ns: str) -> list[dict[str, Any]]:
    return lab.client.list(MACHINES, ns, selector="hypershift.openshift.io/nodePool=np1")


def _boot_hosts(lab: Lab, ns: str, names: list[str], *, approve: bool = True) -> str:
    """Hosts booted into an InfraEnv labelling Agents for the NodePool; returns its ignition."""
    infra_env = create_infra_env(lab.client, ns, agent_labels=SELECTOR, auto_approve=approve)
    ignition = fetch_ignition(lab.client, infra_env)
    for index, name in enumerate(names):
        lab.boot(name, macs_for(index), ignition)
    for name in names:
        wait_state(lab.client, ns, name, HostState.KNOWN_UNBOUND)
    return ignition


def _claimed(lab: Lab, ns: str) -> dict[str, str]:
    """Claimed Agent -> the name of the AgentMachine (and Machine) its label names by uid; a label
    naming no AgentMachine shows as `?<label>`."""
    names = {am["metadata"]["uid"]: am["metadata"]["name"] for am in lab.client.list(AGENT_MACHINES, ns)}
    return {
        a["metadata"]["name"]: names.get(ref, f"?{ref}")
        for a in lab.client.list(AGENTS, ns)
        if (ref := (a["metadata"].get("labels") or {}).get(MACHINE_REF))
    }


def _provider_id(lab: Lab, res: Any, ns: str, name: str) -> str | None:
    return ((lab.client.get(res, ns, name) or {}).get("spec") or {}).get("providerID")


def _pool_replicas(lab: Lab, ns: str) -> int | None:
    return ((lab.client.get(NODE_POOLS, ns, "np1") or {}).get("status") or {}).get("replicas")


def test_scale_up_claims_installs_and_scale_down_releases_the_marked_machine(lab: Lab, ns: str) -> None:
    _boot_hosts(lab, ns, ["host-p1", "host-p2", "host-p3"])
    _node_pool(lab, ns)

    _scale(lab, ns, 1)
    claimed = wait_until(lambda: _claimed(lab, ns), "one claim")
    (agent_name, machine_name), *_ = claimed.items()
    agent = wait_state(lab.client, ns, agent_name, HostState.ADDED_TO_EXISTING_CLUSTER)
    assert agent["spec"]["clusterDeploymentName"] == {"name": "c1", "namespace": ns}
    assert agent["metadata"]["annotations"][MACHINE_NAMESPACE] == ns
    assert (condition(agent, "Bound") or {}).get("status") == "True"
    wait_until(
        lambda: _provider_id(lab, MACHINES, ns, machine_name) == f"agent://{agent_name}",
        "the installed Agent's providerID on its Machine",
    )
    wait_until(lambda: _pool_replicas(lab, ns) == 1, "NodePool status.replicas == 1")
    running = wait_until(
        lambda: (
            (m := lab.client.get(MACHINES, ns, machine_name)) and (m.get("status") or {}).get("nodeRef") and m
        ),
        "the Machine's nodeRef",
    )
    assert running["status"]["phase"] == "Running"

    _scale(lab, ns, 2)
    wait_until(lambda: len(_claimed(lab, ns)) == 2, "two claims")
    wait_until(lambda: _pool_replicas(lab, ns) == 2, "NodePool status.replicas == 2")
    assert len(_machines(lab, ns)) == 2
    victim, survivor = sorted(_claimed(lab, ns).items())
    lab.client.patch(
        MACHINES, ns, victim[1], {"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "yes"}}}
    )

    _scale(lab, ns, 1)
    released = wait_state(lab.client, ns, victim[0], HostState.UNBINDING_PENDING_USER_ACTION)
    assert MACHINE_REF not in released["metadata"].get("labels", {})
    assert MACHINE_NAMESPACE not in (released["metadata"].get("annotations") or {})
    assert "clusterDeploymentName" not in released["spec"]
    assert (condition(released, "Bound") or {}).get("reason") == "UnbindingPendingUserAction"
    wait_until(lambda: lab.client.get(MACHINES, ns, victim[1]) is None, "the marked Machine to go")
    assert [m["metadata"]["name"] for m in _machines(lab, ns)] == [survivor[1]]
    wait_until(
        lambda: [am["metadata"]["name"] for am in lab.client.list(AGENT_MACHINES, ns)] == [survivor[1]],
        "the marked Machine's AgentMachine to go with it",
    )
    assert _claimed(lab, ns) == {survivor[0]: survivor[1]}
    wait_until(lambda: _pool_replicas(lab, ns) == 1, "NodePool status.replicas back to 1")
    # The provider never deletes Agents, and never claims the released one again.
    assert {a["metadata"]["name"] for a in lab.client.list(AGENTS, ns)} == {"host-p1", "host-p2", "host-p3"}


def test_deleting_a_claimed_agent_deletes_its_machine_and_capi_replaces_it(lab: Lab, ns: str) -> None:
    ignition = _boot_hosts(lab, ns, ["host-d1"])
    _node_pool(lab, ns, replicas=1)
    (agent_name, machine_name), *_ = wait_until(lambda: _claimed(lab, ns), "the claim").items()
    wait_state(lab.client, ns, agent_name, HostState.ADDED_TO_EXISTING_CLUSTER)

    lab.client.delete(AGENTS, ns, agent_name)
    wait_until(
        lambda: lab.client.get(MACHINES, ns, machine_name) is None, "the Machine of the deleted Agent to go"
    )
    pending = wait_until(
        lambda: [m for m in _machines(lab, ns) if not m["spec"].get("providerID")], "a replacement Machine"
    )
    assert pending[0]["metadata"]["name"] != machine_name
    wait_until(lambda: _pool_replicas(lab, ns) == 0, "NodePool status.replicas == 0")

    # A new eligible host is claimed by the waiting replacement.
    assert lab.client.list(AGENTS, ns) == []
    lab.boot("host-d2", macs_for(5), ignition)
    replacement = wait_state(lab.client, ns, "host-d2", HostState.ADDED_TO_EXISTING_CLUSTER)
    agent_machine = lab.client.get(AGENT_MACHINES, ns, pending[0]["metadata"]["name"])
    assert agent_machine is not None
    assert replacement["metadata"]["labels"][MACHINE_REF] == agent_machine["metadata"]["uid"]


def test_the_agent_names_its_agent_machine_and_the_machine_gets_the_provider_id_once_installed(
    tmp_path: Path,
) -> None:
    """The claim labels the Agent with its AgentMachine's uid and names the Agent on the AgentMachine;
    the Machine gets the providerID only once the Agent is installed (CAPI copies it from a ready
    AgentMachine). Installs take seconds here, so the Machine is seen while its Agent installs."""
    with lab_hub(tmp_path, AgentTimings.zero().model_copy(update={"install_stage_s": 0.5})) as lab:
        ns = lab.new_namespace()
        _boot_hosts(lab, ns, ["host-a1"])
        _node_pool(lab, ns, replicas=1)
        (machine,) = wait_until(lambda: _machines(lab, ns), "the Machine")
        name = machine["metadata"]["name"]
        agent_machine = wait_until(
            lambda: (
                (am := lab.client.get(AGENT_MACHINES, ns, name))
                and (am.get("status") or {}).get("agentRef")
                and am
            ),
            "the AgentMachine naming its Agent",
        )
        assert agent_machine["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "cluster.x-k8s.io/v1beta1",
                "kind": "Machine",
                "name": name,
                "uid": machine["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert agent_machine["spec"]["providerID"] == "agent://host-a1"
        assert agent_machine["status"]["agentRef"] == {"namespace": ns, "name": "host-a1"}
        assert agent_machine["status"]["ready"] is False
        agent = lab.client.get(AGENTS, ns, "host-a1")
        assert agent is not None
        assert agent["metadata"]["labels"][MACHINE_REF] == agent_machine["metadata"]["uid"]
        assert agent["metadata"]["annotations"][MACHINE_NAMESPACE] == ns

        installing: list[str | None] = []

        def installed() -> bool:
            # The Machine is read first: if the Agent is not installed after, it was not before.
            seen = lab.client.get(MACHINES, ns, name) or {}
            state = host_state(lab.client.get(AGENTS, ns, "host-a1"))
            if state == HostState.ADDED_TO_EXISTING_CLUSTER:
                return True
            assert not seen["spec"].get("providerID"), f"a providerID while the Agent is {state}"
            installing.append(state)
            return False

        wait_until(installed, "the Agent installed")
        assert installing, "the Machine was never seen before its Agent was installed"
        wait_until(
            lambda: _provider_id(lab, MACHINES, ns, name) == "agent://host-a1",
            "the providerID on the Machine",
        )
        ready = lab.client.get(AGENT_MACHINES, ns, name)
        assert ready is not None and ready["status"]["ready"] is True


def test_deleting_a_machine_deletes_its_agent_machine_and_releases_its_agent(lab: Lab, ns: str) -> None:
    _boot_hosts(lab, ns, ["host-m1"])
    _node_pool(lab, ns, replicas=1)
    (agent_name, machine_name), *_ = wait_until(lambda: _claimed(lab, ns), "the claim").items()
    wait_state(lab.client, ns, agent_name, HostState.ADDED_TO_EXISTING_CLUSTER)

    lab.client.delete(MACHINES, ns, machine_name)
    wait_until(lambda: lab.client.get(AGENT_MACHINES, ns, machine_name) is None, "its AgentMachine to go")
    released = wait_state(lab.client, ns, agent_name, HostState.UNBINDING_PENDING_USER_ACTION)
    assert MACHINE_REF not in released["metadata"].get("labels", {})
    assert MACHINE_NAMESPACE not in (released["metadata"].get("annotations") or {})
    assert "clusterDeploymentName" not in released["spec"]
    # CAPI replaces the Machine; the replacement has an AgentMachine of its own, and nothing else is left.
    (replacement,) = wait_until(
        lambda: [m for m in _machines(lab, ns) if m["metadata"]["name"] != machine_name], "a replacement"
    )
    name = replacement["metadata"]["name"]
    agent_machine = wait_until(lambda: lab.client.get(AGENT_MACHINES, ns, name), "its AgentMachine")
    assert [r["uid"] for r in agent_machine["metadata"]["ownerReferences"]] == [
        replacement["metadata"]["uid"]
    ]
    assert [am["metadata"]["name"] for am in lab.client.list(AGENT_MACHINES, ns)] == [name]
    assert _claimed(lab, ns) == {}


def test_only_approved_matching_agents_are_claimed(lab: Lab, ns: str) -> None:
    _boot_hosts(lab, ns, ["host-e1"], approve=False)
    other_infra_env = create_infra_env(
        lab.client,
        ns,
        "other",
        agent_labels={**SELECTOR, "osac.openshift.io/clusterorder": "o2"},
        auto_approve=True,
        with_secret=False,
    )
    lab.boot("host-e2", macs_for(7), fetch_ignition(lab.client, other_infra_env))
    wait_state(lab.client, ns, "host-e2", HostState.KNOWN_UNBOUND)
    _node_pool(lab, ns, replicas=1)
    wait_until(lambda: _machines(lab, ns), "the Machine")

    # Approving the matching Agent is what lets the waiting Machine claim it; the other never matches.
    lab.client.patch(AGENTS, ns, "host-e1", {"spec": {"approved": True}})
    claimed = wait_until(lambda: _claimed(lab, ns), "the claim")
    assert list(claimed) == ["host-e1"]
    wait_state(lab.client, ns, "host-e1", HostState.ADDED_TO_EXISTING_CLUSTER)
    assert _claimed(lab, ns) == claimed
    assert host_state(lab.client.get(AGENTS, ns, "host-e2")) == HostState.KNOWN_UNBOUND


def _provider(lab: Lab) -> NodePoolController:
    controllers = [c for service in lab.behaviour.services for c in service.controllers]
    [provider] = [c for c in controllers if isinstance(c, NodePoolController)]
    return provider


def _claim_from(lab: Lab, ns: str, stale: dict[str, Any]) -> str | None:
    """The provider claims `stale` (a copy older than the stored Agent) for a new Machine's
    AgentMachine, directly."""
    machine = lab.client.create(
        MACHINES,
        {
            "metadata": {"name": "m-direct", "namespace": ns},  # no NodePool label: no pool reconciles it
            "spec": {
                "clusterName": "c1",
                "bootstrap": {"dataSecretName": "user-data-np1"},
                "infrastructureRef": {
                    "apiVersion": "capi-provider.agent-install.openshift.io/v1beta1",
                    "kind": "AgentMachine",
                    "name": "m-direct",
                    "namespace": ns,
                },
            },
        },
    )
    agent_machine = lab.client.create(
        AGENT_MACHINES,
        {
            "metadata": {
                "name": "m-direct",
                "namespace": ns,
                "ownerReferences": [
                    {
                        "apiVersion": "cluster.x-k8s.io/v1beta1",
                        "kind": "Machine",
                        "name": "m-direct",
                        "uid": machine["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {},
        },
    )
    node_pool = {"metadata": {"name": "np1", "namespace": ns}, "spec": {"clusterName": "c1"}}
    claim = _provider(lab)._claim(node_pool, machine, agent_machine, [stale], {"matchLabels": SELECTOR})
    result: str | None = lab.hub.call(claim)
    return result


def test_a_claim_from_a_stale_copy_reads_the_agent_afresh_and_keeps_what_changed(lab: Lab, ns: str) -> None:
    """A conflict only says the cached copy is behind (the host state controller writes the Agent's
    status all the time): the provider reads it again and claims it if it is still eligible."""
    _boot_hosts(lab, ns, ["host-s1"])
    stale = lab.client.get(AGENTS, ns, "host-s1")
    assert stale is not None
    lab.client.patch(AGENTS, ns, "host-s1", {"metadata": {"annotations": {"meanwhile": "yes"}}})

    assert _claim_from(lab, ns, stale) == "host-s1"
    agent = lab.client.get(AGENTS, ns, "host-s1")
    assert agent is not None
    assert _claimed(lab, ns) == {"host-s1": "m-direct"}
    assert agent["metadata"]["annotations"]["meanwhile"] == "yes"
    assert agent["spec"]["clusterDeploymentName"] == {"name": "c1", "namespace": ns}


def test_a_stale_copy_of_an_agent_claimed_meanwhile_is_not_taken(lab: Lab, ns: str) -> None:
    _boot_hosts(lab, ns, ["host-s2"])
    stale = lab.client.get(AGENTS, ns, "host-s2")
    assert stale is not None
    lab.client.patch(AGENTS, ns, "host-s2", {"metadata": {"labels": {MACHINE_REF: "someone-else"}}})

    assert _claim_from(lab, ns, stale) is None
    agent = lab.client.get(AGENTS, ns, "host-s2")
    assert agent is not None and agent["metadata"]["labels"][MACHINE_REF] == "someone-else"


def test_a_hanging_drain_keeps_its_machine_deleting_and_counted_until_it_ends(lab: Lab, ns: str) -> None:
    """A drain that never ends (a PodDisruptionBudget, `nodeDrainTimeout` 0): the victim's Machine
    stays, Deleting, its Agent claimed. CAPI counts a deleting Machine until it is gone, so raising
    the replicas again neither undoes the deletion nor adds a Machine beside it; once the drain ends
    the Machine goes and a new one claims the waiting host."""
    _boot_hosts(lab, ns, ["host-h1", "host-h2", "host-h3"])
    _node_pool(lab, ns, replicas=2)
    wait_until(lambda: len(_claimed(lab, ns)) == 2, "two claims")
    claimed = _claimed(lab, ns)
    (victim, victim_machine), _ = sorted(claimed.items())
    (waiting,) = {"host-h1", "host-h2", "host-h3"} - set(claimed)
    lab.set_faults(AgentFaults(hanging_drain=FaultTarget(agents=[victim])))
    try:
        lab.client.patch(
            MACHINES,
            ns,
            victim_machine,
            {"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "y"}}},
        )
        _scale(lab, ns, 1)
        wait_until(
            lambda: (
                ((lab.client.get(MACHINES, ns, victim_machine) or {}).get("status") or {}).get("phase")
                == "Deleting"
            ),
            "the victim's Machine deleting",
        )
        assert _claimed(lab, ns)[victim] == victim_machine
        wait_until(lambda: _pool_ready(lab, ns) == "False", "a reconcile at 1 replica (2 of 1 available)")

        _scale(lab, ns, 2)
        wait_until(lambda: _pool_ready(lab, ns) == "True", "a reconcile at 2 replicas")
        assert len(_machines(lab, ns)) == 2 and waiting not in _claimed(lab, ns)
        assert (lab.client.get(MACHINES, ns, victim_machine) or {})["status"]["phase"] == "Deleting"
    finally:
        lab.reset_faults()
    wait_until(lambda: lab.client.get(MACHINES, ns, victim_machine) is None, "the drained Machine to go")
    wait_state(lab.client, ns, victim, HostState.UNBINDING_PENDING_USER_ACTION)
    wait_state(lab.client, ns, waiting, HostState.ADDED_TO_EXISTING_CLUSTER)
    assert set(_claimed(lab, ns)) == {"host-h1", "host-h2", "host-h3"} - {victim}


def _pool_ready(lab: Lab, ns: str) -> str | None:
    """The status of the NodePool's Ready condition as the provider last wrote it."""
    status = (lab.client.get(NODE_POOLS, ns, "np1") or {}).get("status") or {}
    return next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
