"""The product end to end on the real dev server and both twins: scale up, targeted scale-down,
scale back up, decommission; every BMI and Agent gone and every host wiped."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from contracts.activities import BmaasActivity, HubActivity
from contracts.bmaas import BmiState, OrderInstances, WorkerInstance
from contracts.hub import PULL_SECRET_KEY, InfraEnvRef
from contracts.refs import OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerReport, WorkerReports, WorkerStatus
from contracts.workflows import (
    NodeSetRequest,
    OrderConditionType,
    ScaleDownWorker,
    cluster_workflow_id,
    worker_workflow_id,
)
from lab.fulfillment.seed import DISK_IMAGE_NAME, RELEASE_IMAGE, host_labels, seeded_id
from lab.hub.testing import sample_infraenv
from tests.workflows.held_starts import CancelVictimWhileStarting
from tests.workflows.stack import (
    AGENT_API,
    CLUSTER_ORDERS,
    INSTANCE_TYPES,
    PULL_SECRET,
    QUICK_RESTARTS,
    SSH_KEY,
    Stack,
    delivered_reports,
    eventually,
    record_regression,
    replay_clean,
    running_stack,
    scheduled_activities,
    wait_condition,
)
from workflows.cluster_workers import ClusterWorkersWorkflow, _tell_again_at
from workflows.worker_node import registrations_cutoff

BMAAS_INSTANCES = "/api/private/v1/baremetal_instances"

MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
# A finalizer nobody removes but the test: holds an object deleting.
HELD_BY_TEST = "tests.osac.openshift.io/held"


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(temporal_env.client, tmp_path_factory.mktemp("stack")) as running:
        yield running


async def test_scale_up_targeted_scale_down_scale_up_decommission(stack: Stack) -> None:
    order = await stack.create_order({"bm-standard": 3})
    await stack.apply(order, {"bm-standard": 3})
    status = await stack.wait_ready(order, 3)
    assert sorted(w.name for w in status.workers) == [order.worker_name(i) for i in range(3)]
    assert all(w.resource_id for w in status.workers)

    async def order_status_ready() -> dict | None:
        obj = await stack.order_object(order)
        st = obj.get("status", {})
        workers = st.get("workers") or []
        if st.get("readyWorkers") == 3 and len(workers) == 3 and all(w["phase"] == "Ready" for w in workers):
            return st
        return None

    published = await eventually(order_status_ready, "ClusterOrder status with 3 Ready workers")
    assert published["desiredWorkers"] == 3
    assert {w["kind"] for w in published["workers"]} == {"BareMetalInstance"}
    assert len(await stack.bmis(order)) == 3
    agents = await stack.agents(order.namespace)
    assert len(agents) == 3

    # Targeted scale-down of the middle worker: exactly that one goes, its host is wiped.
    victim = order.worker_name(1)
    victim_bmi = next(w.resource_id for w in status.workers if w.name == victim)
    lowered = await stack.api.scale_down_worker(order, victim)
    assert lowered.count == 2

    async def victim_gone() -> bool:
        st = await stack.api.status(order)
        return victim not in {w.name for w in st.workers} and st.ready_workers == 2

    await eventually(victim_gone, f"{victim} released")
    assert victim_bmi not in {b["id"] for b in await stack.bmis(order)}
    assert len(await stack.agents(order.namespace)) == 2

    # The spec's lower count changes nothing; a higher one provisions a new worker.
    await stack.apply(order, {"bm-standard": 2})
    status = await stack.api.status(order)
    assert {w.name for w in status.workers} == {order.worker_name(0), order.worker_name(2)}
    await stack.apply(order, {"bm-standard": 3})
    status = await stack.wait_ready(order, 3)
    assert {w.name for w in status.workers} == {order.worker_name(i) for i in (0, 2, 3)}
    assert all(w.phase == WorkerPhase.READY for w in status.workers)

    final = await stack.decommission_and_wait(order)
    assert final.finished and final.workers == []
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.infraenvs(order.namespace) == []
    assert await stack.audit_violations() == []
    audit = await stack.audit()
    allocated = {r["bmi_id"] for r in audit if r["kind"] == "HOST_ALLOCATED"}
    wiped = {r["bmi_id"] for r in audit if r["kind"] == "WIPE_FINISHED"}
    order_bmis = {w_id for w_id in allocated if w_id}
    assert order_bmis and order_bmis <= wiped


async def test_mass_scale_down_needs_confirmation_and_bad_counts_are_rejected(stack: Stack) -> None:
    from contracts.workflows import SetNodeSets
    from starter.api import CommandError
    from workflows.cluster_workers import ClusterWorkersWorkflow

    order = await stack.create_order({"bm-standard": 4})
    await stack.apply(order, {"bm-standard": 4})
    with pytest.raises(CommandError, match=r"node_sets\[\]\.count: lowering the order from 4 to 1 workers"):
        await stack.apply(order, {"bm-standard": 1})
    with pytest.raises(CommandError, match=r"node_sets\[0\]\.instance_type: unknown instance type 'bm-tiny'"):
        await stack.apply(order, {"bm-tiny": 1})
    with pytest.raises(CommandError, match=r"exceed the maximum of 100 per order"):
        await stack.apply(order, {"bm-standard": 101})
    # A type BMaaS offers after the order started: each command brings the catalog it was checked
    # against, and one without a catalog is checked against the last one seen.
    tiny = [
        NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=4),
        NodeSetRequest(name="bm-tiny", instance_type="bm-tiny", count=0),
    ]
    await stack.api.apply(order, tiny, instance_types=[*INSTANCE_TYPES, "bm-tiny"])
    kept = SetNodeSets(node_sets=tiny)
    await stack.api.handle(order).execute_update(ClusterWorkersWorkflow.set_node_sets, kept)
    with pytest.raises(CommandError, match=r"node_sets\[1\]\.instance_type: unknown instance type 'bm-tiny'"):
        # Withdrawn from the catalog: raising it is refused (lowering or keeping it is not).
        await stack.apply(order, {"bm-standard": 4, "bm-tiny": 1})
    status = await stack.api.status(order)
    assert status.desired_workers == 4  # nothing of the refused commands entered the workflow

    # Two at once is below the guard; a confirmed mass scale-down goes through.
    await stack.apply(order, {"bm-standard": 2})
    lowered = SetNodeSets(
        node_sets=[NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=0)],
        confirm_scale_down=True,
    )
    await stack.api.handle(order).execute_update(ClusterWorkersWorkflow.set_node_sets, lowered)
    assert (await stack.api.status(order)).desired_workers == 0
    await stack.decommission_and_wait(order)
    with pytest.raises(
        CommandError, match=f"decommission: order {order.key} is decommissioned; it takes no more changes"
    ):
        await stack.api.decommission(order)
    assert await stack.bmis(order) == []


async def test_a_change_decided_on_node_sets_that_changed_since_is_refused(stack: Stack) -> None:
    """Two controllers (a rolling update): the one that decided on node sets the workflow no longer
    has must not set the workflow back. Refused as ChangedMeanwhile (look again), never as the
    tenant's bad input. The generation alone refuses nothing: an order restored from a backup
    counts from 1 again."""
    from starter.api import ChangedMeanwhile

    def standard(count: int) -> list[NodeSetRequest]:
        return [NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=count)]

    order = await stack.create_order({"bm-standard": 0})
    await stack.api.apply(order, standard(0), instance_types=INSTANCE_TYPES, order_generation=4)
    await stack.api.apply(
        order, standard(2), instance_types=INSTANCE_TYPES, order_generation=5, expected_node_sets=standard(0)
    )
    with pytest.raises(ChangedMeanwhile, match=r"expected_node_sets: the node sets changed"):
        await stack.api.apply(
            order,
            standard(1),
            instance_types=INSTANCE_TYPES,
            order_generation=4,
            expected_node_sets=standard(0),
        )
    status = await stack.api.status(order)
    assert (status.desired_workers, status.order_generation) == (2, 5)
    # Decided on what the workflow has: applied, as is a change with no expectation (a library caller).
    await stack.api.apply(
        order, standard(1), instance_types=INSTANCE_TYPES, order_generation=1, expected_node_sets=standard(2)
    )
    assert (await stack.api.status(order)).desired_workers == 1
    await stack.apply(order, {"bm-standard": 0})
    assert (await stack.api.status(order)).desired_workers == 0
    await stack.decommission_and_wait(order)


async def test_a_refused_start_leaves_no_unretrieved_error_for_asyncio_to_log(stack: Stack) -> None:
    """A closed run holds the order's workflow id: the start is refused (ChangedMeanwhile). The
    start operation also keeps that error in a future of its own; left unretrieved, asyncio logged
    it when collected as "Future exception was never retrieved", an ERROR with a traceback, for
    every refused (or timed-out) change the controller sent."""
    from starter.api import ChangedMeanwhile

    order = await stack.create_order({"bm-standard": 0})
    await stack.apply(order, {"bm-standard": 0})
    await stack.client.get_workflow_handle(cluster_workflow_id(order)).terminate(reason="test: by hand")
    loop = asyncio.get_running_loop()
    gc.collect()  # what earlier tests left on this shared loop is not this test's
    previous = loop.get_exception_handler()
    reported: list[str] = []

    def report(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), WorkflowAlreadyStartedError):
            reported.append(str(context.get("message")))

    loop.set_exception_handler(report)
    try:
        refused = False
        try:
            change = [NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=1)]
            await stack.api.apply(order, change, instance_types=INSTANCE_TYPES)
        except ChangedMeanwhile:
            refused = True
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert refused
    assert reported == []


async def test_a_late_copy_of_a_report_never_undoes_a_newer_one(stack: Stack) -> None:
    """Reports come from the worker workflow and from its activities (a retried activity's zombie
    attempt among them): the cluster workflow keeps the highest-numbered one."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    ready = (await stack.wait_ready(order, 1)).workers[0]
    assert ready.phase == WorkerPhase.READY
    handle = stack.client.get_workflow_handle(cluster_workflow_id(order))
    stale = WorkerReport(status=ready.model_copy(update={"phase": WorkerPhase.BINDING}), sequence=2)
    await handle.signal("worker_reports", WorkerReports(reports=[stale]))
    await handle.signal("worker_report", stale)
    # Handled in the order sent: the status an update returns afterwards has seen both signals.
    status = await stack.apply(order, {"bm-standard": 1})
    assert [w.phase for w in status.workers] == [WorkerPhase.READY]
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_an_agent_reporting_a_nic_of_no_bmi_is_checked_with_bmaas_then_bound(stack: Stack) -> None:
    """A host with one more NIC than its BMI (a BMC's USB NIC): the wait returns its Agent without
    handing it over; the workflow asks BMaaS whose that NIC is (nobody's), then hands it itself."""
    await stack.set_agent_faults({"extra_nic": {"rate": 1.0}})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        await stack.wait_ready(order, 1)
    finally:
        await stack.clear_agent_faults()
    (agent,) = await stack.agents(order.namespace)
    assert len(agent["status"]["inventory"]["interfaces"]) > 1 and agent["spec"]["approved"] is True
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
    scheduled = scheduled_activities((await handle.fetch_history()).events)
    assert scheduled[2:] == [
        HubActivity.WAIT_AGENT_AND_HAND,
        BmaasActivity.FIND_INSTANCES_WITH_MACS,
        HubActivity.HAND_AGENT_TO_NODEPOOL,
        HubActivity.WAIT_AGENT_INSTALLED,
    ]
    await stack.decommission_and_wait(order)
    assert await stack.agents(order.namespace) == []
    assert await stack.bmis(order) == []


