"""Failure paths on the real dev server and both twins: each ends in the right state, visible in the
workflow and on the ClusterOrder, and leaves nothing behind."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, timedelta
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.bmaas.snapshot import BmiSnapshot
from contracts.activities import BmaasActivity, HubActivity
from contracts.hub import WORKER_LABEL, WaitAgentInstalledInput, WaitAndHandAgentInput
from contracts.refs import OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerStatus
from contracts.workflows import worker_workflow_id
from lab.hub_controllers.inventory import host_inventory, to_agent_inventory
from starter.api import WorkersApi
from tests.workflows.stack import (
    AGENT_API,
    RELEASE_IMAGE,
    Stack,
    eventually,
    fast_policy,
    record_regression,
    replay_clean,
    running_stack,
    scheduled_activities,
    wait_condition,
)
from workflows.cluster_workers import ClusterPatch

ALL = {"rate": 1.0}
INFRAENV_LABEL = "infraenvs.agent-install.openshift.io"


TENANT_TEXT_LEAKS = {
    "a BMI or other uuid": re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
    "a MAC address": re.compile(r"(?i)\b[0-9a-f]{2}(?::[0-9a-f]{2}){5}\b"),
    "an IP address": re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"),
    "a host id": re.compile(r"\bhost-\d+"),
    "backend error text": re.compile(r"(?i)Bmaas|NoMatchingHosts|HTTP|gRPC|Traceback|Exception|status code"),
}
TENANT_MESSAGES_SEEN: set[str] = set()


async def _collect_tenant_text(stack: Stack) -> None:
    """Every message the ClusterOrders show a tenant, sampled while the failure tests run."""
    while True:
        await asyncio.sleep(0.1)
        try:
            response = await stack.hub_http.get("/apis/osac.openshift.io/v1alpha1/clusterorders")
            items = response.raise_for_status().json().get("items", [])
        except httpx.HTTPError:  # a busy hub's missed sample must not end the sampling
            continue
        for order in items:
            status = order.get("status") or {}
            for worker in status.get("workers") or []:
                TENANT_MESSAGES_SEEN.add(worker.get("lastFailureMessage") or "")
            for cond in status.get("conditions") or []:
                TENANT_MESSAGES_SEEN.add(cond.get("message") or "")


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    policy = fast_policy(
        # Headroom for a loaded CI machine: registration and correlation must fit well inside it.
        agent_registration_timeout=timedelta(seconds=10),
        agent_install_timeout=timedelta(seconds=30),
        wipe_stuck_after=timedelta(seconds=2),
    )
    async with running_stack(
        temporal_env.client, tmp_path_factory.mktemp("failures"), policy=policy
    ) as running:
        collector = asyncio.create_task(_collect_tenant_text(running))
        yield running
        collector.cancel()


async def _worker(stack: Stack, order: OrderRef) -> WorkerStatus | None:
    status = await stack.api.status(order)
    return status.workers[0] if status.workers else None


async def _failed_with(stack: Stack, order: OrderRef, reason: FailureReason) -> WorkerStatus:
    async def probe() -> WorkerStatus | None:
        worker = await _worker(stack, order)
        # next_retry_time appears once the failed attempt's host is released and the backoff began.
        if worker and worker.last_failure_reason == reason and worker.next_retry_time is not None:
            assert worker.phase == WorkerPhase.FAILED
            return worker
        return None

    return await eventually(probe, f"a worker of {order.key} Failed with {reason.value}")


CREATE = "POST /api/private/v1/baremetal_instances"
LIST = "GET /api/private/v1/baremetal_instances"


async def _one_worker_with_a_faulty_create(
    stack: Stack, call_timeout_s: float, fault: dict[str, float]
) -> tuple[WorkersApi, OrderRef, str, Any]:
    """An order of one worker whose calls time out after `call_timeout_s`, BMaaS answering its
    create with `fault` (cleared by the caller): the API, the order, the worker and its handle."""
    api = stack.with_policy(call_timeout=timedelta(seconds=call_timeout_s))
    order = await stack.create_order({"bm-standard": 1})
    worker = order.worker_name(0)
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, worker))
    await stack.set_bmaas_faults(routes={CREATE: fault})
    return api, order, worker, handle


async def _create_pending(handle: Any, *, started: bool = False, attempt: int = 1) -> bool:
    """Whether the worker's create is pending: running now (`started`), or at `attempt` or later."""
    try:
        pending = (await handle.describe()).raw_description.pending_activities
    except Exception:  # not started yet
        return False
    return any(
        p.activity_type.name == BmaasActivity.CREATE_WORKER_INSTANCE.value
        and p.attempt >= attempt
        and (not started or p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED)
        for p in pending
    )


async def _clean_decommission(stack: Stack, order: OrderRef) -> None:
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.infraenvs(order.namespace) == []
    assert await stack.audit_violations() == []


