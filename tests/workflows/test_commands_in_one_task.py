"""Commands that reach the cluster workflow together: with the worker down, a targeted scale-down and
a scale-up queue up and arrive in one workflow task (as they can around a continue-as-new or under
load). The named worker must still leave, and the count must still be met."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import UpdateWorkflowExecutionLifecycleStage as LifecycleStage
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.client import WorkflowUpdateStage
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from contracts.workflows import ClusterWorkersStatus, NodeSetRequest, ScaleDownWorker, SetNodeSets
from tests.workflows.stack import Stack, eventually, patches_recorded, running_stack, worker_running
from workflows.cluster_workers import ClusterPatch, ClusterWorkersWorkflow


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(
        temporal_env.client, tmp_path_factory.mktemp("one-task"), in_process_worker=False
    ) as running:
        yield running


async def _admitted(stack: Stack, workflow_id: str, update_id: str) -> bool:
    """Whether the server holds the update (its stage can be polled without a worker)."""
    request = PollWorkflowExecutionUpdateRequest(
        namespace=stack.client.namespace,
        update_ref=UpdateRef(
            workflow_execution=WorkflowExecution(workflow_id=workflow_id), update_id=update_id
        ),
        wait_policy=WaitPolicy(
            lifecycle_stage=LifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED
        ),
    )
    try:
        await stack.client.workflow_service.poll_workflow_execution_update(
            request, timeout=timedelta(seconds=5)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def test_a_named_worker_leaves_when_a_scale_up_arrives_in_the_same_task(stack: Stack) -> None:
    order = await stack.create_order({"bm-standard": 2})
    async with worker_running(stack):
        await stack.apply(order, {"bm-standard": 2})
        await stack.wait_ready(order, 2)

    # Worker down: the update raises the count to 3, the signal names worker-0 (and lowers it by one).
    handle = stack.api.handle(order)
    raise_count = asyncio.ensure_future(
        handle.start_update(
            ClusterWorkersWorkflow.set_node_sets,
            SetNodeSets(node_sets=[NodeSetRequest(name="bm-standard", instance_type="bm-standard", count=3)]),
            id="raise-to-3",
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        )
    )
    await eventually(lambda: _admitted(stack, handle.id, "raise-to-3"), "the server to admit the update")
    named = order.worker_name(0)
    await handle.signal(ClusterWorkersWorkflow.scale_down_worker, ScaleDownWorker(name=named))

    async with worker_running(stack):
        await raise_count

        async def settled() -> ClusterWorkersStatus | None:
            st = await stack.api.status(order)
            names = {w.name for w in st.workers}
            done = named not in names and st.ready_workers == st.desired_workers == len(names)
            return st if done else None

        status = await eventually(settled, f"{named} gone and the count met")
        # The SDK applies the signal (2 - 1) before the update (3); the other order would leave 3 - 1.
        assert status.desired_workers in (2, 3)
        history = await handle.fetch_history()
        # The patch is recorded only where the old plan would have kept the named worker.
        assert patches_recorded(history).count(ClusterPatch.NAMED_WORKERS_ALWAYS_LEAVE) == 1

        final = await stack.decommission_and_wait(order)
    assert final.finished and final.workers == []
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
