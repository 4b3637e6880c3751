"""The worker process's stop (SIGTERM): both of its Temporal workers drain at once, so the drain
takes one OSAC_GRACEFUL_SHUTDOWN_SECONDS, not one per worker (deploy/worker.yaml's
terminationGracePeriodSeconds is sized for one)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from contracts.activities import BmaasActivity
from contracts.bmaas import WaitInstanceGoneInput
from tests.workflows.stack import Stack, eventually, running_stack
from worker.main import run_worker

# What the SDK logs as each Temporal worker begins its shutdown (temporalio.worker._worker).
SHUTDOWN_BEGINS = "Beginning worker shutdown"


@workflow.defn(sandboxed=False)
class HoldBmaasWorkerWorkflow:
    """Keeps one activity in flight on a BMaaS task queue: a wait for a running BMI to be gone."""

    @workflow.run
    async def run(self, args: tuple[str, str]) -> None:
        bmi_id, task_queue = args
        await workflow.execute_activity(
            BmaasActivity.WAIT_INSTANCE_GONE.value,
            WaitInstanceGoneInput(bmi_id=bmi_id),
            task_queue=task_queue,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=timedelta(seconds=6),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(temporal_env.client, tmp_path_factory.mktemp("drain")) as running:
        yield running


async def _holding(handle: WorkflowHandle[HoldBmaasWorkerWorkflow, None]) -> bool:
    pending = (await handle.describe()).raw_description.pending_activities
    return any(p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED for p in pending)


async def test_both_workers_begin_their_drain_at_once(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    """While the BMaaS worker still drains an activity, the workflow worker is already shutting
    down too (one after the other, it would wait for the first and drain for a grace period of its
    own, taking new tasks meanwhile)."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    bmi_id = (await stack.wait_ready(order, 1)).workers[0].resource_id
    assert bmi_id

    queue = f"drain-{uuid.uuid4().hex[:6]}"
    # A grace period the test never reaches: the held activity ends when the test cancels it.
    settings = stack.settings.model_copy(
        update={"task_queue": queue, "bmaas_task_queue": f"{queue}-bmaas", "graceful_shutdown_seconds": 600.0}
    )
    stop = asyncio.Event()
    draining = asyncio.create_task(run_worker(stack.client, settings, stop))
    probe_queue = f"{queue}-probe"
    async with Worker(
        stack.client,
        task_queue=probe_queue,
        workflows=[HoldBmaasWorkerWorkflow],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        hold = await stack.client.start_workflow(
            HoldBmaasWorkerWorkflow.run,
            (bmi_id, settings.bmaas_task_queue),
            id=f"{queue}-hold",
            task_queue=probe_queue,
        )
        try:
            await eventually(lambda: _holding(hold), "the BMaaS wait in flight on the stopping worker", 60)
            caplog.set_level(logging.INFO, logger="temporalio.worker._worker")
            caplog.clear()
            stop.set()

            async def both_began() -> bool:
                return sum(SHUTDOWN_BEGINS in r.getMessage() for r in caplog.records) >= 2

            await eventually(both_began, "both Temporal workers of the process beginning their shutdown", 60)
            assert await _holding(hold), "the BMaaS worker's drain ended before the check"
            assert not draining.done()
        finally:
            await hold.cancel()  # the held wait hears it with its next heartbeat and ends
            stop.set()
            await asyncio.wait_for(draining, 120)
    assert draining.exception() is None
    await stack.decommission_and_wait(order)