async def test_no_free_hosts_backs_off_then_recovers(stack: Stack) -> None:
    await stack.set_bmaas_faults(no_free_hosts=True)
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        failed = await _failed_with(stack, order, FailureReason.NO_HOSTS_AVAILABLE)
        assert failed.next_retry_time is not None and failed.last_failure_time is not None
        assert failed.next_retry_time > failed.last_failure_time
        assert failed.last_failure_message and "host" in failed.last_failure_message.lower()

        async def workers_failed_condition() -> dict[str, Any] | None:
            cond = await stack.order_condition(order, "WorkersFailed")
            return cond if cond and cond["status"] == "True" else None

        cond = await eventually(workers_failed_condition, "WorkersFailed=True on the ClusterOrder")
        assert cond["reason"] == "ProvisioningFailed"
        assert await stack.bmis(order) == []  # the failed BMI was released

        # The CRD counts Provisioning, WaitingForAgent, Binding and Ready as current; not Failed.
        async def published_failed() -> dict[str, Any] | None:
            published = (await stack.order_object(order)).get("status") or {}
            workers = published.get("workers") or []
            return published if workers and workers[0]["phase"] == WorkerPhase.FAILED.value else None

        published = await eventually(published_failed, "the Failed worker on the ClusterOrder")
        assert (published["desiredWorkers"], published["currentWorkers"]) == (1, 0)
    finally:
        await stack.clear_bmaas_faults()
    status = await stack.wait_ready(order, 1)
    assert status.workers[0].attempt_count >= 2
    await _clean_decommission(stack, order)


async def test_a_lost_hosts_replacement_backs_off_as_a_new_worker_does(stack: Stack) -> None:
    """A Ready worker loses its host and no host is free: its replacement, a new worker, fails with
    NoHostsAvailable at its first attempt and backs off the table's first step; the worker that lost
    its host never fails (before, it failed in its slot and its backoff went on from the loss)."""
    api = stack.with_policy(
        ready_host_check=timedelta(seconds=1),
        # The first step long enough to see the first failure, the second longer still.
        no_hosts_backoff=[timedelta(seconds=20), timedelta(seconds=120)],
        no_hosts_backoff_cap=timedelta(seconds=120),
    )
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    ready = (await stack.wait_ready(order, 1)).workers[0]
    await stack.set_bmaas_faults(no_free_hosts=True)
    try:
        (
            await stack.bmaas_http.post(f"/lab/v1/baremetal_instances/{ready.resource_id}/break")
        ).raise_for_status()
        failed = await _failed_with(stack, order, FailureReason.NO_HOSTS_AVAILABLE)
        assert failed.name != ready.name and failed.attempt_count == 1
        assert failed.next_retry_time is not None and failed.last_failure_time is not None
        assert failed.next_retry_time - failed.last_failure_time < timedelta(seconds=60)
    finally:
        await stack.clear_bmaas_faults()
    await stack.wait_ready(order, 1)
    await _clean_decommission(stack, order)


async def test_bmi_provisioning_failure_is_retried_with_a_new_bmi(stack: Stack) -> None:
    await stack.set_bmaas_faults(provisioning_failure_rate=1.0)
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        await _failed_with(stack, order, FailureReason.BMI_PROVISIONING_FAILED)
    finally:
        await stack.clear_bmaas_faults()
    status = await stack.wait_ready(order, 1)
    assert status.workers[0].attempt_count >= 2
    await _clean_decommission(stack, order)


async def test_agent_that_never_registers_times_out_and_is_replaced(stack: Stack) -> None:
    await stack.set_agent_faults({"never_register": ALL})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        first = await _failed_with(stack, order, FailureReason.AGENT_REGISTRATION_TIMEOUT)
        assert first.attempt_count >= 1
        # The wait's deadline is the policy's timeout from when it began, carried in its input (so
        # a retry cannot extend it), and the wait ends there. OSAC's 30 minutes: test_production_timings.
        handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
        events = (await handle.fetch_history()).events
        scheduled = next(
            e
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name
            == HubActivity.WAIT_AGENT_AND_HAND
        )
        (request,) = pydantic_data_converter.payload_converter.from_payloads(
            list(scheduled.activity_task_scheduled_event_attributes.input.payloads), [WaitAndHandAgentInput]
        )
        # Counted from the workflow task that scheduled the wait (its workflow.now()), however long
        # that task took on a loaded machine.
        by_id = {e.event_id: e for e in events}
        completed = by_id[scheduled.activity_task_scheduled_event_attributes.workflow_task_completed_event_id]
        began = by_id[completed.workflow_task_completed_event_attributes.started_event_id]
        since_began = request.deadline - began.event_time.ToDatetime(tzinfo=UTC)
        assert abs(since_began - timedelta(seconds=10)) < timedelta(milliseconds=10)
        failed = next(
            e
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
            and e.activity_task_failed_event_attributes.scheduled_event_id == scheduled.event_id
        )
        assert failed.event_time.ToDatetime(tzinfo=UTC) >= request.deadline
    finally:
        await stack.clear_agent_faults()
    status = await stack.wait_ready(order, 1)
    assert status.workers[0].attempt_count >= 2
    # The timed-out host was released and wiped before the retry took another.
    assert await stack.audit_violations() == []
    await _clean_decommission(stack, order)
    assert await stack.agents(order.namespace) == []


async def test_install_error_releases_agent_and_host_then_retries(stack: Stack) -> None:
    await stack.set_agent_faults({"install_error": ALL})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        await _failed_with(stack, order, FailureReason.AGENT_INSTALL_FAILED)
        # The install wait knows its NodePool and window, so that a newcomer held back by a hanging
        # removal is not failed at its deadline (tests/activities_hub: the hold itself).
        handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
        scheduled = next(
            e.activity_task_scheduled_event_attributes
            for e in (await handle.fetch_history()).events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name
            == HubActivity.WAIT_AGENT_INSTALLED
        )
        (request,) = pydantic_data_converter.payload_converter.from_payloads(
            list(scheduled.input.payloads), [WaitAgentInstalledInput]
        )
        assert request.timeout == timedelta(seconds=30)
        assert request.nodepool is not None and request.nodepool.agent_namespace == order.namespace
    finally:
        await stack.clear_agent_faults()
    await stack.wait_ready(order, 1)
    await _clean_decommission(stack, order)
    assert await stack.agents(order.namespace) == []


