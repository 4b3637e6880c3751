"""A worker cancelled from outside releases its host also under the SDK's single-batch activations
(workflow logic flag 2, which the SDK means to make its default): there, every wait that began
before a cancel request raises CancelledError when it ends, in every task of the workflow. The
worker's own life (`WorkerNodeWorkflow._wait`) takes that as the scale-down the cancel is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import temporalio.worker._workflow as sdk_workflow_worker
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker._workflow_instance import _WorkflowLogicFlag

from contracts.worker import WorkerPhase
from contracts.workflows import worker_workflow_id
from tests.workflows.stack import QUICK_RESTARTS, Stack, eventually, running_stack

SINGLE_BATCH = _WorkflowLogicFlag.PROCESS_WORKFLOW_ACTIVATION_JOBS_AS_SINGLE_BATCH


@pytest.fixture
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stack]:
    # As a later SDK release will have it by default: set before the stack builds its worker.
    monkeypatch.setattr(
        sdk_workflow_worker, "_DEFAULT_ENABLED_WORKFLOW_LOGIC_FLAGS", frozenset({SINGLE_BATCH})
    )
    async with running_stack(temporal_env.client, tmp_path) as running:
        yield running


async def test_a_cancelled_worker_leaves_under_single_batch_activations_and_restarts_if_stopped(
    stack: Stack,
) -> None:
    """Cancelled while Ready, the worker leaves (its host's delete held by a fault meanwhile), then
    an operator terminates it as it leaves: it was never told to leave, yet the order's next look
    starts it again to finish the release, and the order replaces it."""
    api = stack.with_policy(**QUICK_RESTARTS)
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    before = (await stack.wait_ready(order, 1)).workers[0].resource_id
    cancelled = order.worker_name(0)
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, cancelled))
    await stack.set_bmaas_faults(
        routes={"DELETE /api/private/v1/baremetal_instances/{id}": {"error_rate": 1.0}}
    )
    try:
        await handle.cancel()

        async def deleting() -> bool:
            status = await stack.api.status(order)
            return any(w.name == cancelled and w.phase == WorkerPhase.DELETING for w in status.workers)

        await eventually(deleting, "the cancelled worker deleting its host")
        cancelled_run = await handle.describe()
        # The flag was in effect (else this test shows nothing).
        flags = {
            flag
            for e in (await handle.fetch_history()).events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            for flag in e.workflow_task_completed_event_attributes.sdk_metadata.lang_used_flags
        }
        assert SINGLE_BATCH in flags
        await handle.terminate(reason="test")

        async def started_again() -> bool:
            latest = await stack.client.get_workflow_handle(worker_workflow_id(order, cancelled)).describe()
            return latest.run_id != cancelled_run.run_id and latest.status == WorkflowExecutionStatus.RUNNING

        await eventually(started_again, "the worker, stopped while leaving on its own, started again")
    finally:
        await stack.clear_bmaas_faults()

    async def replaced() -> bool:
        status = await stack.api.status(order)
        return status.ready_workers == 1 and cancelled not in {w.name for w in status.workers}

    await eventually(replaced, "the cancelled worker released and replaced", timeout=120)
    wiped = {r["bmi_id"] for r in await stack.audit() if r["kind"] == "WIPE_FINISHED"}
    assert before in wiped
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
