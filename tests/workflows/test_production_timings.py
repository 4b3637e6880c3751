"""OSAC's production backoff table, proven on a time-skipping dev server in seconds of wall time.

The server skips a workflow's virtual clock whenever nothing is in flight, which is exactly the case
while a failed worker sits out its backoff. (While an activity is pending the clock runs in real time,
so the 30-minute agent-registration timeout itself is proven with short values in test_failures.py;
here the default of the policy is checked.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from contracts.activities import HubActivity
from contracts.hub import WaitAgentInput
from contracts.worker import FailureReason, TimingPolicy, WorkerStatus
from contracts.workflows import worker_workflow_id
from tests.conftest import temporal_binary
from tests.workflows.stack import Stack, eventually, running_stack
from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    from temporalio.contrib.pydantic import pydantic_data_converter

    env = await WorkflowEnvironment.start_time_skipping_v2(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_extra_args=["--dynamic-config-value", "frontend.WorkflowTimeSkippingEnabled=true"],
    )
    try:
        # Production values: the defaults of TimingPolicy are OSAC's.
        async with running_stack(
            env.client, tmp_path_factory.mktemp("prod"), policy=TimingPolicy()
        ) as running:
            yield running
    finally:
        await env.shutdown()


def test_policy_defaults_are_osacs() -> None:
    policy = TimingPolicy()
    assert policy.agent_registration_timeout == timedelta(minutes=30)
    minutes = [policy.backoff(FailureReason.NO_HOSTS_AVAILABLE, n).total_seconds() / 60 for n in range(1, 6)]
    assert minutes == [5, 15, 30, 30, 30]
    minutes = [
        policy.backoff(FailureReason.AGENT_REGISTRATION_TIMEOUT, n).total_seconds() / 60 for n in range(1, 5)
    ]
    assert minutes == [5, 15, 30, 30]
    # Only an outside change cures these: the long table, not a retry every few seconds.
    for reason in (FailureReason.DISCOVERY_IGNITION_TOO_LARGE, FailureReason.RHCOS_IMAGE_NOT_FOUND):
        assert [policy.backoff(reason, n).total_seconds() / 60 for n in range(1, 4)] == [5, 15, 30]
    seconds = [policy.backoff(FailureReason.BMI_PROVISIONING_FAILED, n).total_seconds() for n in range(1, 7)]
    assert seconds == [30, 60, 120, 240, 300, 300]
    assert policy.attempt_reset_after_ready == timedelta(hours=1)


async def test_no_hosts_backoff_follows_the_5_15_30_minute_table(stack: Stack) -> None:
    await stack.set_bmaas_faults(no_free_hosts=True)
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))

    async def fourth_attempt() -> WorkerStatus | None:
        try:
            status: WorkerStatus = await handle.query("status", result_type=WorkerStatus)
        except RPCError:  # the cluster workflow has not started this worker yet
            return None
        return status if status.attempt_count >= 5 else None

    try:
        status = await eventually(fourth_attempt, "five attempts with production backoffs", timeout=120)
    finally:
        await stack.clear_bmaas_faults()
    assert status.last_failure_reason == FailureReason.NO_HOSTS_AVAILABLE

    history = await handle.fetch_history()
    fired = {
        e.timer_fired_event_attributes.timer_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED
    }
    # Backoffs are the timers that fired (a wipe's "stuck" timer is cancelled once the host is gone).
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and e.timer_started_event_attributes.timer_id in fired
    ]
    # Each backoff is the table's value less the (real, seconds-long) time the release took.
    expected = [timedelta(minutes=m) for m in (5, 15, 30, 30)]
    assert len(timers) >= 4
    for got, want in zip(timers[:4], expected, strict=True):
        assert want - timedelta(seconds=60) <= got <= want, (timers, expected)
    await stack.wait_ready(order, 1)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_the_30_minute_registration_deadline_reaches_the_wait(stack: Stack) -> None:
    """The registration timeout is a deadline in the wait activity's input (computed from workflow
    time), not a timer: the server does not skip time while that activity is pending, so the value
    itself is checked here, in the history, and its expiry with short values in test_failures.py."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await stack.wait_ready(order, 1)
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
    history = await handle.fetch_history()
    scheduled = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == HubActivity.WAIT_AGENT_FOR_MACS
    ]
    assert len(scheduled) == 1
    payload = scheduled[0].activity_task_scheduled_event_attributes.input.payloads[0]
    wait = WaitAgentInput.model_validate_json(payload.data)
    # Workflow time of the task that scheduled it is at most a task's latency before the event.
    lead = wait.deadline - scheduled[0].event_time.ToDatetime(tzinfo=UTC)
    assert timedelta(minutes=30) - timedelta(seconds=30) <= lead <= timedelta(minutes=30), lead
    await stack.decommission_and_wait(order)