async def test_duplicate_mac_is_never_bound_and_is_surfaced(stack: Stack) -> None:
    await stack.set_agent_faults({"duplicate_mac": ALL})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        await _failed_with(stack, order, FailureReason.AMBIGUOUS_AGENT_MATCH)
        # Neither of the look-alike Agents was handed to the NodePool or approved.
        for agent in await stack.agents(order.namespace):
            labels = agent["metadata"].get("labels") or {}
            assert "osac.openshift.io/worker" not in labels
            assert not agent["spec"].get("approved")
            assert not agent["spec"].get("clusterDeploymentName")
    finally:
        await stack.clear_agent_faults()
    await stack.wait_ready(order, 1)
    await _clean_decommission(stack, order)


async def test_wipe_failure_stays_deleting_and_the_host_is_never_reused(stack: Stack) -> None:
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    status = await stack.wait_ready(order, 1)
    worker = status.workers[0]
    await stack.set_bmaas_faults(wipe_failure_rate=1.0)
    try:
        await stack.api.scale_down_worker(order, worker.name)
        handle = stack.client.get_workflow_handle(worker_workflow_id(order, worker.name))

        async def stuck() -> WorkerStatus | None:
            st: WorkerStatus = await handle.query("status", result_type=WorkerStatus)
            ok = st.phase == WorkerPhase.DELETING and st.last_failure_reason == FailureReason.HOST_WIPE_STUCK
            return st if ok else None

        st = await eventually(stuck, "the worker Deleting with HostWipeStuck")
        assert st.last_failure_message and worker.resource_id not in st.last_failure_message
        # The BMI is still there (never taken for gone) and its host is quarantined for good.
        assert worker.resource_id in {b["id"] for b in await stack.bmis(order)}
        audit = await stack.audit()
        quarantined = {r["host_id"] for r in audit if r["kind"] == "HOST_QUARANTINED"}
        quarantine_seq = max(r["seq"] for r in audit if r["kind"] == "HOST_QUARANTINED")
        failed = {
            r["host_id"]
            for r in audit
            if r["kind"] == "WIPE_FAILED" and r.get("bmi_id") == worker.resource_id
        }
        assert failed and failed <= quarantined
    finally:
        await stack.clear_bmaas_faults()
    # New work never lands on the quarantined host.
    order2 = await stack.create_order({"bm-standard": 2})
    await stack.apply(order2, {"bm-standard": 2})
    await stack.wait_ready(order2, 2)
    audit = await stack.audit()
    reused = [
        r
        for r in audit
        if r["kind"] == "HOST_ALLOCATED" and r["host_id"] in failed and r["seq"] > quarantine_seq
    ]
    assert reused == [], f"quarantined host allocated again: {reused}"
    assert await stack.audit_violations() == []
    await _clean_decommission(stack, order2)
    # The order first: it would start a worker terminated before it again.
    await stack.api.handle(order).terminate("test cleanup")
    await handle.terminate("test cleanup: the stuck wipe never finishes")


async def _image_not_found(stack: Stack, order: OrderRef, status: str) -> dict[str, Any]:
    async def shown() -> dict[str, Any] | None:
        cond = await stack.order_condition(order, "RHCOSImageNotFound")
        return cond if cond and cond["status"] == status else None

    found: dict[str, Any] = await eventually(shown, f"RHCOSImageNotFound={status} on the ClusterOrder")
    return found


async def test_missing_boot_image_creates_nothing_until_linked(stack: Stack) -> None:
    release = "quay.io/openshift-release-dev/ocp-release:4.19.0-x86_64"
    order = await stack.create_order({"bm-standard": 1}, release_image=release)
    await stack.apply(order, {"bm-standard": 1})

    cond = await _image_not_found(stack, order, "True")
    assert "boot image" in cond["message"]
    status = await stack.api.status(order)
    assert status.workers == [] and await stack.bmis(order) == []

    await stack.link_boot_image(release, "4.19.0")
    await stack.wait_ready(order, 1)
    await _image_not_found(stack, order, "False")
    await _clean_decommission(stack, order)


