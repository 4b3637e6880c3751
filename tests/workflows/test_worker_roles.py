"""A worker split in two processes by `OSAC_WORKER_ROLE`: the `workflows` one polls only workflow
tasks (running the local activities itself), the `activities` one only activity tasks, and together
they take an order up and down as one `all` process does."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.testing import WorkflowEnvironment

from tests.workflows.stack import Stack, eventually, running_stack, worker_running
from worker.settings import Settings, WorkerRole

WORKFLOW = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
ACTIVITY = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY


async def _pollers(stack: Stack, queue: str, kind: TaskQueueType.ValueType) -> int:
    response = await stack.client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=stack.client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
        )
    )
    return len(response.pollers)


def test_the_role_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OSAC_WORKER_ROLE", raising=False)
    assert Settings().role == WorkerRole.ALL
    monkeypatch.setenv("OSAC_WORKER_ROLE", "workflows")
    assert Settings().role == WorkerRole.WORKFLOWS
    monkeypatch.setenv("OSAC_WORKER_ROLE", "both")
    with pytest.raises(ValueError, match="OSAC_WORKER_ROLE"):
        Settings()


async def test_a_workflow_process_and_an_activity_process_run_an_order(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with running_stack(temporal_env.client, tmp_path, in_process_worker=False) as stack:
        main, bmaas = stack.settings.task_queue, stack.settings.bmaas_task_queue
        order = await stack.create_order({"bm-standard": 2})
        workflows = stack.settings.model_copy(update={"role": WorkerRole.WORKFLOWS})
        activities = stack.settings.model_copy(update={"role": WorkerRole.ACTIVITIES})
        async with worker_running(stack, workflows):
            await eventually(lambda: _pollers(stack, main, WORKFLOW), "workflow pollers")
            # Its pollers all started together: none of them asks for activity tasks.
            assert await _pollers(stack, main, ACTIVITY) == 0
            assert await _pollers(stack, bmaas, ACTIVITY) == 0
            async with worker_running(stack, activities):
                await eventually(lambda: _pollers(stack, main, ACTIVITY), "hub activity pollers")
                await eventually(lambda: _pollers(stack, bmaas, ACTIVITY), "BMaaS activity pollers")
                await stack.apply(order, {"bm-standard": 2})
                await stack.wait_ready(order, 2)
                final = await stack.decommission_and_wait(order)
        assert final.finished and final.workers == []
        assert await stack.bmis(order) == []
        assert await stack.audit_violations() == []
        # Who did what, as the histories record it: every workflow task in the workflow process,
        # every activity task (none handed over eagerly) in the activity process.
        parent = await stack.api.handle(order).fetch_history()
        children = [
            e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
            for e in parent.events
            if e.HasField("child_workflow_execution_started_event_attributes")
        ]
        assert len(children) == 2
        histories = [parent] + [await stack.client.get_workflow_handle(c).fetch_history() for c in children]
        tasks: dict[str, set[str]] = {"workflow": set(), "activity": set()}
        for history in histories:
            for e in history.events:
                if e.HasField("workflow_task_started_event_attributes"):
                    tasks["workflow"].add(
                        e.workflow_task_started_event_attributes.identity.rpartition("/")[2]
                    )
                if e.HasField("activity_task_started_event_attributes"):
                    tasks["activity"].add(
                        e.activity_task_started_event_attributes.identity.rpartition("/")[2]
                    )
        assert tasks == {"workflow": {"workflows"}, "activity": {"activities"}}
