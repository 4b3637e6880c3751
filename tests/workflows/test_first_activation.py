"""News that reaches a worker run with its first workflow task: the SDK applies signals before the
run function starts, so a handler that needs the run's state must not drop what came too early."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from contracts.bmaas import LostInstance
from contracts.refs import OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerStatus
from contracts.workflows import (
    CURRENT_WORKER_REVISION,
    WorkerNodeInput,
    WorkerNodeResult,
    WorkerOutcome,
    WorkerProgress,
    WorkerSlotSpec,
)
from tests.workflows.stack import RELEASE_IMAGE, Stack, fast_policy, running_stack
from workflows.worker_node import WorkerNodeWorkflow


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(temporal_env.client, tmp_path_factory.mktemp("first-activation")) as running:
        yield running


async def test_a_host_lost_signal_in_a_runs_first_task_is_acted_on(stack: Stack) -> None:
    """A Ready worker's run starts (as after continue-as-new) with `host_lost` about its BMI in its
    first workflow task. It must leave, releasing the host with the reason shown, not drop the news
    because the run had not read its input yet (found by review: it waited for the next host check)."""
    order = OrderRef(namespace=f"t-{uuid.uuid4().hex[:8]}", name=f"o{uuid.uuid4().hex[:8]}")
    slot = WorkerSlotSpec(
        order=order,
        node_set="bm-standard",
        instance_type="bm-standard",
        index=0,
        release_image=RELEASE_IMAGE,
        cluster_namespace=f"{order.namespace}-{order.name}",
    )
    bmi_id = str(uuid.uuid4())  # BMaaS has no such BMI: its release finds it gone at once
    progress = WorkerProgress(
        status=WorkerStatus(
            node_set=slot.node_set,
            name=slot.name,
            phase=WorkerPhase.READY,
            resource_id=bmi_id,
            attempt_count=1,
        ),
        bmi_id=bmi_id,
    )
    policy = fast_policy()
    handle = await stack.client.start_workflow(
        WorkerNodeWorkflow.run,
        WorkerNodeInput(
            slot=slot,
            policy=policy,
            bmaas_task_queue=stack.settings.bmaas_task_queue,
            progress=progress,
            revision=CURRENT_WORKER_REVISION,
        ),
        id=f"worker/{order.key}/{slot.name}",
        task_queue=stack.settings.task_queue,
        start_signal="host_lost",
        start_signal_args=[LostInstance(bmi_id=bmi_id)],
    )

    result = await asyncio.wait_for(handle.result(), 120)
    assert result == WorkerNodeResult(name=slot.name, outcome=WorkerOutcome.DELETED, attempts=1)
    status = await handle.query(WorkerNodeWorkflow.status)
    assert status.last_failure_reason == FailureReason.HOST_LOST
    assert status.phase == WorkerPhase.DELETING and status.resource_id is None