async def test_a_release_image_corrected_while_no_boot_image_is_known_is_taken(stack: Stack) -> None:
    """A typo in spec.releaseImage (no cluster version offers it) shows RHCOSImageNotFound naming
    the field; the tenant's correction is read at the next look, with no command needed."""
    order = await stack.create_order({"bm-standard": 1}, release_image=RELEASE_IMAGE + "-typo")
    await stack.apply(order, {"bm-standard": 1})

    cond = await _image_not_found(stack, order, "True")
    assert "spec.releaseImage" in cond["message"]
    assert (await stack.api.status(order)).workers == [] and await stack.bmis(order) == []
    (
        await stack.hub_http.patch(
            f"/apis/osac.openshift.io/v1alpha1/namespaces/{order.namespace}/clusterorders/{order.name}",
            json={"spec": {"releaseImage": RELEASE_IMAGE}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
    ).raise_for_status()
    await stack.wait_ready(order, 1)
    await _clean_decommission(stack, order)
    history = await stack.api.handle(order).fetch_history()  # the new path replays as it ran
    assert any(
        ClusterPatch.RELEASE_READ_AGAIN_WITHOUT_IMAGE.value.encode() in e.SerializeToString()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    )
    await replay_clean([history])


async def test_bmaas_refusing_the_boot_image_lookup_is_waited_out_not_fatal(stack: Stack) -> None:
    """BMaaS refuses a request for good (403: a permission a rollout forgot) while the order's
    workflow looks up its boot image. The order shows it and asks again; once BMaaS answers, the
    workers come. The workflow never fails (a failed one would strand the order)."""
    await stack.set_bmaas_faults(
        routes={"GET /api/private/v1/cluster_versions": {"error_rate": 1.0, "error_code": 7}}
    )
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})

        async def refused() -> dict[str, Any] | None:
            cond = await stack.order_condition(order, "FulfillmentServiceUnavailable")
            return cond if cond and cond["status"] == "True" else None

        cond = await eventually(refused, "FulfillmentServiceUnavailable=True on the ClusterOrder")
        assert cond["reason"] == "RequestRefused"
        assert await stack.bmis(order) == []
    finally:
        await stack.clear_bmaas_faults()
    await stack.wait_ready(order, 1)

    async def answered() -> dict[str, Any] | None:
        cond = await stack.order_condition(order, "FulfillmentServiceUnavailable")
        return cond if cond and cond["status"] == "False" else None

    await eventually(answered, "FulfillmentServiceUnavailable=False once BMaaS answers")
    await _clean_decommission(stack, order)


async def _service_condition(stack: Stack, order: OrderRef, status: str) -> dict[str, Any]:
    return await wait_condition(stack, order, "FulfillmentServiceUnavailable", status, timeout=90)


async def test_a_bmaas_outage_during_a_create_is_shown_on_the_order_and_waited_out(stack: Stack) -> None:
    """BMaaS answers every create with 503 (an outage). The worker keeps retrying its create, as it
    always did, but the order now shows it (FulfillmentServiceUnavailable=True, naming the workers,
    no backend detail) instead of a silent Provisioning; the worker is not failed, nothing is
    allocated. Once BMaaS answers, the condition turns False at once (the host still booting), and
    the worker comes."""
    api = stack.with_policy(bmaas_failing_shown_after=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 1})
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
    timings = (await stack.bmaas_http.get("/lab/v1/timings")).raise_for_status().json()
    await stack.set_bmaas_faults(routes={CREATE: {"error_rate": 1.0}})
    try:
        await stack.apply(order, {"bm-standard": 1}, api)
        cond = await _service_condition(stack, order, "True")
        assert cond["reason"] == "RequestsFailing"
        assert "for 1 worker(s)" in cond["message"] and "for the order" not in cond["message"]
        worker = await _worker(stack, order)
        assert worker is not None and worker.phase == WorkerPhase.PROVISIONING
        assert worker.last_failure_reason is None
        assert await stack.bmis(order) == []
        # The host will boot for as long as the test needs: the outage's end is told before it runs.
        (await stack.bmaas_http.patch("/lab/v1/timings", json={"boot_s": 3600})).raise_for_status()
    finally:
        await stack.clear_bmaas_faults()
    try:
        cond = await _service_condition(stack, order, "False")
        assert cond["reason"] == "Available"
        worker = await _worker(stack, order)
        assert worker is not None and worker.phase == WorkerPhase.PROVISIONING
        assert [b["status"]["state"] for b in await stack.bmis(order)] == [
            "BARE_METAL_INSTANCE_STATE_PROVISIONING"
        ]
    finally:
        (await stack.bmaas_http.patch("/lab/v1/timings", json=timings)).raise_for_status()
    await stack.wait_ready(order, 1)
    # The create ran out of its attempts at least once, and was made again in the same run.
    history = await handle.fetch_history()
    creates = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == BmaasActivity.CREATE_WORKER_INSTANCE.value
    ]
    assert len(creates) >= 2
    await _clean_decommission(stack, order)
    order_history = await stack.api.handle(order).fetch_history()
    await replay_clean([history, order_history])
    for kind, recorded in (("worker", history), ("order", order_history)):
        record_regression(f"bmaas-outage-during-a-create-{kind}", recorded)  # the outage's path


async def test_a_worker_scaled_down_during_a_bmaas_outage_leaves_and_the_order_stops_showing_it(
    stack: Stack,
) -> None:
    """The order shows a BMaaS outage its worker's create keeps meeting; the tenant scales the order
    down to 0 meanwhile. The worker stops retrying, waits out its unanswered create, finds no BMI
    and ends; the order shows the outage no more. Neither workflow fails, nothing is allocated."""
    api = stack.with_policy(bmaas_failing_shown_after=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 1})
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
    await stack.set_bmaas_faults(routes={CREATE: {"error_rate": 1.0}})
    try:
        await stack.apply(order, {"bm-standard": 1}, api)
        await _service_condition(stack, order, "True")
        await stack.apply(order, {"bm-standard": 0}, api)

        async def gone() -> bool:
            return (await stack.api.status(order)).workers == []

        await eventually(gone, "the worker scaled down during the outage gone")
        cond = await _service_condition(stack, order, "False")
        assert cond["reason"] == "Available"
        assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
        assert await stack.bmis(order) == []
    finally:
        await stack.clear_bmaas_faults()
    await _clean_decommission(stack, order)
    await replay_clean([await handle.fetch_history(), await stack.api.handle(order).fetch_history()])