async def test_a_worker_scaled_down_while_bmaas_is_asked_about_its_agents_nic_hands_nothing_over(
    stack: Stack,
) -> None:
    """The question to BMaaS about an extra NIC is a call, which a scale-down's cancel cannot reach:
    the worker stops once it is answered, before the hand-off, instead of approving the Agent and
    raising the NodePool's replicas on its way out (found by review)."""
    await stack.set_agent_faults({"extra_nic": {"rate": 1.0}})
    # BMaaS lists slowly (the check's among them): the scale-down lands while it is asked.
    await stack.set_bmaas_faults(routes={f"GET {BMAAS_INSTANCES}": {"latency_s": 15}})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        leaving = order.worker_name(0)
        handle = stack.client.get_workflow_handle(worker_workflow_id(order, leaving))

        async def asking() -> bool:
            try:
                pending = (await handle.describe()).raw_description.pending_activities
            except RPCError:  # not started yet
                return False
            return any(p.activity_type.name == BmaasActivity.FIND_INSTANCES_WITH_MACS.value for p in pending)

        await eventually(asking, f"{leaving} asking BMaaS whose its Agent's extra NIC is")
        await stack.api.scale_down_worker(order, leaving)

        async def gone() -> bool:
            return (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED

        await eventually(gone, f"{leaving} released", timeout=180)
    finally:
        await stack.clear_bmaas_faults()
        await stack.clear_agent_faults()
    history = await handle.fetch_history()
    record_regression("worker-scaled-down-during-its-nic-check", history)
    told = next(
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == "scale_down"
    )
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
    }
    checked = next(
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id)
        == BmaasActivity.FIND_INSTANCES_WITH_MACS.value
    )
    assert told < checked, "the scale-down was to land while BMaaS was asked"
    assert HubActivity.HAND_AGENT_TO_NODEPOOL.value not in scheduled_activities(history.events)
    assert await stack.agents(order.namespace) == []
    assert await stack.bmis(order) == []
    await stack.decommission_and_wait(order)


async def test_hosts_sharing_an_extra_nic_are_all_bound(stack: Stack) -> None:
    """Every host reports the same extra NIC (a BMC's USB NIC with one MAC on every board): that
    MAC says nothing about which host an Agent is, so each worker is bound, not refused as a
    duplicate of the others."""
    await stack.set_agent_faults({"extra_nic": {"rate": 1.0, "shared": True}})
    try:
        order = await stack.create_order({"bm-standard": 2})
        await stack.apply(order, {"bm-standard": 2})
        status = await stack.wait_ready(order, 2)
    finally:
        await stack.clear_agent_faults()
    assert all(w.attempt_count == 1 for w in status.workers), status.workers
    shared = [
        {i["macAddress"] for i in a["status"]["inventory"]["interfaces"]}
        for a in await stack.agents(order.namespace)
    ]
    assert len(shared) == 2 and shared[0] & shared[1]
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_a_host_with_an_infiniband_nic_is_matched_and_bound(stack: Stack) -> None:
    """A GPU host whose fabric is InfiniBand: BMaaS and its Agent report a 20-byte IPoIB address
    beside its Ethernet MACs. The worker matches it on all of them alike and binds it (a MAC rule
    that took only Ethernet's 6 bytes on one side once left such a worker failing forever)."""
    ipoib = "80:00:02:08:FE:80:00:00:00:00:00:00:0C:42:A1:03:00:9B:5E:21"
    host = {
        "labels": host_labels("gpu"),
        "nics": [
            {"name": "mgmt-0", "mac": "0c:42:a1:9b:5e:20", "role": "management"},
            {"name": "data-0", "mac": "0c:42:a1:9b:5e:21", "role": "fabric"},
            {"name": "ib0", "mac": ipoib, "role": "fabric"},
        ],
    }
    created = (await stack.bmaas_http.post("/lab/v1/hosts", json=host)).raise_for_status().json()
    hosts = (await stack.bmaas_http.get("/lab/v1/hosts")).json()["items"]
    # The twin gives the first free host of the class: order them all, so this one is among them.
    free = [h for h in hosts if h["state"] == "FREE" and h["labels"] == created["labels"]]
    order = await stack.create_order({"bm-gpu": len(free)})
    await stack.apply(order, {"bm-gpu": len(free)})
    await stack.wait_ready(order, len(free))

    (bmi,) = [
        b
        for b in await stack.bmis(order)
        if ipoib.lower() in {n["mac"] for n in b["status"]["hardware"]["nics"]}
    ]
    agent = next(
        a
        for a in await stack.agents(order.namespace)
        if ipoib.lower() in {i["macAddress"] for i in a["status"]["inventory"]["interfaces"]}
    )
    assert agent["spec"]["approved"] is True
    status = await stack.api.status(order)
    worker = next(w for w in status.workers if w.resource_id == bmi["id"])
    assert worker.phase == WorkerPhase.READY
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []


async def test_an_order_of_the_same_name_in_another_namespace_never_touches_the_first_ones_host(
    stack: Stack,
) -> None:
    """BMaaS knows an order by its name (OSAC's order id), so two ClusterOrders of one name in two
    namespaces would give their workers the same BMI names. The second must never adopt, and never
    release, the first one's host: its workers fail, saying why, and the first stays Ready."""
    first = await stack.create_order({"bm-standard": 1})
    await stack.apply(first, {"bm-standard": 1})
    await stack.wait_ready(first, 1)
    (bmi,) = await stack.bmis(first)

    second = await stack.create_order({"bm-standard": 1}, name=first.name)
    assert second.namespace != first.namespace
    await stack.apply(second, {"bm-standard": 1})

    async def second_failed() -> list[str] | None:
        """The activity failures an operator reads in the worker's history (the tenant sees a
        generic reason)."""
        workers = (await stack.api.status(second)).workers
        if not any(w.last_failure_reason == FailureReason.BMI_PROVISIONING_FAILED for w in workers):
            return None
        handle = stack.client.get_workflow_handle(worker_workflow_id(second, second.worker_name(0)))
        return [
            e.activity_task_failed_event_attributes.failure.message
            for e in (await handle.fetch_history()).events
            if e.HasField("activity_task_failed_event_attributes")
        ]

    failures = await eventually(second_failed, "the second order's worker to fail", timeout=90)
    assert any(f"belongs to ClusterOrder {first.key}, not {second.key}" in m for m in failures), failures
    assert [b["id"] for b in await stack.bmis(first)] == [bmi["id"]]
    assert [w.phase for w in (await stack.api.status(first)).workers] == [WorkerPhase.READY]
    wiped = {r["bmi_id"] for r in await stack.audit() if r["kind"] in ("WIPE_STARTED", "WIPE_FINISHED")}
    assert bmi["id"] not in wiped

    # Its release looks for a BMI an interrupted create may have left: never the first one's.
    await stack.decommission_and_wait(second)
    assert [b["id"] for b in await stack.bmis(first)] == [bmi["id"]]
    await stack.decommission_and_wait(first)
    assert await stack.bmis(first) == []


def boot_images(bmis: list[dict]) -> set[str]:
    return {b["spec"]["image"]["source_ref"] for b in bmis}


async def test_an_order_that_names_no_release_boots_its_hosted_clusters_release(stack: Stack) -> None:
    """`spec.releaseImage` is optional: the template's default release applies, and the hosted
    cluster's NodePools are where it shows. The workers boot that release's RHCOS image."""
    order = await stack.create_order({"bm-standard": 2}, release_image=None)
    await stack.apply(order, {"bm-standard": 2})
    await stack.wait_ready(order, 2)
    assert boot_images(await stack.bmis(order)) == {seeded_id("disk_image", DISK_IMAGE_NAME)}
    (cluster_history,) = [
        h for h in await stack.histories(order) if h.workflow_id == cluster_workflow_id(order)
    ]
    scheduled = scheduled_activities(cluster_history.events)
    assert scheduled.count(HubActivity.READ_CLUSTER_RELEASE) == 1
    # The order's first command arrived while preparing, before its facts were read: read once.
    assert scheduled.count(HubActivity.READ_ORDER) == 1
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


