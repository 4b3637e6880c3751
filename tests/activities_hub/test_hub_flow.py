"""End to end on the hub twin with its controllers: a host boots the discovery ignition, its Agent is
correlated, handed to its NodePool and claimed by the HyperShift agent provider, installs, and is
scaled down through the delete-machine annotation, unbound and deleted.

The twin's agent provider claims Agents of its NodePool's own namespace, and its cluster provisioning
puts the hosted cluster (and NodePools) in the order's namespace, where the InfraEnv and its Agents
live. Were the NodePool elsewhere, the test would place a copy next to the Agents; the activities
themselves are namespace-agnostic (NodePoolRef.agent_namespace).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.kube import AGENTS
from contracts.hub import (
    AgentRef,
    HandAgentInput,
    HubErrorType,
    InfraEnvRef,
    NodePoolRef,
    WaitAgentInput,
    WaitAgentInstalledInput,
    WaitAgentUnboundInput,
    WaitClusterReferenceInput,
)
from contracts.refs import OrderRef
from lab.hub_controllers.faults import AgentFaults, FaultTarget, InstallError
from tests.workflows.stack import eventually


def soon(seconds: float = 60) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def prepare(lab, lab_api, assisted, hub_acts, kit) -> tuple[OrderRef, InfraEnvRef, NodePoolRef, str]:
    """Order → cluster reference and NodePool → InfraEnv ready → the discovery ignition."""
    lab_api.order()
    order = OrderRef(namespace=lab_api.ns, name="order-1")
    cluster = await kit.run()(hub_acts.wait_cluster_reference, WaitClusterReferenceInput(order=order))
    provisioned = lab_api.get("NodePool", order.nodepool_name("small"), namespace=cluster.namespace)
    assert provisioned is not None
    if cluster.namespace != lab_api.ns:  # the provider claims only Agents of its NodePool's namespace
        lab_api.create(
            "NodePool", {"metadata": {"name": order.nodepool_name("small")}, "spec": provisioned["spec"]}
        )
    pool = NodePoolRef(namespace=lab_api.ns, name=order.nodepool_name("small"), agent_namespace=lab_api.ns)
    infraenv = (await kit.run()(assisted.ensure_infraenv, order)).infraenv
    await kit.run()(assisted.wait_infraenv_ready, infraenv)
    ignition = await assisted.discovery_ignition(infraenv.namespace, infraenv.name)
    return order, infraenv, pool, ignition


async def boot(lab, host_id: str, macs: list[str], ignition: str) -> None:
    await asyncio.to_thread(lab.boot, host_id, tuple(macs), ignition)


async def test_worker_lifecycle_through_the_agent_provider(lab, lab_api, lab_assisted, lab_hub_acts, kit):
    order, infraenv, pool, ignition = await prepare(lab, lab_api, lab_assisted, lab_hub_acts, kit)
    hosts = {f"host-{i}": kit.random_macs(2) for i in range(2)}
    for host_id, macs in hosts.items():
        await boot(lab, host_id, macs, ignition)

    runs = []
    agents: list[AgentRef] = []
    for index, macs in enumerate(hosts.values()):
        run = kit.run()
        runs.append(run)
        bmi_macs = [m.upper() for m in reversed(macs)]  # as BMaaS might list them
        request = WaitAgentInput(infraenv=infraenv, order=order, macs=bmi_macs, deadline=soon())
        agent = await run(lab_assisted.wait_agent_for_macs, request)
        agents.append(agent)
        slot = order.worker_name(index)
        handed = await run(
            lab_assisted.hand_agent_to_nodepool,
            HandAgentInput(agent=agent, nodepool=pool, worker=slot, hostname=slot),
        )
        assert handed.labels["osac.openshift.io/resource_class"] == "small"
        synced = await run(lab_hub_acts.sync_nodepool_replicas, pool)
        assert synced.replicas == index + 1
    assert [a.name for a in agents] == list(hosts)

    install_runs = [kit.run() for _ in agents]
    installed = await asyncio.wait_for(
        asyncio.gather(
            *(
                run(lab_assisted.wait_agent_installed, WaitAgentInstalledInput(agent=agent, deadline=soon()))
                for run, agent in zip(install_runs, agents, strict=True)
            )
        ),
        60,
    )
    for agent, result in zip(agents, installed, strict=True):
        assert result.state == "added-to-existing-cluster" and result.machine_ref
        body = lab_api.get("Agent", agent.name)
        kit.validate("Agent", body)
        assert body["spec"]["clusterDeploymentName"]["name"]  # set by the provider, not by us

    # The provider copies the providerID to the Machine once the Agent is installed, a step after
    # the wait saw it (as CAPI does from the ready AgentMachine).
    async def provider_ids() -> dict[str, dict[str, Any]] | None:
        machines = {str(m["spec"].get("providerID")): m for m in lab_api.items("Machine")}
        return machines if set(machines) == {f"agent://{a.name}" for a in agents} else None

    machines = await eventually(provider_ids, "each Machine showing its Agent's providerID", timeout=60)
    # No assertion on these waits' heartbeats: a wait that ends within its first tick sends none
    # (paced, activities/heartbeats.py), and with the lab's zero timings an install can. What a
    # heartbeat of this wait carries is checked where the Agent holds still
    # (test_hub_agents.py::test_wait_agent_installed_reports_failures_and_deadline).

    # Scale down the second worker by name.
    leaving, staying = agents[1], agents[0]
    marked = await kit.run()(lab_hub_acts.annotate_machine_for_deletion, leaving)
    assert marked.machine == machines[f"agent://{leaving.name}"]["metadata"]["name"]
    await kit.run()(lab_assisted.mark_agent_removing, leaving)
    assert (await kit.run()(lab_hub_acts.sync_nodepool_replicas, pool)).replicas == 1
    # The lab's provider releases it at once: the wait begins after the release, as a slow worker's
    # would. It was claimed all the same (this read it as never claimed, so the newcomers' replica
    # sync and the withdrawal of its approval were skipped).
    deadline = asyncio.get_running_loop().time() + 30
    while (lab_api.get("Agent", leaving.name) or {}).get("status", {}).get("debugInfo", {}).get(
        "state"
    ) != "unbinding-pending-user-action":
        assert asyncio.get_running_loop().time() < deadline, "the lab's provider to release the Agent"
        await asyncio.sleep(0.05)
    unbound = await kit.run()(
        lab_assisted.wait_agent_unbound, WaitAgentUnboundInput(agent=leaving, deadline=soon())
    )
    assert unbound.was_claimed and unbound.state == "unbinding-pending-user-action"
    assert "clusterDeploymentName" not in lab_api.get("Agent", leaving.name)["spec"]
    remaining = [m["spec"].get("providerID") for m in lab_api.items("Machine")]
    assert remaining == [f"agent://{staying.name}"]  # CAPI removed the annotated Machine, not the other
    assert lab_api.get("Agent", staying.name)["metadata"]["labels"].get("agentMachineRef")
    assert not (await kit.run()(lab_assisted.delete_agent, leaving)).already_gone
    assert lab_api.get("Agent", leaving.name) is None

    # Nothing secret went back to Temporal.
    everything = (
        kit.dumps([r.heartbeats for r in runs + install_runs]) + kit.dumps(installed) + kit.dumps(unbound)
    )
    assert kit.pull_secret_marker not in everything and "api_key" not in everything


async def test_install_error_fails_the_install_wait(lab, lab_api, lab_assisted, lab_hub_acts, kit):
    order, infraenv, pool, ignition = await prepare(lab, lab_api, lab_assisted, lab_hub_acts, kit)
    macs = kit.random_macs(2)
    lab.set_faults(AgentFaults(install_error=InstallError(macs=[macs[0]])))
    try:
        await boot(lab, "broken-host", macs, ignition)
        agent = await kit.run()(
            lab_assisted.wait_agent_for_macs,
            WaitAgentInput(infraenv=infraenv, order=order, macs=macs, deadline=soon()),
        )
        await kit.run()(
            lab_assisted.hand_agent_to_nodepool, HandAgentInput(agent=agent, nodepool=pool, worker="w-0")
        )
        await kit.run()(lab_hub_acts.sync_nodepool_replicas, pool)
        with pytest.raises(ApplicationError) as failed:
            await kit.run()(
                lab_assisted.wait_agent_installed, WaitAgentInstalledInput(agent=agent, deadline=soon())
            )
    finally:
        lab.reset_faults()
    assert failed.value.type == HubErrorType.AGENT_INSTALL_FAILED and failed.value.non_retryable
    assert failed.value.details[0]["state"] == "error"


async def test_duplicate_mac_registration_is_ambiguous(
    lab, lab_api, lab_assisted, lab_hub_acts, lab_kube, kit
):
    order, infraenv, _, ignition = await prepare(lab, lab_api, lab_assisted, lab_hub_acts, kit)
    macs = kit.random_macs(2)
    lab.set_faults(AgentFaults(duplicate_mac=FaultTarget(macs=[macs[0]])))
    try:
        await boot(lab, "dup-host", macs, ignition)
        # Both Agents exist (the phantom's inventory may still be on its way) when correlation runs.
        informer = lab_kube.informer(AGENTS)
        await informer.wait(
            lambda: True if len(lab_api.items("Agent")) >= 2 else None, deadline=soon(30), tick_seconds=0.1
        )
    finally:
        lab.reset_faults()
    with pytest.raises(ApplicationError) as ambiguous:
        await kit.run()(
            lab_assisted.wait_agent_for_macs,
            WaitAgentInput(infraenv=infraenv, order=order, macs=macs, deadline=soon()),
        )
    assert ambiguous.value.type == HubErrorType.AMBIGUOUS_AGENT_MATCH
    assert (
        "dup-host" in ambiguous.value.details[0]["agents"] and len(ambiguous.value.details[0]["agents"]) == 2
    )


async def test_a_worker_scaled_down_while_installing_has_its_own_machine_removed(
    lab, lab_api, lab_assisted, lab_hub_acts, kit
):
    """CAPI gives a Machine its providerID only once its Agent is installed. Of three workers whose
    installs are stuck (their hosts booted the discovery image again), the one scaled down loses its
    own Machine, found through its AgentMachine; the others keep theirs and their claims. Left to
    CAPI's choice among Machines without a node, another worker's install would be unbound."""
    order, infraenv, pool, ignition = await prepare(lab, lab_api, lab_assisted, lab_hub_acts, kit)
    hosts = {f"stuck-{i}": kit.random_macs(1) for i in range(3)}
    lab.set_faults(AgentFaults(installing_pending_user_action=FaultTarget(rate=1.0)))
    try:
        agents: list[AgentRef] = []
        for index, (host_id, macs) in enumerate(hosts.items()):
            await boot(lab, host_id, macs, ignition)
            agent = await kit.run()(
                lab_assisted.wait_agent_for_macs,
                WaitAgentInput(infraenv=infraenv, order=order, macs=macs, deadline=soon()),
            )
            slot = order.worker_name(index)
            await kit.run()(
                lab_assisted.hand_agent_to_nodepool,
                HandAgentInput(agent=agent, nodepool=pool, worker=slot, hostname=slot),
            )
            agents.append(agent)
        assert (await kit.run()(lab_hub_acts.sync_nodepool_replicas, pool)).replicas == 3

        def state(name: str) -> str | None:
            return (lab_api.get("Agent", name) or {}).get("status", {}).get("debugInfo", {}).get("state")

        deadline = asyncio.get_running_loop().time() + 60
        while any(state(a.name) != "installing-pending-user-action" for a in agents):
            assert asyncio.get_running_loop().time() < deadline, "the three installs to get stuck"
            await asyncio.sleep(0.05)
        assert not any(m["spec"].get("providerID") for m in lab_api.items("Machine"))

        def machine_of(agent: str) -> str:
            (owner,) = [
                am["metadata"]["ownerReferences"][0]["name"]
                for am in lab_api.items("AgentMachine")
                if (am.get("status", {}).get("agentRef") or {}).get("name") == agent
            ]
            return str(owner)

        machines = {a.name: machine_of(a.name) for a in agents}
        leaving, staying = agents[1], [agents[0], agents[2]]
        marked = await kit.run()(lab_hub_acts.annotate_machine_for_deletion, leaving)
        assert marked.machine == machines[leaving.name] and marked.changed
        await kit.run()(lab_assisted.mark_agent_removing, leaving)
        assert (await kit.run()(lab_hub_acts.sync_nodepool_replicas, pool)).replicas == 2
        kept = sorted(machines[a.name] for a in staying)
        deadline = asyncio.get_running_loop().time() + 30
        while lab_api.get("Agent", leaving.name)["metadata"]["labels"].get("agentMachineRef") or (
            sorted(m["metadata"]["name"] for m in lab_api.items("Machine")) != kept
        ):
            # A Machine of a staying worker removed instead would never come back: this times out.
            assert asyncio.get_running_loop().time() < deadline, "the leaving worker's Machine alone removed"
            await asyncio.sleep(0.05)
        for agent in staying:
            assert lab_api.get("Agent", agent.name)["metadata"]["labels"].get("agentMachineRef")
            assert state(agent.name) == "installing-pending-user-action"
    finally:
        lab.reset_faults()