async def test_a_boot_image_lookup_bmaas_does_not_answer_is_shown_on_the_order(stack: Stack) -> None:
    """BMaaS answers the order's own boot-image lookup with 503 (an outage, not a refusal): the
    order shows FulfillmentServiceUnavailable=True for the order (before: nothing while it was
    retried), creates nothing, and goes on once BMaaS answers."""
    api = stack.with_policy(bmaas_failing_shown_after=timedelta(seconds=1))
    await stack.set_bmaas_faults(routes={"GET /api/private/v1/cluster_versions": {"error_rate": 1.0}})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1}, api)
        cond = await _service_condition(stack, order, "True")
        assert cond["reason"] == "RequestsFailing"
        assert "for the order" in cond["message"] and "worker(s)" not in cond["message"]
        assert await stack.bmis(order) == []
    finally:
        await stack.clear_bmaas_faults()
    await stack.wait_ready(order, 1)
    cond = await _service_condition(stack, order, "False")
    assert cond["reason"] == "Available"
    await _clean_decommission(stack, order)


async def test_a_ready_host_check_bmaas_refuses_is_shown_on_the_order_and_kept_up(stack: Stack) -> None:
    """BMaaS refuses the order's check of its Ready workers' hosts (403: a list permission a rollout
    forgot). The refusal was final for the activity: the check logged a warning and gave up at
    every `ready_host_check`, so a host lost meanwhile went unnoticed and nothing was shown. It is
    now retried like the workers' calls and shown (FulfillmentServiceUnavailable=True for the
    order) until BMaaS answers again."""
    api = stack.with_policy(
        bmaas_failing_shown_after=timedelta(seconds=1), ready_host_check=timedelta(seconds=1)
    )
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    await stack.wait_ready(order, 1)
    await stack.set_bmaas_faults(routes={LIST: {"error_rate": 1.0, "error_code": 7}})
    try:
        cond = await _service_condition(stack, order, "True")
        assert cond["reason"] == "RequestsFailing"
        assert "for the order" in cond["message"] and "worker(s)" not in cond["message"]
    finally:
        await stack.clear_bmaas_faults()
    cond = await _service_condition(stack, order, "False")
    assert cond["reason"] == "Available"
    await _clean_decommission(stack, order)


async def _waiting_worker_loses_its_bmi(stack: Stack, order: OrderRef) -> BmiSnapshot:
    """The order's one worker waiting for an Agent that never registers; its BMI deleted by an admin."""
    api = stack.with_policy(agent_registration_timeout=timedelta(seconds=300))
    await stack.apply(order, {"bm-standard": 1}, api)
    await stack.wait_worker_phase(order, order.worker_name(0), WorkerPhase.WAITING_FOR_AGENT)
    (bmi,) = await stack.bmis(order)
    lost = BmiSnapshot.from_api(bmi)
    (await stack.bmaas_http.delete(f"/api/private/v1/baremetal_instances/{lost.id}")).raise_for_status()
    return lost


async def test_a_worker_waiting_for_its_agent_stops_waiting_once_its_bmi_is_deleted(stack: Stack) -> None:
    """It waited until its registration deadline (30 minutes by default, 300 s here) for a host
    being wiped, then failed as AgentRegistrationTimeout. Now its attempt fails as HostLost within a
    tick of the deletion, and the worker tries again with a new host."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.set_agent_faults({"never_register": ALL})
    try:
        lost = await _waiting_worker_loses_its_bmi(stack, order)
        failed = await _failed_with(stack, order, FailureReason.HOST_LOST)
        assert failed.last_failure_message == "The worker's bare-metal host stopped working; replacing it."
        await eventually(
            lambda: _has_new_bmi(stack, order, lost.id), "the next attempt allocating a new host"
        )
    finally:
        await stack.clear_agent_faults()
    await _clean_decommission(stack, order)


async def test_a_host_deleted_behind_a_waiting_worker_is_not_taken_once_registered_again(
    stack: Stack,
) -> None:
    """The same, with the wiped host at once another slot's BMI's, registering for that slot with
    the same MACs: the waiting worker took that Agent (the MACs it waited for) and installed itself
    on a host BMaaS gave to another BMI, which that BMI's release would later wipe. Now the
    registration is never approved nor labelled by it."""
    order = await stack.create_order({"bm-standard": 1})
    agents = f"{AGENT_API}/namespaces/{order.namespace}/agents"
    await stack.set_agent_faults({"never_register": ALL})
    try:
        lost = await _waiting_worker_loses_its_bmi(stack, order)
        again = {
            "apiVersion": "agent-install.openshift.io/v1beta1",
            "kind": "Agent",
            "metadata": {"name": "registered-again", "labels": {INFRAENV_LABEL: order.infraenv_name}},
            "spec": {"approved": False, "role": "worker"},
        }
        (await stack.hub_http.post(agents, json=again)).raise_for_status()
        inventory = to_agent_inventory(host_inventory("registered-again", list(lost.macs)))
        (
            await stack.hub_http.patch(
                f"{agents}/registered-again/status",
                json={"status": {"inventory": inventory}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
        ).raise_for_status()
        await _failed_with(stack, order, FailureReason.HOST_LOST)
        response = await stack.hub_http.get(f"{agents}/registered-again")
        if response.status_code != 404:  # the failed attempt's sweep may have deleted it
            registered = response.raise_for_status().json()
            assert not registered["spec"].get("approved"), registered
            assert WORKER_LABEL not in (registered["metadata"].get("labels") or {}), registered
    finally:
        await stack.clear_agent_faults()
    await _clean_decommission(stack, order)


async def test_a_host_deleted_behind_a_binding_worker_fails_its_install_as_host_lost(stack: Stack) -> None:
    """The worker handed its Agent over and waits for the install (here never claimed: the
    provider cannot create AgentMachines); an admin deletes its BMI. The wait went on until the
    install deadline (AgentInstallFailed), while the wiped host, registering again under the same
    Agent name for whichever slot got it, could be installed as this worker. It now fails at once
    as HostLost, and the order's next attempt gets a new host."""
    api = stack.with_policy(agent_install_timeout=timedelta(seconds=120))
    order = await stack.create_order({"bm-standard": 1})
    name = order.worker_name(0)
    never_claimed = {
        "errors": [
            {"code": 500, "verbs": ["create"], "resources": ["agentmachines"], "users": ["lab-controllers"]}
        ]
    }
    (await stack.hub_http.put("/lab/v1/faults/api", json=never_claimed)).raise_for_status()
    try:
        await stack.apply(order, {"bm-standard": 1}, api)
        await stack.wait_worker_phase(order, name, WorkerPhase.BINDING)
        (bmi,) = await stack.bmis(order)
        lost = str(bmi["id"])
        (await stack.bmaas_http.delete(f"/api/private/v1/baremetal_instances/{lost}")).raise_for_status()
        await _failed_with(stack, order, FailureReason.HOST_LOST)
        await eventually(
            lambda: _has_new_bmi(stack, order, lost), "the worker's next attempt allocating a new host"
        )
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    await _clean_decommission(stack, order)


