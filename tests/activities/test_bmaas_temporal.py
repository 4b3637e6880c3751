"""The activities inside a real worker on the dev server, with the pydantic data converter: names,
payloads, heartbeats and error types survive the trip through Temporal."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.bmaas import BmaasActivities
from contracts.bmaas import (
    BmaasErrorType,
    CreateWorkerInstanceInput,
    WaitInstanceGoneInput,
    WaitInstanceRunningInput,
)
from tests.activities.conftest import Harness

WAIT = timedelta(seconds=60)
CALL = timedelta(seconds=30)
# Long enough that the SDK's throttled heartbeat (80 % of it after the first) lands with room to
# spare on a loaded machine.
HEARTBEAT = timedelta(seconds=8)
RETRY = RetryPolicy(maximum_interval=timedelta(seconds=1))


class LifeOutcome(BaseModel):
    macs: list[str] = []
    failure_type: str | None = None
    non_retryable: bool | None = None


@workflow.defn(sandboxed=False)
class BmaasLifeWorkflow:
    """Create, wait running, delete, wait gone; answers the MACs, or the failure type."""

    @workflow.run
    async def run(self, req: CreateWorkerInstanceInput) -> LifeOutcome:
        created = await workflow.execute_activity_method(
            BmaasActivities.create_worker_instance, req, start_to_close_timeout=CALL, retry_policy=RETRY
        )
        ref = WaitInstanceRunningInput(bmi_id=created.instance.id)
        try:
            running = await workflow.execute_activity_method(
                BmaasActivities.wait_instance_running,
                ref,
                start_to_close_timeout=WAIT,
                heartbeat_timeout=HEARTBEAT,
            )
        except ActivityError as err:
            assert isinstance(err.cause, ApplicationError)
            return LifeOutcome(failure_type=err.cause.type, non_retryable=err.cause.non_retryable)
        await workflow.execute_activity_method(
            BmaasActivities.delete_instance, ref, start_to_close_timeout=CALL, retry_policy=RETRY
        )
        await workflow.execute_activity_method(
            BmaasActivities.wait_instance_gone,
            WaitInstanceGoneInput(bmi_id=ref.bmi_id),
            start_to_close_timeout=WAIT,
            heartbeat_timeout=HEARTBEAT,
        )
        return LifeOutcome(macs=running.macs)


SLOW_DELETE_HEARTBEAT = timedelta(seconds=12)


@workflow.defn(sandboxed=False)
class BmaasReleaseWorkflow:
    """One wait for a BMI gone that deletes it first, as a worker's release does."""

    @workflow.run
    async def run(self, bmi_id: str) -> None:
        await workflow.execute_activity_method(
            BmaasActivities.wait_instance_gone,
            WaitInstanceGoneInput(bmi_id=bmi_id, delete_first=True),
            start_to_close_timeout=WAIT,
            heartbeat_timeout=SLOW_DELETE_HEARTBEAT,
        )


async def _run(
    harness: Harness, env: WorkflowEnvironment, req: CreateWorkerInstanceInput, workflow_id: str | None = None
) -> LifeOutcome:
    result: LifeOutcome = await _execute(
        harness, env, BmaasLifeWorkflow.run, req, workflow_id or f"bmaas-life-{uuid.uuid4().hex[:8]}"
    )
    return result


async def _execute(harness: Harness, env: WorkflowEnvironment, run: Any, arg: Any, workflow_id: str) -> Any:
    """One of this module's workflows, on a worker of its own with the harness's activities."""
    queue = f"bmaas-{uuid.uuid4().hex[:8]}"
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[BmaasLifeWorkflow, BmaasReleaseWorkflow],
        activities=harness.acts.all(),
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        return await env.client.execute_workflow(
            run, arg, id=workflow_id, task_queue=queue, execution_timeout=timedelta(seconds=120)
        )


async def test_life_through_a_worker(harness: Harness, temporal_env: WorkflowEnvironment) -> None:
    await harness.lab.timings(boot_s=0.5, wipe_s=0.3)
    result = await _run(harness, temporal_env, harness.slot(0))
    assert result.failure_type is None
    assert len(result.macs) == 2
    assert await harness.lab.list_bmis() == []


async def test_typed_failure_through_a_worker(harness: Harness, temporal_env: WorkflowEnvironment) -> None:
    await harness.lab.faults(no_free_hosts=True)
    result = await _run(harness, temporal_env, harness.slot(0))
    assert result.failure_type == BmaasErrorType.NO_HOSTS_AVAILABLE.value
    assert result.non_retryable is True


async def test_paced_heartbeats_keep_a_wait_longer_than_its_heartbeat_timeout_alive(
    harness: Harness, temporal_env: WorkflowEnvironment
) -> None:
    # Ticks of a third of the timeout: the first heartbeat a tick into the wait, then one a tick at
    # most. A boot longer than the whole timeout must still be waited out in one attempt.
    harness.acts.heartbeat_interval = 60.0
    await harness.lab.timings(boot_s=HEARTBEAT.total_seconds() + 1.5, wipe_s=0.3)
    workflow_id = f"bmaas-paced-{uuid.uuid4().hex[:8]}"
    result = await _run(harness, temporal_env, harness.slot(0), workflow_id)
    assert result.failure_type is None and len(result.macs) == 2
    history = await temporal_env.client.get_workflow_handle(workflow_id).fetch_history()
    started = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert len(started) == 4 and all(a.attempt == 1 for a in started)  # no heartbeat timed out


async def test_a_slow_delete_does_not_cost_the_wait_for_the_wipe_its_attempt(
    harness: Harness, temporal_env: WorkflowEnvironment
) -> None:
    # The heartbeat timeout counts from the attempt's start. A delete answered more than two thirds
    # of it later must be followed by a heartbeat at once, not a tick (a third) after it.
    harness.acts.heartbeat_interval = 60.0
    await harness.lab.timings(boot_s=0.2, wipe_s=6.0)  # the wait outlasts the timeout
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    await harness.run(
        harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id)
    )
    # Past two thirds of the timeout (a tick later would be past it), and within the client's 10 s.
    slow = 8.5
    await harness.lab.faults(routes={"DELETE /api/private/v1/baremetal_instances/{id}": {"latency_s": slow}})
    workflow_id = f"bmaas-slow-delete-{uuid.uuid4().hex[:8]}"
    await _execute(harness, temporal_env, BmaasReleaseWorkflow.run, created.instance.id, workflow_id)
    assert await harness.lab.get_bmi(created.instance.id) is None
    history = await temporal_env.client.get_workflow_handle(workflow_id).fetch_history()
    started = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert [a.attempt for a in started] == [1]  # no heartbeat timed out