@pytest.mark.parametrize("named_by", ["nodepool", "order"])
async def test_a_release_nobody_names_yet_waits_visibly_and_allocates_nothing(
    stack: Stack, named_by: str
) -> None:
    """An order without `releaseImage` whose hosted cluster has no NodePool yet: nothing is
    allocated and the order says why, until a NodePool names the release, or the tenant names one
    on the order."""
    order = await stack.create_order(
        {"bm-standard": 1},
        release_image=None,
        # The lab's cluster provisioning leaves it alone: this test makes the cluster by hand.
        annotations={"osac.openshift.io/management-state": "unmanaged"},
    )
    reference = {
        "namespace": order.namespace,
        "hostedClusterName": order.name,
        "roleBindingName": f"{order.name}-admin",
        "serviceAccountName": f"{order.name}-admin",
    }
    response = await stack.hub_http.patch(
        f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}/status",
        json={"status": {"clusterReference": reference}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    response.raise_for_status()
    await stack.apply(order, {"bm-standard": 1})

    condition = await wait_condition(stack, order, "RHCOSImageNotFound", "True", timeout=90)
    assert condition["reason"] == "ReleaseImageUnknown"
    assert "spec.releaseImage is not set" in condition["message"]
    assert (await stack.api.status(order)).workers == []
    assert await stack.bmis(order) == []

    if named_by == "order":
        response = await stack.hub_http.patch(
            f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}",
            json={"spec": {"releaseImage": RELEASE_IMAGE}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        response.raise_for_status()

        # Before any NodePool exists: the order's release is what was found.
        await wait_condition(stack, order, "RHCOSImageNotFound", "False", timeout=90)
    response = await stack.hub_http.post(
        f"/apis/hypershift.openshift.io/v1beta1/namespaces/{order.namespace}/nodepools",
        json={
            "apiVersion": "hypershift.openshift.io/v1beta1",
            "kind": "NodePool",
            "metadata": {"name": order.nodepool_name("bm-standard")},
            "spec": {
                "clusterName": order.name,
                "replicas": 0,
                "release": {"image": RELEASE_IMAGE},
                "platform": {
                    "type": "Agent",
                    "agent": {
                        "agentLabelSelector": {
                            "matchLabels": {
                                "osac.openshift.io/clusterorder": order.name,
                                "osac.openshift.io/resource_class": "bm-standard",
                            }
                        }
                    },
                },
            },
        },
    )
    response.raise_for_status()
    await stack.wait_ready(order, 1)
    assert boot_images(await stack.bmis(order)) == {seeded_id("disk_image", DISK_IMAGE_NAME)}
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def set_pull_secret(stack: Stack, order: OrderRef, pull_secret: str | None) -> None:
    """The tenant edits the order's `spec.pullSecret` (None: removes it)."""
    response = await stack.hub_http.patch(
        f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}",
        json={"spec": {"pullSecret": pull_secret}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    response.raise_for_status()


async def test_a_rotated_pull_secret_and_a_new_ssh_key_reach_the_hosts_booted_after(stack: Stack) -> None:
    """The tenant edits the ClusterOrder's pull secret and SSH key; the next command (the controller
    sends one for every new generation) brings the InfraEnv in line before another host boots its
    ignition. Neither ever enters a history."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await stack.wait_ready(order, 1)
    assert await stack.infraenv_inputs(order) == (PULL_SECRET, SSH_KEY)

    rotated = json.dumps({"auths": {"quay.io": {"auth": base64.b64encode(b"robot:r0tated-pull").decode()}}})
    new_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx9nNewKeyForTheRotationTest0000000000000 n@x"
    response = await stack.hub_http.patch(
        f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}",
        json={"spec": {"pullSecret": rotated, "sshPublicKey": new_key}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    response.raise_for_status()
    await stack.apply(order, {"bm-standard": 2})

    async def in_line() -> bool:
        return await stack.infraenv_inputs(order) == (rotated, new_key)

    await eventually(in_line, "the InfraEnv to carry the new pull secret and SSH key")
    await stack.wait_ready(order, 2)

    # An edit that is no pull secret is not written: the hosts keep booting with the last good one,
    # and the order says so until it is corrected.
    await set_pull_secret(stack, order, "robot:r0tated-pull")
    await stack.apply(order, {"bm-standard": 2})

    async def image_condition() -> tuple[str, str, str]:
        found = [c for c in (await stack.api.status(order)).conditions if c.type == "InfraEnvReady"]
        return (found[0].status, found[0].reason or "", found[0].message or "") if found else ("", "", "")

    async def refused() -> bool:
        return (await image_condition())[1] == "PullSecretInvalid"

    await eventually(refused, "InfraEnvReady to say the pull secret is not applied")
    status, _, message = await image_condition()
    assert status == "True" and message.startswith("spec.pullSecret is not a pull secret: it is not JSON.")
    assert await stack.infraenv_inputs(order) == (rotated, new_key)

    # Its Secret deleted behind our back: nothing good is left to keep, and no host could boot.
    ref = InfraEnvRef.for_order(order)
    secret = f"/api/v1/namespaces/{ref.namespace}/secrets/{ref.pull_secret_name}"
    (await stack.hub_http.delete(secret)).raise_for_status()
    await stack.apply(order, {"bm-standard": 2})

    async def secret_gone_shown() -> bool:
        return (await image_condition())[0] == "False"

    await eventually(secret_gone_shown, "InfraEnvReady=False once the kept Secret is gone")
    assert (await image_condition())[1:] == (
        "PullSecretInvalid",
        "spec.pullSecret is not a pull secret: it is not JSON, and the InfraEnv's pull Secret is gone:"
        " no new host boots until that is corrected.",
    )
    # The tenant removes the pull secret (no default is configured): the order says so now.
    await set_pull_secret(stack, order, None)
    await stack.apply(order, {"bm-standard": 2})

    async def missing_shown() -> bool:
        return (await image_condition())[1] == "PullSecretMissing"

    await eventually(missing_shown, "InfraEnvReady=False/PullSecretMissing once the pull secret is removed")
    assert await image_condition() == (
        "False",
        "PullSecretMissing",
        "spec.pullSecret is not set and no default pull secret is configured, and the InfraEnv's pull"
        " Secret is gone: no new host boots until that is corrected.",
    )
    await set_pull_secret(stack, order, PULL_SECRET)
    await stack.apply(order, {"bm-standard": 2})

    async def applied() -> bool:
        return (await image_condition())[:2] == ("True", "ImageCreated")

    await eventually(applied, "InfraEnvReady=True/ImageCreated once the pull secret is corrected")
    assert (await stack.infraenv_inputs(order))[0] == PULL_SECRET  # the Secret written again

    # Removed while the Secret is there: it is kept, as a refused one is, and the order says why.
    await set_pull_secret(stack, order, None)
    await stack.apply(order, {"bm-standard": 2})
    await eventually(missing_shown, "InfraEnvReady=True/PullSecretMissing while the Secret is kept")
    assert await image_condition() == (
        "True",
        "PullSecretMissing",
        "spec.pullSecret is not set and no default pull secret is configured. The discovery image keeps"
        " the pull secret it was built with, and new hosts boot with it until that is corrected.",
    )
    assert (await stack.infraenv_inputs(order))[0] == PULL_SECRET

    (cluster_history,) = [
        h for h in await stack.histories(order) if h.workflow_id == cluster_workflow_id(order)
    ]
    ensures = scheduled_activities(cluster_history.events).count(HubActivity.ENSURE_INFRAENV)
    assert ensures == 7  # the first, then one per command
    texts = json.dumps([h.to_json_dict() for h in await stack.histories(order)])
    assert "r0tated-pull" not in texts and base64.b64encode(b"robot:r0tated-pull").decode() not in texts
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_a_pull_secret_that_is_none_is_shown_and_its_fix_applied(stack: Stack) -> None:
    """An order whose pull secret is no pull secret: nothing is created from it, and the order says
    which field is wrong and why. The tenant fixes the order, and the next command applies it."""
    order = await stack.create_order({"bm-standard": 1})
    await set_pull_secret(stack, order, "not-a-docker-config")
    await stack.apply(order, {"bm-standard": 1})

    async def refused() -> dict[str, Any] | None:
        conditions = (await stack.order_object(order)).get("status", {}).get("conditions") or []
        found = [c for c in conditions if c["type"] == "InfraEnvReady" and c["reason"] == "PullSecretInvalid"]
        return found[0] if found else None

    condition = await eventually(refused, "InfraEnvReady=False/PullSecretInvalid")
    assert condition["status"] == "False"
    assert condition["message"] == (
        "spec.pullSecret is not a pull secret: it is not JSON; no workers are created until it is corrected."
    )
    ref = InfraEnvRef.for_order(order)
    secret = await stack.hub_http.get(f"/api/v1/namespaces/{ref.namespace}/secrets/{ref.pull_secret_name}")
    assert secret.status_code == 404
    assert await stack.bmis(order) == []

    await set_pull_secret(stack, order, PULL_SECRET)
    await stack.apply(order, {"bm-standard": 1})  # the controller's command for the new generation
    await stack.wait_ready(order, 1)
    assert (await stack.infraenv_inputs(order))[0] == PULL_SECRET
    histories = await stack.histories(order)
    assert "not-a-docker-config" not in json.dumps([h.to_json_dict() for h in histories])
    await replay_clean(histories)
    await stack.decommission_and_wait(order)


async def test_a_ready_workers_host_that_fails_or_vanishes_is_released_and_replaced(stack: Stack) -> None:
    """A Ready worker waits only for its scale-down; its host can still break (the BMI turns FAILED)
    or be deleted behind our back. The cluster workflow's check finds both: each worker leaves as on
    a scale-down (Unbinding or Deleting, never Failed, which is for attempts that never reached
    Ready), showing HostLost while it releases its host (a FAILED BMI is deleted and wiped), and a
    new worker replaces it at once. A WorkerFailed Event says so."""
    # A replacement given the deleted host waits for the old slot's release: time enough for it.
    api = stack.with_policy(
        ready_host_check=timedelta(seconds=1), agent_registration_timeout=timedelta(seconds=120)
    )
    order = await stack.create_order({"bm-standard": 3})
    await stack.apply(order, {"bm-standard": 3}, api)
    before = {w.name: w.resource_id for w in (await stack.wait_ready(order, 3)).workers}
    broken, deleted, healthy = (order.worker_name(i) for i in range(3))
    seen: dict[str, set[tuple[WorkerPhase, FailureReason | None]]] = {broken: set(), deleted: set()}

    async def replaced() -> dict[str, WorkerStatus] | None:
        status = await stack.api.status(order)
        workers = {w.name: w for w in status.workers}
        for name in seen:
            if name in workers:
                seen[name].add((workers[name].phase, workers[name].last_failure_reason))
        gone = broken not in workers and deleted not in workers
        return workers if gone and status.ready_workers == 3 else None

    (await stack.bmaas_http.post(f"/lab/v1/baremetal_instances/{before[broken]}/break")).raise_for_status()
    (
        await stack.bmaas_http.delete(f"/api/private/v1/baremetal_instances/{before[deleted]}")
    ).raise_for_status()
    workers = await eventually(replaced, "both lost hosts' workers replaced by new ones", timeout=120)
    assert set(workers) == {healthy, order.worker_name(3), order.worker_name(4)}
    for name in seen:  # as often as the status was looked at: never Failed
        assert all(phase != WorkerPhase.FAILED for phase, _ in seen[name]), seen[name]
    assert all(w.attempt_count == 1 for w in workers.values())
    assert workers[healthy].resource_id == before[healthy]
    assert {b["id"] for b in await stack.bmis(order)} == {w.resource_id for w in workers.values()}
    wiped = {r["bmi_id"] for r in await stack.audit() if r["kind"] == "WIPE_FINISHED"}
    assert before[broken] in wiped  # the broken host went back to the pool only after its wipe
    assert before[healthy] not in wiped

    async def told() -> list[str] | None:
        response = await stack.hub_http.get(f"/api/v1/namespaces/{order.namespace}/events")
        failed = [
            e.get("message", "")
            for e in response.raise_for_status().json()["items"]
            if e.get("reason") == "WorkerFailed"
        ]
        return failed if len([m for m in failed if "lost its host" in m]) == 2 else None

    failed = await eventually(told, "a WorkerFailed Event for each lost host")
    assert not [m for m in failed if "failed: HostLost" in m]  # no attempt failed on the old path
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
    # The checks, the signals and the replacements replay as they ran.
    histories = await stack.histories(order)
    cluster = next(h for h in histories if h.workflow_id == cluster_workflow_id(order))
    assert BmaasActivity.FIND_LOST_INSTANCES in scheduled_activities(cluster.events)
    await replay_clean(histories)


async def _set_security_groups(stack: Stack, order: OrderRef, groups: list[str]) -> None:
    """The tenant edits the order's `securityGroupRefs` (its subnet stays subnet-a)."""
    response = await stack.hub_http.patch(
        f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}",
        json={"spec": {"networkAttachment": {"subnetRef": "subnet-a", "securityGroupRefs": groups}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    response.raise_for_status()


async def test_the_orders_new_security_groups_reach_its_running_hosts_and_those_booted_after(
    stack: Stack,
) -> None:
    """The tenant tightens `securityGroupRefs` on a live order (and loosens it back, and tightens it
    again). The next command puts every host of the order in the order's groups: the running ones, a
    new worker's, and the replacement host of a worker started with other groups."""
    api = stack.with_policy(ready_host_check=timedelta(seconds=1))
    order = await stack.create_order(
        {"bm-standard": 2}, network={"subnetRef": "subnet-a", "securityGroupRefs": ["sg-open"]}
    )
    await stack.apply(order, {"bm-standard": 2}, api)
    before = {w.name: w.resource_id for w in (await stack.wait_ready(order, 2)).workers}
    assert set(map(tuple, (await stack.security_groups(order)).values())) == {("sg-open",)}

    async def all_in(groups: list[str], count: int) -> bool:
        found = await stack.security_groups(order)
        return len(found) == count and all(g == groups for g in found.values())

    async def all_tight(count: int) -> bool:
        return await all_in(["sg-tight"], count)

    # Changed and changed back (the same count: the controller's command for each generation):
    # the hosts follow both ways, though every worker started in the first groups.
    await _set_security_groups(stack, order, ["sg-tight"])
    await stack.apply(order, {"bm-standard": 2}, api)
    await eventually(lambda: all_tight(2), "the running hosts in the new security groups")
    await _set_security_groups(stack, order, ["sg-open"])
    await stack.apply(order, {"bm-standard": 2}, api)
    await eventually(lambda: all_in(["sg-open"], 2), "the running hosts back in the first ones")

    await _set_security_groups(stack, order, ["sg-tight"])
    await stack.apply(order, {"bm-standard": 3}, api)
    await eventually(lambda: all_tight(3), "the running hosts and the new one in the new security groups")
    await stack.wait_ready(order, 3)

    # A worker started with the old groups loses its host: its replacement is in the new groups.
    old_worker = order.worker_name(0)
    (
        await stack.bmaas_http.post(f"/lab/v1/baremetal_instances/{before[old_worker]}/break")
    ).raise_for_status()

    async def replaced() -> bool:
        status = await stack.api.status(order)
        return status.ready_workers == 3 and old_worker not in {w.name for w in status.workers}

    await eventually(replaced, "the broken host's worker replaced", timeout=120)
    await eventually(lambda: all_tight(3), "the replacement host in the new security groups")

    histories = await stack.histories(order)
    cluster = next(h for h in histories if h.workflow_id == cluster_workflow_id(order))
    assert BmaasActivity.APPLY_SECURITY_GROUPS in scheduled_activities(cluster.events)
    await replay_clean(histories)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_security_groups_bmaas_refuses_are_shown_and_put_again_until_done(stack: Stack) -> None:
    """BMaaS refuses the PATCH that moves a host to the order's new security groups (a 403: a token
    mid-rotation, a group not there yet). The order says so, and the groups are put again every
    `prerequisite_recheck` until BMaaS takes them; then the order says they are applied."""
    api = stack.with_policy(prerequisite_recheck=timedelta(seconds=1))
    order = await stack.create_order(
        {"bm-standard": 1}, network={"subnetRef": "subnet-a", "securityGroupRefs": ["sg-open"]}
    )
    await stack.apply(order, {"bm-standard": 1}, api)
    await stack.wait_ready(order, 1)
    refused = {"PATCH /api/private/v1/baremetal_instances/{id}": {"error_rate": 1.0, "error_code": 7}}

    await stack.set_bmaas_faults(routes=refused)
    await _set_security_groups(stack, order, ["sg-tight"])
    await stack.apply(order, {"bm-standard": 1}, api)

    async def groups_condition(status: str) -> bool:
        conditions = {c.type: c for c in (await stack.api.status(order)).conditions}
        shown = conditions.get(OrderConditionType.SECURITY_GROUPS_APPLIED.value)
        return shown is not None and shown.status == status

    await eventually(lambda: groups_condition("False"), "the refused security groups shown on the order")
    assert set(map(tuple, (await stack.security_groups(order)).values())) == {("sg-open",)}
    await stack.clear_bmaas_faults()

    async def tight() -> bool:
        return set(map(tuple, (await stack.security_groups(order)).values())) == {("sg-tight",)}

    await eventually(tight, "the host in the new security groups once BMaaS takes them")
    await eventually(lambda: groups_condition("True"), "the order saying the groups are applied")

    # Emptied, and refused again: no groups at all is a change like any other, shown and put again.
    await stack.set_bmaas_faults(routes=refused)
    await _set_security_groups(stack, order, [])
    await stack.apply(order, {"bm-standard": 1}, api)
    await eventually(lambda: groups_condition("False"), "the refused removal of every group shown")
    await stack.clear_bmaas_faults()

    async def emptied() -> bool:
        return set(map(tuple, (await stack.security_groups(order)).values())) == {()}

    await eventually(emptied, "the host out of every security group once BMaaS takes it")
    await eventually(lambda: groups_condition("True"), "the order saying the groups are applied again")
    await replay_clean(await stack.histories(order))
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_workers_stopped_from_outside_release_their_hosts(stack: Stack) -> None:
    """An operator terminates two Ready workers' workflows in the Web UI and cancels a third. The
    cancelled one releases its host (wiped) and completes, and the order replaces it. The order's
    workflow does not fail when it next tells the terminated ones something: the one whose host
    breaks is started again to release that host and is replaced by a new worker; at decommission
    the other is started again to unbind its Agent and give back its host, wiped. One terminated
    while it leaves (its host's delete held) is started again at the next look to finish its
    release. Nothing is left behind."""
    api = stack.with_policy(**QUICK_RESTARTS)
    order = await stack.create_order({"bm-standard": 3})
    await stack.apply(order, {"bm-standard": 3}, api)
    before = {w.name: w.resource_id for w in (await stack.wait_ready(order, 3)).workers}
    leaves, breaks, cancelled = (order.worker_name(i) for i in range(3))
    for name in (leaves, breaks):
        await stack.client.get_workflow_handle(worker_workflow_id(order, name)).terminate(reason="test")
    (await stack.bmaas_http.post(f"/lab/v1/baremetal_instances/{before[breaks]}/break")).raise_for_status()
    cancelled_run = stack.client.get_workflow_handle(worker_workflow_id(order, cancelled))
    await cancelled_run.cancel()

    async def replaced() -> dict[str, WorkerStatus] | None:
        status = await stack.api.status(order)
        workers = {w.name: w for w in status.workers}
        return workers if status.ready_workers == 3 and not {breaks, cancelled} & set(workers) else None

    workers = await eventually(replaced, "the broken host's and the cancelled worker replaced", timeout=120)
    held = min(set(workers) - {leaves})  # a replacement, whose release is held below
    assert (await cancelled_run.describe()).status == WorkflowExecutionStatus.COMPLETED
    wiped = {r["bmi_id"] for r in await stack.audit() if r["kind"] == "WIPE_FINISHED"}
    assert {before[breaks], before[cancelled]} <= wiped

    # Every host's delete fails until the faults are cleared: the workers stay leaving.
    await stack.set_bmaas_faults(
        routes={"DELETE /api/private/v1/baremetal_instances/{id}": {"error_rate": 1.0}}
    )
    try:
        await stack.api.decommission(order)

        async def held_deleting() -> bool:
            workers = {w.name: w for w in (await stack.api.status(order)).workers}
            return workers[held].phase == WorkerPhase.DELETING

        await eventually(held_deleting, f"{held} deleting its host")
        stopped = stack.client.get_workflow_handle(worker_workflow_id(order, held))
        stopped_run = (await stopped.describe()).run_id
        await stopped.terminate(reason="test")

        async def started_again() -> bool:
            latest = await stack.client.get_workflow_handle(worker_workflow_id(order, held)).describe()
            return latest.run_id != stopped_run and latest.status == WorkflowExecutionStatus.RUNNING

        # Before the delete goes through: the stopped run's own wait may still finish it meanwhile.
        await eventually(started_again, f"{held}, stopped while leaving, started again")
    finally:
        await stack.clear_bmaas_faults()
    await asyncio.wait_for(stack.api.wait_finished(order), 180)
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    wiped = {r["bmi_id"] for r in await stack.audit() if r["kind"] == "WIPE_FINISHED"}
    assert before[leaves] in wiped
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


async def test_a_victim_whose_release_ends_while_its_pass_starts_others_does_not_fail_the_order(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """One command lowers one node set and raises the other. The pass that chooses the first's
    worker as its victim starts the other's new worker; meanwhile the victim's run is cancelled from
    outside and releases its host (the interceptor cancels it at that start and holds the start until
    the release is reported and the run has closed). The pass's `scale_down` then finds the
    victim's run closed: the order goes on (before, the failed signal failed the order's workflow)."""
    racing = [CancelVictimWhileStarting()]
    async with running_stack(temporal_env.client, tmp_path, worker_interceptors=racing) as raced:
        order = await raced.create_order({"bm-gpu": 1, "bm-standard": 1})
        await raced.apply(order, {"bm-gpu": 1, "bm-standard": 1})
        before = {w.name: w for w in (await raced.wait_ready(order, 2)).workers}
        victim, kept, new = (order.worker_name(i) for i in range(3))
        assert before[victim].node_set == "bm-gpu" and before[kept].node_set == "bm-standard"
        await raced.apply(order, {"bm-gpu": 0, "bm-standard": 2})

        async def settled() -> bool:
            status = await raced.api.status(order)
            return [w.name for w in status.workers] == [kept, new] and status.ready_workers == 2

        await eventually(settled, f"{victim} released and {new} Ready", timeout=120)
        order_run = raced.client.get_workflow_handle(cluster_workflow_id(order))
        assert (await order_run.describe()).status == WorkflowExecutionStatus.RUNNING
        victim_run = await raced.client.get_workflow_handle(worker_workflow_id(order, victim)).describe()
        assert victim_run.status == WorkflowExecutionStatus.COMPLETED
        failed_signals = [
            e
            for e in (await order_run.fetch_history()).events
            if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED
        ]
        # The interceptor's, which found the victim's run closed, then the pass's tell.
        assert len(failed_signals) == 2
        await raced.decommission_and_wait(order)
        assert await raced.bmis(order) == []
        assert await raced.agents(order.namespace) == []
        assert await raced.audit_violations() == []
        await replay_clean(await raced.histories(order), racing)


async def test_a_late_report_of_an_earlier_order_of_the_same_name_is_not_taken(stack: Stack) -> None:
    """The tenant deletes an order and creates it again under the same name: the new order's
    workflow has the same id, and its slots the same names. A late copy of the earlier worker's
    last report (its activity retried after delivering it) reaches the new run: it is not taken.
    Before, that `deleted` report made the new order drop its live worker, which kept its host
    while a replacement was allocated another."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await stack.wait_ready(order, 1)
    await stack.decommission_and_wait(order)
    order_id = cluster_workflow_id(order)
    (earlier,) = [h for h in await stack.histories(order) if h.workflow_id == order_id]
    last = [r for r in delivered_reports(earlier) if r.deleted][-1:]
    assert [r.status.name for r in last] == [order.worker_name(0)]
    path = f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}"
    (await stack.hub_http.delete(path)).raise_for_status()
    await stack.create_order({"bm-standard": 1}, namespace=order.namespace, name=order.name)
    node_sets = [NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=1)]
    await stack.api.apply(order, node_sets, instance_types=INSTANCE_TYPES, after_completed_run=True)
    (worker,) = (await stack.wait_ready(order, 1)).workers
    assert worker.name == last[0].status.name
    runs = [h for h in await stack.histories(order) if h.workflow_id == order_id]
    (new_run,) = [h for h in runs if h.run_id != earlier.run_id]
    # Numbered above every report of the new worker so far: a copy of a report it has would be dropped.
    assert last[0].sequence > max(r.sequence for r in delivered_reports(new_run))
    await stack.client.get_workflow_handle(order_id).signal(
        ClusterWorkersWorkflow.worker_reports, WorkerReports(reports=last)
    )
    await stack.apply(order, {"bm-standard": 1})  # answered once the signal before it is taken
    status = await stack.api.status(order)
    assert [(w.name, w.resource_id, w.phase) for w in status.workers] == [
        (worker.name, worker.resource_id, WorkerPhase.READY)
    ]
    assert len(await stack.bmis(order)) == 1
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


async def test_a_report_this_code_cannot_read_is_left_out_alone_not_its_batch(stack: Stack) -> None:
    """During a rolling deploy a newer worker process can deliver a report this code cannot read (a
    failure reason added since) in one `worker_reports` signal with reports it can. Only that one is
    left out. Before, the whole batch was dropped as undecodable, with the other workers' reports in
    it (a `deleted` among them left its slot waiting for the next look)."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    (worker,) = (await stack.wait_ready(order, 1)).workers
    failed = worker.model_copy(
        update={"phase": WorkerPhase.FAILED, "last_failure_reason": FailureReason.AGENT_INSTALL_FAILED}
    )
    readable = WorkerReport(status=failed).model_dump(mode="json", by_alias=True)  # unnumbered: taken
    newer = {**readable, "status": {**readable["status"], "lastFailureReason": "AReasonAddedLater"}}
    order_run = stack.client.get_workflow_handle(cluster_workflow_id(order))
    await order_run.signal("worker_reports", {"reports": [newer, readable]})
    await stack.apply(order, {"bm-standard": 1})  # answered once the signal before it is taken
    (shown,) = (await stack.api.status(order)).workers
    assert (shown.phase, shown.last_failure_reason) == (
        WorkerPhase.FAILED,
        FailureReason.AGENT_INSTALL_FAILED,
    )
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    await replay_clean(await stack.histories(order))


async def test_a_worker_cancelled_from_outside_is_replaced_while_it_still_leaves(stack: Stack) -> None:
    """An operator cancels a Ready worker's workflow in the Web UI and its drain hangs, so its
    release waits. The order starts its replacement at once, as for a scale-down's leaver, instead
    of once the release has ended (never, while the drain hangs)."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    first = (await stack.wait_ready(order, 1)).workers[0]
    replacement = order.worker_name(1)
    (agent,) = [a["metadata"]["name"] for a in await stack.agents(order.namespace)]
    await stack.set_agent_faults({"hanging_drain": {"agents": [agent]}})
    try:
        await stack.client.get_workflow_handle(worker_workflow_id(order, first.name)).cancel()

        async def replaced_while_leaving() -> bool:
            workers = {w.name: w for w in (await stack.api.status(order)).workers}
            leaving = workers.get(first.name)
            return leaving is not None and leaving.phase == WorkerPhase.UNBINDING and replacement in workers

        await eventually(replaced_while_leaving, f"{replacement} started while {first.name} still unbinds")
    finally:
        await stack.clear_agent_faults()

    async def settled() -> bool:
        status = await stack.api.status(order)
        return [w.name for w in status.workers] == [replacement] and status.ready_workers == 1

    await eventually(settled, f"{first.name} released and {replacement} Ready", timeout=120)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


async def test_a_worker_terminated_before_it_is_ready_releases_its_host_and_is_replaced(stack: Stack) -> None:
    """An operator terminates a worker's workflow while its host waits for its Agent. The order sees
    the run end and starts it again at once, to release what it held (found by the slot's name: the
    BMI, wiped), and starts another worker in its place: the order reaches its count with nothing
    told and nothing left behind."""
    api = stack.with_policy(**QUICK_RESTARTS)
    await stack.set_agent_faults({"never_register": {"rate": 1.0}})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1}, api)
        first = order.worker_name(0)
        held = await stack.wait_worker_phase(order, first, WorkerPhase.WAITING_FOR_AGENT)
        stopped_run = await stack.terminate_worker(order, first)
    finally:
        await stack.clear_agent_faults()
    await stack.wait_terminated_worker_replaced(
        order, first, stopped_run, held.resource_id, replacement=order.worker_name(1)
    )
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


async def test_a_worker_terminated_as_its_agent_registers_leaves_no_registration(stack: Stack) -> None:
    """An operator terminates a worker's workflow after its host's Agent registered but before the
    Agent was handed over (the hand-off keeps failing). The restarted run finds the registration
    from the slot's BMI's MACs and deletes it with the host: nothing of the host stays on the hub."""
    api = stack.with_policy(**QUICK_RESTARTS)
    hand_offs_fail = {"errors": [{"code": 500, "verbs": ["patch"], "resources": ["agents"]}]}
    (await stack.hub_http.put("/lab/v1/faults/api", json=hand_offs_fail)).raise_for_status()
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1}, api)
        first = order.worker_name(0)

        async def registered() -> str | None:
            agents = await stack.agents(order.namespace)
            return str(agents[0]["metadata"]["name"]) if agents else None

        registration = await eventually(registered, f"the Agent of {first}'s host registered")
        stopped_run = await stack.terminate_worker(order, first)

        async def released() -> bool:
            latest = await stack.client.get_workflow_handle(worker_workflow_id(order, first)).describe()
            return latest.run_id != stopped_run and latest.status == WorkflowExecutionStatus.COMPLETED

        # Released while hand-offs still fail: the registration cannot have been handed meanwhile.
        await eventually(released, f"{first} restarted and released", timeout=120)
        assert registration not in {a["metadata"]["name"] for a in await stack.agents(order.namespace)}
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    status = await stack.wait_ready(order, 1)
    assert [w.name for w in status.workers] == [order.worker_name(1)]
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


async def test_a_host_registering_again_before_its_wipe_leaves_no_registration(stack: Stack) -> None:
    """A worker scaled down while its host's Agent is registered but not handed over (hand-offs keep
    failing). Its release deletes the Agent while the host still runs the discovery image, whose
    agent registers again until BMaaS powers the host off for its wipe (here the BMI's delete waits
    until it has). That registration is deleted once the host is wiped, not left until the
    decommission."""
    hand_offs_fail = {"errors": [{"code": 500, "verbs": ["patch"], "resources": ["agents"]}]}
    (await stack.hub_http.put("/lab/v1/faults/api", json=hand_offs_fail)).raise_for_status()
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        first = order.worker_name(0)

        async def registered() -> dict[str, Any] | None:
            agents = await stack.agents(order.namespace)
            return agents[0]["metadata"] if agents else None

        registration = await eventually(registered, f"the Agent of {first}'s host registered")
        await stack.set_bmaas_faults(
            routes={"DELETE /api/private/v1/baremetal_instances/{id}": {"hang_rate": 1.0}}
        )
        try:
            await stack.api.scale_down_worker(order, first)

            async def registered_again() -> bool:
                now = [a["metadata"] for a in await stack.agents(order.namespace)]
                return any(m["name"] == registration["name"] and m["uid"] != registration["uid"] for m in now)

            await eventually(registered_again, "the host's Agent deleted and registered again")
        finally:
            await stack.clear_bmaas_faults()  # the hung delete is answered 503 and made again
        worker = stack.client.get_workflow_handle(worker_workflow_id(order, first))
        await asyncio.wait_for(worker.result(), timeout=120)
        assert await stack.agents(order.namespace) == []
        assert await stack.bmis(order) == []
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    await stack.decommission_and_wait(order)
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


def test_a_wiped_host_is_swept_only_while_no_bmi_of_the_order_holds_it() -> None:
    """The sweep after a wipe takes the host's registrations from before the order's BMIs were seen
    without it; a BMI holding the host again (it may have registered for that one) or a list of
    unknown time (an older activity worker) means no sweep."""
    at = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)
    host, other = ["52:54:00:00:00:01", "52:54:00:00:00:02"], ["52:54:00:00:00:09"]

    def bmi(macs: list[str]) -> WorkerInstance:
        return WorkerInstance(id="b", name="o-worker-1", state=BmiState.RUNNING, macs=macs)

    assert registrations_cutoff(OrderInstances(instances=[], listed_at=at), host) == at
    # Matched in the workflow, not left to the activity's filter: another host's BMI is no holder.
    assert registrations_cutoff(OrderInstances(instances=[bmi(other)], listed_at=at), host) == at
    assert registrations_cutoff(OrderInstances(instances=[bmi(host[1:])], listed_at=at), host) is None
    assert registrations_cutoff(OrderInstances(instances=[]), host) is None


def test_a_quiet_leaver_is_told_again_less_and_less_often() -> None:
    """A wipe stuck for days is not signalled at every look; a run stopped meanwhile still restarts."""
    assert [looks for looks in range(1, 40) if _tell_again_at(looks)] == [1, 2, 4, 8, 12, 24, 36]


async def test_a_host_check_that_returns_after_a_scale_down_does_not_tell_the_departing_worker(
    stack: Stack,
) -> None:
    """The check of the Ready workers' hosts lists the order's BMIs; a scale-down can start while
    the list is on its way, and its worker's BMI is then DELETING by our own hand. That worker is
    not told its host was lost (the chaos run's invariant caught it being told)."""
    api = stack.with_policy(ready_host_check=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 2})
    await stack.apply(order, {"bm-standard": 2}, api)
    before = {w.name: w.resource_id for w in (await stack.wait_ready(order, 2)).workers}
    leaving, staying = order.worker_name(0), order.worker_name(1)
    cluster = stack.client.get_workflow_handle(cluster_workflow_id(order))
    # The next check's list hangs until the faults change.
    await stack.set_bmaas_faults(routes={"GET /api/private/v1/baremetal_instances": {"hang_rate": 1.0}})
    try:

        async def check_in_flight() -> bool:
            pending = (await cluster.describe()).raw_description.pending_activities
            return any(p.activity_type.name == BmaasActivity.FIND_LOST_INSTANCES for p in pending)

        await eventually(check_in_flight, "a check of the Ready workers' hosts waiting for its list")
        await stack.api.scale_down_worker(order, leaving)

        async def deleting() -> bool:
            response = await stack.bmaas_http.get(f"/api/private/v1/baremetal_instances/{before[leaving]}")
            return response.status_code == 404 or response.json()["status"]["state"].endswith("DELETING")

        await eventually(deleting, "the departing worker's BMI being deleted")
    finally:
        await stack.clear_bmaas_faults()  # the hung list is answered 503 and made again

    async def gone() -> bool:
        status = await stack.api.status(order)
        return [w.name for w in status.workers] == [staying] and status.ready_workers == 1

    await eventually(gone, "the departing worker gone and the other Ready")

    async def checked_after() -> bool:
        events = (await cluster.fetch_history()).events
        completed = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
        return scheduled_activities(events).count(BmaasActivity.FIND_LOST_INSTANCES) >= 2 and bool(completed)

    await eventually(checked_after, "the hung check answered and another made")
    told = [
        e
        for e in (await cluster.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
        and e.signal_external_workflow_execution_initiated_event_attributes.signal_name == "host_lost"
    ]
    assert told == []
    status = await stack.api.status(order)
    assert status.workers[0].resource_id == before[staying] and status.workers[0].attempt_count == 1
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_an_order_whose_namespace_is_deleted_is_decommissioned_to_the_end(stack: Stack) -> None:
    """The tenant deletes the order's namespace: the hub forbids new objects there (so every Event
    write is refused), yet the decommission runs to its end and the workflow completes, so the
    controller can drop its finalizer and the namespace can go."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await stack.wait_ready(order, 1)
    path = f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}"
    finalizer = {"metadata": {"finalizers": ["osac.openshift.io/baremetal-workers"]}}
    (await stack.hub_http.patch(path, json=finalizer, headers=MERGE_PATCH)).raise_for_status()
    (await stack.hub_http.delete(f"/api/v1/namespaces/{order.namespace}")).raise_for_status()
    await stack.decommission_and_wait(order, timeout=120)  # waits on the workflow's own end
    assert await stack.bmis(order) == []
    (
        await stack.hub_http.patch(path, json={"metadata": {"finalizers": None}}, headers=MERGE_PATCH)
    ).raise_for_status()


async def test_an_infraenv_the_hub_refuses_waits_and_the_orders_deletion_still_ends_it(stack: Stack) -> None:
    """The tenant deletes the namespace while the order's workflow prepares: the hub forbids the
    InfraEnv's Secret (403). The workflow does not fail (a failed one keeps the finalizer until an
    operator looks): it shows the refusal, asks again, and the decommission ends it."""
    order = await stack.create_order({"bm-standard": 1})

    async def provisioned() -> bool:
        return bool((await stack.order_object(order)).get("status", {}).get("clusterReference"))

    await eventually(provisioned, "the hosted cluster provisioned")
    path = f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}"
    finalizer = {"metadata": {"finalizers": ["osac.openshift.io/baremetal-workers"]}}
    (await stack.hub_http.patch(path, json=finalizer, headers=MERGE_PATCH)).raise_for_status()
    (await stack.hub_http.delete(f"/api/v1/namespaces/{order.namespace}")).raise_for_status()
    await stack.apply(order, {"bm-standard": 1})

    async def refused() -> dict[str, Any] | None:
        status = await stack.api.status(order)
        found = [c for c in status.conditions if c.type == "InfraEnvReady" and c.reason == "RequestRefused"]
        return found[0].model_dump() if found else None

    await eventually(refused, "InfraEnvReady=False/RequestRefused")
    await stack.decommission_and_wait(order, timeout=120)
    assert await stack.bmis(order) == []
    (
        await stack.hub_http.patch(path, json={"metadata": {"finalizers": None}}, headers=MERGE_PATCH)
    ).raise_for_status()


async def test_an_infraenv_deleted_behind_our_back_is_created_again_for_the_next_host(stack: Stack) -> None:
    """Someone deletes the order's InfraEnv; later a Ready worker's host breaks. Its replacement's
    first attempt finds no InfraEnv to boot from: it fails (InfraEnvMissing), the order's workflow
    creates the InfraEnv again, and the attempt after comes up on a new host, without waiting for a
    command."""
    api = stack.with_policy(ready_host_check=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    before = (await stack.wait_ready(order, 1)).workers[0]
    name = InfraEnvRef.for_order(order).name
    (
        await stack.hub_http.delete(f"{AGENT_API}/namespaces/{order.namespace}/infraenvs/{name}")
    ).raise_for_status()
    (
        await stack.bmaas_http.post(f"/lab/v1/baremetal_instances/{before.resource_id}/break")
    ).raise_for_status()

    async def back() -> WorkerStatus | None:
        status = await stack.api.status(order)
        ready = [w for w in status.workers if w.phase == WorkerPhase.READY and w.name != before.name]
        return ready[0] if len(status.workers) == 1 and len(ready) == 1 else None

    worker = await eventually(back, "a new worker on a new host", timeout=120)
    assert worker.resource_id != before.resource_id
    assert worker.attempt_count == 2 and worker.last_failure_reason == FailureReason.INFRAENV_MISSING
    assert [i["metadata"]["name"] for i in await stack.infraenvs(order.namespace)] == [name]
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def _infraenv_ensure_retried(stack: Stack, order: OrderRef) -> WorkflowHandle[Any, Any]:
    """Wait until the order's workflow retries its InfraEnv's ensure (the InfraEnv held deleting);
    the workflow's handle."""
    order_run = stack.client.get_workflow_handle(cluster_workflow_id(order))

    async def retried() -> bool:
        pending = (await order_run.describe()).raw_description.pending_activities
        ensure = HubActivity.ENSURE_INFRAENV.value
        return any(a.activity_type.name == ensure and a.attempt >= 2 for a in pending)

    await eventually(retried, "the InfraEnv's ensure retried while it is being deleted")
    return order_run


async def test_a_decommission_does_not_wait_for_an_infraenv_stuck_deleting(stack: Stack) -> None:
    """The order's InfraEnv is stuck deleting (a finalizer nobody removes) when a command comes: the
    command's refresh of the InfraEnv is retried as long as it stays so. A decommission stops that
    refresh: the worker leaves and its host is wiped while the InfraEnv is still held (before, the
    decommission, accepted, waited behind the refresh for as long as the InfraEnv was)."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await stack.wait_ready(order, 1)
    path = f"{AGENT_API}/namespaces/{order.namespace}/infraenvs/{InfraEnvRef.for_order(order).name}"
    held = {"metadata": {"finalizers": [HELD_BY_TEST]}}
    (await stack.hub_http.patch(path, json=held, headers=MERGE_PATCH)).raise_for_status()
    (await stack.hub_http.delete(path)).raise_for_status()
    try:
        await stack.apply(order, {"bm-standard": 1})  # a command: the order is read and refreshed
        await _infraenv_ensure_retried(stack, order)
        await stack.api.decommission(order)

        async def released() -> bool:
            return await stack.bmis(order) == [] and (await stack.api.status(order)).workers == []

        await eventually(released, "the worker released while the InfraEnv is still deleting", timeout=120)
        assert (await stack.hub_http.get(path)).status_code == 200
    finally:
        await stack.hub_http.patch(path, json={"metadata": {"finalizers": None}}, headers=MERGE_PATCH)
    await asyncio.wait_for(stack.api.wait_finished(order), 180)
    assert await stack.infraenvs(order.namespace) == []
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


async def test_an_order_cancelled_while_a_hub_call_of_it_is_retried_ends_cancelled(stack: Stack) -> None:
    """An operator cancels the order's run in the Web UI while it prepares and a hub call of it is
    being retried (its InfraEnv, an earlier one's of the same name, stuck deleting behind a
    finalizer). The run ends Canceled, as one cancelled during a wait does, with nothing allocated.
    Before, the cancelled call was shown as the hub refusing it (InfraEnvReady=False/RequestRefused)
    and the run went on."""
    order = await stack.create_order({"bm-standard": 1})
    infraenvs = f"{AGENT_API}/namespaces/{order.namespace}/infraenvs"
    earlier = sample_infraenv(order.infraenv_name)
    earlier["metadata"]["finalizers"] = [HELD_BY_TEST]
    (await stack.hub_http.post(infraenvs, json=earlier)).raise_for_status()
    path = f"{infraenvs}/{order.infraenv_name}"
    (await stack.hub_http.delete(path)).raise_for_status()
    try:
        await stack.apply(order, {"bm-standard": 1})
        order_run = await _infraenv_ensure_retried(stack, order)
        await order_run.cancel()

        assert await stack.order_run_ended(order) == WorkflowExecutionStatus.CANCELED
        assert await stack.bmis(order) == []
    finally:
        await stack.hub_http.patch(path, json={"metadata": {"finalizers": None}}, headers=MERGE_PATCH)
    await replay_clean(await stack.histories(order))


async def test_an_order_the_hub_will_not_show_waits_and_its_decommission_still_ends_it(stack: Stack) -> None:
    """A library caller starts workers for a ClusterOrder the hub does not have (yet, or any more):
    the workflow shows the refusal and asks again instead of failing, which would leave nobody to
    decommission it; nothing is allocated."""
    order = OrderRef(namespace="tenant-ghost", name="ghost")
    await stack.apply(order, {"bm-standard": 1})

    async def refused() -> bool:
        status = await stack.api.status(order)
        return any(c.type == "InfraEnvReady" and c.reason == "RequestRefused" for c in status.conditions)

    await eventually(refused, "InfraEnvReady=False/RequestRefused")
    final = await stack.decommission_and_wait(order)
    assert final.finished and final.workers == []
    assert await stack.bmis(order) == []


async def test_an_order_deleted_behind_a_library_callers_back_keeps_its_workflow(stack: Stack) -> None:
    """The ClusterOrder of a library-driven order is deleted while its workers are Ready. The next
    command cannot read the order again (its security groups): the workflow goes on with what it
    knows instead of failing with its hosts held, and the decommission releases them, wiped."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await stack.wait_ready(order, 1)
    path = f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}"
    (await stack.hub_http.delete(path)).raise_for_status()
    one = [NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=1)]
    await stack.api.apply(order, one, order_generation=2)

    async def read_refused() -> bool:
        for history in await stack.histories(order):
            if history.workflow_id != cluster_workflow_id(order):
                continue
            scheduled = {
                e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            }
            failed = [
                scheduled.get(e.activity_task_failed_event_attributes.scheduled_event_id)
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
            ]
            if HubActivity.READ_ORDER.value in failed:
                return True
        return False

    await eventually(read_refused, "the order's read refused")
    description = await stack.api.handle(order).describe()
    assert description.status == WorkflowExecutionStatus.RUNNING
    final = await stack.decommission_and_wait(order)
    assert final.finished and final.workers == []
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []


async def test_security_groups_changed_while_the_order_prepares_reach_its_first_hosts(stack: Stack) -> None:
    """The tenant tightens `securityGroupRefs` while the order waits for its boot image: the first
    hosts boot in the new groups, not in those read when the order began to prepare."""
    release = "quay.io/openshift-release-dev/ocp-release:4.21.1-x86_64"
    order = await stack.create_order(
        {"bm-standard": 1},
        release_image=release,
        network={"subnetRef": "subnet-a", "securityGroupRefs": ["sg-open"]},
    )
    await stack.apply(order, {"bm-standard": 1})

    async def waiting_for_image() -> bool:
        status = await stack.api.status(order)
        return any(c.type == "RHCOSImageNotFound" and c.status == "True" for c in status.conditions)

    await eventually(waiting_for_image, "RHCOSImageNotFound=True")
    tight = ["sg-tight"]
    (
        await stack.hub_http.patch(
            f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}",
            json={"spec": {"networkAttachment": {"subnetRef": "subnet-a", "securityGroupRefs": tight}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    ).raise_for_status()
    await stack.apply(order, {"bm-standard": 1})  # the controller's command for the new generation
    await stack.link_boot_image(release, "4.21.1")
    await stack.wait_ready(order, 1)
    assert list((await stack.security_groups(order)).values()) == [["sg-tight"]]
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_an_infraenv_created_again_waits_for_its_image_without_holding_the_order(stack: Stack) -> None:
    """The InfraEnv is deleted behind our back, and the order's pull secret has meanwhile become
    one no image can be built with, its Secret too (as written by versions that did not check it).
    The InfraEnv created again shows WaitingForImage; a named scale-down still goes through while it
    waits, and the tenant's fix brings the image and the replaced worker back."""
    api = stack.with_policy(ready_host_check=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 2})
    await stack.apply(order, {"bm-standard": 2}, api)
    before = {w.name: w.resource_id for w in (await stack.wait_ready(order, 2)).workers}
    broken, named = order.worker_name(0), order.worker_name(1)
    path = f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}"
    bad = {"spec": {"pullSecret": "not-a-docker-config"}}
    (await stack.hub_http.patch(path, json=bad, headers=MERGE_PATCH)).raise_for_status()
    ref = InfraEnvRef.for_order(order)
    unusable = {"data": {PULL_SECRET_KEY: base64.b64encode(b"not-a-docker-config").decode()}}
    secret = f"/api/v1/namespaces/{ref.namespace}/secrets/{ref.pull_secret_name}"
    (await stack.hub_http.patch(secret, json=unusable, headers=MERGE_PATCH)).raise_for_status()
    name = ref.name
    (
        await stack.hub_http.delete(f"{AGENT_API}/namespaces/{order.namespace}/infraenvs/{name}")
    ).raise_for_status()
    (await stack.bmaas_http.post(f"/lab/v1/baremetal_instances/{before[broken]}/break")).raise_for_status()

    async def waiting_for_image() -> bool:
        status = await stack.api.status(order)
        found = [c for c in status.conditions if c.type == "InfraEnvReady" and c.reason == "WaitingForImage"]
        return bool(found) and "created again" in (found[0].message or "")

    await eventually(waiting_for_image, "InfraEnvReady=False/WaitingForImage", timeout=120)
    leave = ScaleDownWorker(name=named)
    await stack.api.handle(order).signal(ClusterWorkersWorkflow.scale_down_worker, leave)

    async def named_gone() -> bool:
        return named not in {w.name for w in (await stack.api.status(order)).workers}

    await eventually(named_gone, "the named worker gone while the image is awaited", timeout=120)
    fixed = {"spec": {"pullSecret": PULL_SECRET}}
    (await stack.hub_http.patch(path, json=fixed, headers=MERGE_PATCH)).raise_for_status()
    await stack.apply(order, {"bm-standard": 1}, api)  # the controller's command for the new generation

    async def back() -> bool:
        status = await stack.api.status(order)
        ready = [w for w in status.workers if w.phase == WorkerPhase.READY]
        image = [c for c in status.conditions if c.type == "InfraEnvReady"]
        return (
            len(status.workers) == 1
            and len(ready) == 1
            and ready[0].name not in (broken, named)
            and image[0].status == "True"
        )

    await eventually(
        back, "the broken host's replacement Ready on the image built after the fix", timeout=120
    )
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