async def _has_new_bmi(stack: Stack, order: OrderRef, old: str) -> bool:
    return any(b["id"] != old for b in await stack.bmis(order))


async def test_a_scale_down_during_a_call_that_finishes_anyway_stops_the_attempt_there(stack: Stack) -> None:
    """The BMI create (a call: it never heartbeats, so it cannot hear a cancel) is in flight when
    the worker is scaled down; it finishes. The attempt stops there: the host is released and
    wiped, never waited for, booted into the cluster and only then taken back."""
    order = await stack.create_order({"bm-standard": 1})
    # Long enough for the scale-down to land while the create waits, short of the call's budget.
    await stack.set_bmaas_faults(routes={CREATE: {"latency_s": 12.0}})
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))

    async def history_has(event_type: EventType.ValueType) -> bool:
        try:
            events = (await handle.fetch_history()).events
        except Exception:  # not started yet
            return False
        return any(e.event_type == event_type for e in events)

    try:
        await stack.apply(order, {"bm-standard": 1})

        await eventually(lambda: _create_pending(handle, started=True), "the create in flight")
        await stack.apply(order, {"bm-standard": 0})
        await eventually(
            lambda: history_has(EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED), "the create cancelled"
        )
    finally:
        await stack.clear_bmaas_faults()  # the create in flight keeps its latency and succeeds

    async def gone() -> bool:
        return (await stack.api.status(order)).workers == [] and await stack.bmis(order) == []

    await eventually(gone, "the worker gone and its BMI deleted", timeout=120)
    events = (await handle.fetch_history()).events
    completed = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]
    cancel = next(e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED)
    assert completed and completed[0].event_id > cancel.event_id, "the create finished after the cancel"
    scheduled = scheduled_activities(events)
    assert BmaasActivity.CREATE_WORKER_INSTANCE.value in scheduled
    assert BmaasActivity.WAIT_INSTANCE_RUNNING.value not in scheduled
    assert HubActivity.WAIT_AGENT_AND_HAND.value not in scheduled
    assert await stack.audit_violations() == []
    await _clean_decommission(stack, order)


async def test_a_failed_attempts_reason_is_shown_again_once_its_slow_wipe_ends(stack: Stack) -> None:
    """A failed attempt's host takes long to wipe: HostWipeStuck shows meanwhile, and once the
    wipe ends the attempt's own reason (what the tenant can act on) is shown again."""
    timings = (await stack.bmaas_http.get("/lab/v1/timings")).json()
    await stack.set_bmaas_faults(provisioning_failure_rate=1.0)
    (await stack.bmaas_http.patch("/lab/v1/timings", json={"wipe_s": 3600})).raise_for_status()
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})

        async def wipe_stuck() -> bool:
            worker = await _worker(stack, order)
            return bool(worker and worker.last_failure_reason == FailureReason.HOST_WIPE_STUCK)

        await eventually(wipe_stuck, "the failed attempt's wipe shown as stuck")
    finally:
        await stack.clear_bmaas_faults()
        restored = {"wipe_s": timings["wipe_s"]}  # also ends the wipe in progress
        (await stack.bmaas_http.patch("/lab/v1/timings", json=restored)).raise_for_status()
    worker = (await stack.wait_ready(order, 1)).workers[0]
    assert worker.last_failure_reason == FailureReason.BMI_PROVISIONING_FAILED
    await _clean_decommission(stack, order)


