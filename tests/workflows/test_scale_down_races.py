"""A scale-down whose cancel reaches the install wait just as that wait ends another way: after it
delivered the worker's Ready report, or as it fails. The order must show what the worker does next
(Unbinding), never a Ready it is leaving nor a failure of a worker the tenant asked to remove. And
a cancel of the order's own run that reaches a call of it under way, which then succeeds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from enum import Enum

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.assisted import AssistedActivities
from contracts.activities import HubActivity
from contracts.hub import WORKER_LABEL, AgentInstalled, EnsureInfraEnvResult, WaitAgentInstalledInput
from contracts.refs import OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerStatus
from contracts.workflows import cluster_workflow_id, worker_workflow_id
from tests.workflows.stack import Stack, eventually, fast_policy, replay_clean, running_stack
from worker.main import build_workers, open_backends


class Race(Enum):
    NONE = "none"
    # The wait saw the install and delivered Ready; the cancel reaches it before it returns.
    CANCELLED_AFTER_READY = "cancelled after ready"
    # The wait fails (the Agent's install broke) at the moment the cancel reaches it.
    FAILS_AS_CANCELLED = "fails as cancelled"


class RacingInstallWait(AssistedActivities):
    race = Race.NONE
    holding = asyncio.Event()
    # Set: the InfraEnv's ensure waits for it (once `ensure_holding` says so), then does its work.
    ensure_held: asyncio.Event | None = None
    ensure_holding = asyncio.Event()

    @activity.defn(name=HubActivity.ENSURE_INFRAENV.value)
    async def ensure_infraenv(self, order: OrderRef) -> EnsureInfraEnvResult:
        held = type(self).ensure_held
        if held is not None:
            type(self).ensure_holding.set()
            await held.wait()
        return await super().ensure_infraenv(order)

    @activity.defn(name=HubActivity.WAIT_AGENT_INSTALLED.value)
    async def wait_agent_installed(self, input: WaitAgentInstalledInput) -> AgentInstalled:
        race = type(self).race
        if race == Race.FAILS_AS_CANCELLED:
            await self._held_until_cancelled()
            raise ApplicationError(
                "the Agent is in state error",
                type=FailureReason.AGENT_INSTALL_FAILED.value,
                non_retryable=True,
            )
        installed = await super().wait_agent_installed(input)  # delivers the Ready report
        if race == Race.CANCELLED_AFTER_READY:
            await self._held_until_cancelled()
        return installed

    async def _held_until_cancelled(self) -> None:
        self.holding.set()
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            if type(self).race == Race.CANCELLED_AFTER_READY:
                raise


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    # A cancel reaches a held wait with a heartbeat's answer, sent at most every 80 % of the
    # heartbeat timeout. The unbind timeout is long so the hung drain's Unbinding shows alone.
    policy = fast_policy(
        wait_heartbeat_timeout=timedelta(seconds=3), agent_unbinding_timeout=timedelta(seconds=300)
    )
    async with running_stack(
        temporal_env.client, tmp_path_factory.mktemp("races"), policy=policy, in_process_worker=False
    ) as running:
        async with open_backends(running.settings) as backends:
            backends.assisted = RacingInstallWait(backends.kube, backends.ignition_http)
            async with contextlib.AsyncExitStack() as workers:
                for worker in build_workers(running.client, running.settings, backends):
                    await workers.enter_async_context(worker)
                yield running


async def _worker(stack: Stack, order: OrderRef) -> WorkerStatus | None:
    status = await stack.api.status(order)
    return status.workers[0] if status.workers else None


async def _start_racing(stack: Stack, race: Race) -> OrderRef:
    RacingInstallWait.race = race
    RacingInstallWait.holding.clear()
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await asyncio.wait_for(RacingInstallWait.holding.wait(), 120)
    return order


async def _released(stack: Stack, order: OrderRef) -> list[EventType.ValueType]:
    """Wait for the worker to be gone; the event types of its history."""
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
    await asyncio.wait_for(handle.result(), 180)
    RacingInstallWait.race = Race.NONE
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []
    return [e.event_type for e in (await handle.fetch_history()).events]


async def test_a_worker_leaving_after_its_ready_was_delivered_shows_unbinding(stack: Stack) -> None:
    """The Ready report went out but the wait never returned: the next report (Unbinding) must take
    a new number. Reusing Ready's, the cluster workflow dropped it as a copy and showed the worker
    Ready for as long as its unbind took (found by review)."""
    order = await _start_racing(stack, Race.CANCELLED_AFTER_READY)

    async def shown(phase: WorkerPhase) -> bool:
        worker = await _worker(stack, order)
        return worker is not None and worker.phase == phase

    await eventually(lambda: shown(WorkerPhase.READY), "the delivered Ready shown")
    (agent,) = [
        a["metadata"]["name"]
        for a in await stack.agents(order.namespace)
        if a["metadata"]["labels"].get(WORKER_LABEL) == order.worker_name(0)
    ]
    # Its drain hangs, so the worker stays in its unbind until the test has looked.
    await stack.set_agent_faults({"hanging_drain": {"agents": [agent]}})
    try:
        await stack.apply(order, {"bm-standard": 0})
        await eventually(
            lambda: shown(WorkerPhase.UNBINDING), "the leaving worker shown Unbinding", timeout=60
        )
    finally:
        await stack.clear_agent_faults()
    await _released(stack, order)
    await stack.decommission_and_wait(order)


async def test_a_step_failing_as_the_scale_down_cancels_it_is_not_shown_as_a_failure(stack: Stack) -> None:
    """The install wait fails just as the scale-down's cancel reaches it. The worker is released
    as the tenant asked, without a Failed phase, a failure reason or a WorkerFailed Event in
    between (found by review)."""
    order = await _start_racing(stack, Race.FAILS_AS_CANCELLED)
    await stack.apply(order, {"bm-standard": 0})
    events = await _released(stack, order)
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED in events, "the wait failed rather than being cancelled"
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
    upserts = [
        str(e.upsert_workflow_search_attributes_event_attributes)
        for e in (await handle.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    assert not any(WorkerPhase.FAILED.value in upsert for upsert in upserts), upserts

    async def with_deleted_event() -> list[dict] | None:
        items = (await stack.hub_http.get(f"/api/v1/namespaces/{order.namespace}/events")).json()["items"]
        return items if any(e.get("reason") == "WorkerDeleted" for e in items) else None

    # Events are written in the background in the order they were queued: once the worker's
    # WorkerDeleted is there, a WorkerFailed queued before it would be there too.
    hub_events = await eventually(with_deleted_event, "the worker's WorkerDeleted Event")
    assert not [e for e in hub_events if e.get("reason") == "WorkerFailed"], hub_events
    await stack.decommission_and_wait(order)


async def test_an_order_cancelled_while_a_call_of_it_is_under_way_ends_cancelled(stack: Stack) -> None:
    """An operator cancels the order's run while its InfraEnv's ensure is under way, and the ensure
    then succeeds (a call waits for its cancellation to complete, and this one ends with its own
    result). The run ends Canceled and allocates nothing. Before, the SDK took the cancel as
    delivered with the call's result: the run went on preparing and allocated the worker's host."""
    release = asyncio.Event()
    RacingInstallWait.ensure_held = release
    RacingInstallWait.ensure_holding.clear()
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        await asyncio.wait_for(RacingInstallWait.ensure_holding.wait(), 120)
        order_run = stack.client.get_workflow_handle(cluster_workflow_id(order))
        await order_run.cancel()

        async def call_cancelled() -> bool:
            events = (await order_run.fetch_history()).events
            return any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED for e in events)

        await eventually(call_cancelled, "the ensure's cancellation requested")
    finally:
        RacingInstallWait.ensure_held = None
        release.set()

    assert await stack.order_run_ended(order) == WorkflowExecutionStatus.CANCELED
    kinds = [e.event_type for e in (await order_run.fetch_history()).events]
    cancelled_at = kinds.index(EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED)
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in kinds[cancelled_at:], "a call after the cancel"
    assert await stack.bmis(order) == []
    await replay_clean(await stack.histories(order))
