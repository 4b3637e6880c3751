"""OSAC's production backoff table, proven on a time-skipping dev server in seconds of wall time.

The server skips a workflow's virtual clock whenever nothing is in flight (no activity pending):
while a failed worker sits out its backoff. The wait for the Agent is an activity, which the server
does not skip: its deadline (the policy's timeout from when it began) is proven in test_failures,
and OSAC's 30 minutes as the policy's default here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from contracts.worker import FailureReason, TimingPolicy, WorkerStatus
from contracts.workflows import worker_workflow_id
from tests.conftest import temporal_binary
from tests.workflows.stack import Stack, eventually, running_stack
from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
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
    # A call lost with its worker is made again after a minute; a lost wait moves after 30 s.
    assert policy.call_timeout == timedelta(seconds=60)
    assert policy.wait_heartbeat_timeout == timedelta(seconds=30)


async def test_no_hosts_backoff_follows_the_5_15_30_minute_table(stack: Stack) -> None:
    await stack.set_bmaas_faults(no_free_hosts=True)
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))

    try:
        status = await _attempt(handle, 5, "five attempts with production backoffs")
    finally:
        await stack.clear_bmaas_faults()
    assert status.last_failure_reason == FailureReason.NO_HOSTS_AVAILABLE

    timers = _fired_timers((await handle.fetch_history()).events)
    # Each backoff is the table's value less the (real, seconds-long) time the release took.
    expected = [timedelta(minutes=m) for m in (5, 15, 30, 30)]
    assert len(timers) >= 4
    for got, want in zip(timers[:4], expected, strict=True):
        assert want - timedelta(seconds=60) <= got <= want, (timers, expected)
    await stack.wait_ready(order, 1)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def _attempt(handle: WorkflowHandle[Any, Any], attempt: int, what: str) -> WorkerStatus:
    """The worker's status once it is at `attempt` or later."""

    async def reached() -> WorkerStatus | None:
        try:
            status: WorkerStatus = await handle.query("status", result_type=WorkerStatus)
        except RPCError:  # the cluster workflow has not started this worker yet
            return None
        return status if status.attempt_count >= attempt else None

    return await eventually(reached, what, timeout=120)


def _fired_timers(events: Sequence[HistoryEvent], after: int = 0) -> list[timedelta]:
    """Durations of the timers started after event `after` that fired: backoffs and waits, not a
    wipe's "stuck" timer, which is cancelled once the host is gone."""
    fired = {
        e.timer_fired_event_attributes.timer_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED
    }
    return [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and e.event_id > after
        and e.timer_started_event_attributes.timer_id in fired
    ]