async def test_a_hanging_drain_holds_a_newcomer_back_without_failing_it(stack: Stack) -> None:
    """A leaving worker whose drain hangs shows AgentUnbindingTimeout and keeps waiting. The
    replicas count only claimed Agents meanwhile (so CAPI removes its Machine rather than the two
    cancelling out), and a newcomer cannot be claimed: it is not failed at its install deadline
    (that would wipe its host and queue another behind the same drain) but waits, naming the
    removal in its heartbeat, and joins once the drain ends."""
    api = stack.with_policy(
        agent_install_timeout=timedelta(seconds=6),
        agent_unbinding_timeout=timedelta(seconds=4),
        wait_heartbeat_timeout=timedelta(seconds=3),
    )
    order = await stack.create_order({"bm-standard": 2})
    await stack.apply(order, {"bm-standard": 2}, api)
    await stack.wait_ready(order, 2)
    leaving, newcomer = order.worker_name(0), order.worker_name(2)
    (agent,) = [
        a["metadata"]["name"]
        for a in await stack.agents(order.namespace)
        if a["metadata"]["labels"].get(WORKER_LABEL) == leaving
    ]
    await stack.set_agent_faults({"hanging_drain": {"agents": [agent]}})
    try:
        await api.scale_down_worker(order, leaving)
        await stack.apply(order, {"bm-standard": 2}, api)

        async def unbinding_timed_out() -> bool:
            worker = next((w for w in (await api.status(order)).workers if w.name == leaving), None)
            return worker is not None and worker.last_failure_reason == FailureReason.AGENT_UNBINDING_TIMEOUT

        await eventually(unbinding_timed_out, f"{leaving} showing AgentUnbindingTimeout")
        handle = stack.client.get_workflow_handle(worker_workflow_id(order, newcomer))

        async def held_back() -> bool:
            for pending in (await handle.describe()).raw_description.pending_activities:
                if pending.activity_type.name != HubActivity.WAIT_AGENT_INSTALLED.value:
                    continue
                payloads = list(pending.heartbeat_details.payloads)
                details = (
                    pydantic_data_converter.payload_converter.from_payloads(payloads) if payloads else []
                )
                return any(isinstance(d, dict) and d.get("held_back_by") == [agent] for d in details)
            return False

        await eventually(held_back, f"{newcomer} held back by the removal of {agent}, past its deadline")
        worker = next(w for w in (await api.status(order)).workers if w.name == newcomer)
        assert worker.phase == WorkerPhase.BINDING and worker.attempt_count == 1
        assert worker.last_failure_reason is None
    finally:
        await stack.clear_agent_faults()
    stayed = {order.worker_name(1), newcomer}

    async def only_the_two() -> Any:
        status = await api.status(order)
        names = {w.name for w in status.workers}
        return status if names == stayed and status.ready_workers == 2 else None

    status = await eventually(only_the_two, f"{sorted(stayed)} Ready and {leaving} gone")
    joined = next(w for w in status.workers if w.name == newcomer)
    assert joined.attempt_count == 1 and joined.last_failure_reason is None
    await _clean_decommission(stack, order)


async def test_a_scale_down_during_a_create_that_times_out_leaves_no_bmi_behind(stack: Stack) -> None:
    """BMaaS answers the create after 6 s, the call allows 3 s: the scale-down's cancel cannot
    reach the create (a call does not heartbeat), the attempt times out, and the worker is released
    at once. The create keeps its POST within its attempt, and the release looks for the slot's BMI
    a margin after the create ended, so whatever the slow create made is released and
    wiped, not left allocated with no workflow to own it (found by review; reproduced on the old code)."""
    api, order, worker, handle = await _one_worker_with_a_faulty_create(stack, 3, {"latency_s": 6.0})
    try:
        await stack.apply(order, {"bm-standard": 1}, api)

        await eventually(lambda: _create_pending(handle, started=True), "the create in flight")
        await api.scale_down_worker(order, worker)
        await asyncio.wait_for(handle.result(), 120)

        async def create_answered() -> bool:  # made its BMI, or found its client gone
            stats = (await stack.bmaas_http.get("/lab/v1/stats")).json()
            return CREATE not in stats["in_flight"]

        await eventually(create_answered, "the slow create answered")
    finally:
        await stack.clear_bmaas_faults()
    assert await stack.bmis(order) == []
    await _clean_decommission(stack, order)


async def test_a_scale_down_between_create_attempts_still_waits_for_a_late_bmi(stack: Stack) -> None:
    """BMaaS answers the creates 503 (an attempt whose POST was given up unanswered looks the same
    to the workflow): a scale-down in the retry's backoff cancels the create without an error.
    That is as doubtful as a timeout, so the release still looks for the slot's BMI only a margin
    later (the marker and the timer in the history), not at once (found by review)."""
    api, order, worker, handle = await _one_worker_with_a_faulty_create(stack, 2, {"error_rate": 1.0})
    try:
        await stack.apply(order, {"bm-standard": 1}, api)

        await eventually(lambda: _create_pending(handle, attempt=2), "the create retrying")
        await api.scale_down_worker(order, worker)
        await asyncio.wait_for(handle.result(), 120)
    finally:
        await stack.clear_bmaas_faults()
    events = (await handle.fetch_history()).events
    markers = [
        e.marker_recorded_event_attributes
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    assert any("create-settled-before-release" in str(m) for m in markers)
    assert any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in events)
    assert await stack.bmis(order) == []
    await _clean_decommission(stack, order)


async def test_a_create_refused_after_a_retry_still_waits_for_a_late_bmi(stack: Stack) -> None:
    """The create's first attempt fails retryably (as one whose POST went unanswered, which the
    service may still be handling), the next is refused for good. The workflow cannot tell an
    attempt with no POST before it from one with, so the release looks for the slot's BMI only a
    margin after the create ended (the marker and the timer before the look), never at once and
    past a BMI the first POST makes late (found by review)."""
    api, order, _worker_name, handle = await _one_worker_with_a_faulty_create(stack, 2, {"error_rate": 1.0})
    try:
        await stack.apply(order, {"bm-standard": 1}, api)
        await eventually(lambda: _create_pending(handle, attempt=2), "the create retrying")
        refused = {"error_rate": 1.0, "error_code": 3}  # InvalidArgument: decided, never retried
        await stack.set_bmaas_faults(routes={CREATE: refused})
        await _failed_with(stack, order, FailureReason.BMI_PROVISIONING_FAILED)
    finally:
        await stack.clear_bmaas_faults()
    await stack.wait_ready(order, 1)
    events = (await handle.fetch_history()).events
    failed = next(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED)
    after = [e for e in events if e.event_id > failed]
    marker = next(
        e.event_id
        for e in after
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and "create-unsettled-after-any-failure" in str(e.marker_recorded_event_attributes)
    )
    timer = next(e.event_id for e in after if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)
    look = next(
        e.event_id
        for e in after
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == BmaasActivity.LIST_ORDER_INSTANCES.value
    )
    assert marker < timer < look
    await _clean_decommission(stack, order)


NODEPOOLS = "/apis/hypershift.openshift.io/v1beta1/namespaces/{namespace}/nodepools"


async def test_no_host_is_allocated_for_a_node_set_whose_nodepool_is_not_there(stack: Stack) -> None:
    """A node set added on a live order before the cluster-provisioning flow made its NodePool: its
    worker allocated a host, and waited at its hand-off, retrying, the host held, nothing said on the
    order. Now the order shows NodePoolNotFound and allocates nothing for it until the NodePool is
    there; then the worker comes, and the condition turns False."""
    api = stack.with_policy(prerequisite_recheck=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 0})  # the flow makes bm-standard's NodePool only
    await stack.apply(order, {"bm-standard": 0, "bm-gpu": 1}, api)
    cond = await _nodepool_condition(stack, order, "True")
    assert cond["reason"] == "NodePoolNotFound"
    assert f"nodepool-{order.name}-bm-gpu" in cond["message"], cond
    assert await stack.bmis(order) == []
    # The flow catches up: the NodePool, as it makes them.
    pools = NODEPOOLS.format(namespace=order.namespace)
    model = (await stack.hub_http.get(f"{pools}/nodepool-{order.name}-bm-standard")).raise_for_status().json()
    selector = model["spec"]["platform"]["agent"]["agentLabelSelector"]["matchLabels"]
    gpu = {
        "apiVersion": model["apiVersion"],
        "kind": "NodePool",
        "metadata": {"name": f"nodepool-{order.name}-bm-gpu", "namespace": order.namespace},
        "spec": {
            **model["spec"],
            "replicas": 0,
            "platform": {
                **model["spec"]["platform"],
                "agent": {
                    "agentLabelSelector": {
                        "matchLabels": {**selector, "osac.openshift.io/resource_class": "bm-gpu"}
                    }
                },
            },
        },
    }
    (await stack.hub_http.post(pools, json=gpu)).raise_for_status()
    await stack.wait_ready(order, 1)
    cond = await _nodepool_condition(stack, order, "False")
    assert cond["reason"] == "NodePoolsFound"
    await _clean_decommission(stack, order)


async def _nodepool_condition(stack: Stack, order: OrderRef, status: str) -> dict[str, Any]:
    return await wait_condition(stack, order, "NodePoolNotFound", status, timeout=90)


async def test_a_missing_nodepool_no_node_set_wants_any_more_is_shown_no_more(stack: Stack) -> None:
    """The node set whose NodePool was missing is lowered to 0: NodePoolNotFound turns False (it
    stayed True for good, the order saying no host is allocated for a node set nobody wanted)."""
    api = stack.with_policy(prerequisite_recheck=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 0})
    await stack.apply(order, {"bm-standard": 0, "bm-gpu": 1}, api)
    await _nodepool_condition(stack, order, "True")
    await stack.apply(order, {"bm-standard": 0, "bm-gpu": 0}, api)
    cond = await _nodepool_condition(stack, order, "False")
    assert cond["reason"] == "NotNeeded"
    assert await stack.bmis(order) == []
    await _clean_decommission(stack, order)


async def test_nodepools_the_hub_refuses_to_list_are_shown_as_a_refusal(stack: Stack) -> None:
    """A permission a rollout forgot: the order says the hub refused (RequestRefused), not that the
    NodePool is missing, allocates nothing, and asks again until the hub answers."""
    api = stack.with_policy(prerequisite_recheck=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 1})
    refused = {"errors": [{"code": 403, "verbs": ["list"], "resources": ["nodepools"]}]}
    (await stack.hub_http.put("/lab/v1/faults/api", json=refused)).raise_for_status()
    try:
        await stack.apply(order, {"bm-standard": 1}, api)
        cond = await _nodepool_condition(stack, order, "True")
        assert cond["reason"] == "RequestRefused", cond
        assert await stack.bmis(order) == []
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    await stack.wait_ready(order, 1)
    cond = await _nodepool_condition(stack, order, "False")
    assert cond["reason"] == "NodePoolsFound"
    await _clean_decommission(stack, order)


async def test_tenant_facing_text_never_leaks_backend_detail(stack: Stack) -> None:
    """Last in the module (pytest runs a module's tests in file order): everything the failure tests
    above showed on their ClusterOrders."""
    messages = {m for m in TENANT_MESSAGES_SEEN if m}
    reasons_seen = {m for m in messages if "retrying" in m or "waiting" in m}
    assert len(reasons_seen) >= 3, f"the collector saw too little: {messages}"
    for message in sorted(messages):
        for what, pattern in TENANT_TEXT_LEAKS.items():
            assert not pattern.search(message), f"tenant text shows {what}: {message!r}"
