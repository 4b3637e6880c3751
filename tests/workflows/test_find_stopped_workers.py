"""`find_stopped_workers` against a real dev server: which worker workflows nobody will ever release."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from google.protobuf.message import Message
from temporalio import workflow
from temporalio.api.common.v1 import GrpcStatus
from temporalio.api.errordetails.v1 import NamespaceNotFoundFailure, NotFoundFailure
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.workflows import WorkflowActivities, _workflow_not_found
from contracts.workflows import FindStoppedWorkersInput, StoppedWorkers
from tests.workflows.stack import eventually


@workflow.defn(sandboxed=False)
class Holds:
    """Stands for a worker: runs until cancelled, or completes at once when told to."""

    @workflow.run
    async def run(self, complete: bool) -> None:
        if not complete:
            await workflow.wait_condition(lambda: False)


async def test_terminated_and_deleted_workers_are_stopped_and_no_others(
    temporal_env: WorkflowEnvironment,
) -> None:
    client = temporal_env.client
    queue = f"stopped-{uuid.uuid4().hex[:6]}"
    prefix = f"w-{uuid.uuid4().hex[:6]}"
    ids = {
        kind: f"{prefix}-{kind}"
        for kind in ("running", "completed", "cancelled", "terminated", "timed-out", "never-started")
    }
    runner = UnsandboxedWorkflowRunner()
    async with Worker(client, task_queue=queue, workflows=[Holds], workflow_runner=runner):
        handles = {
            kind: await client.start_workflow(
                Holds.run,
                kind == "completed",
                id=ids[kind],
                task_queue=queue,
                execution_timeout=timedelta(seconds=1) if kind == "timed-out" else None,
            )
            for kind in ("running", "completed", "cancelled", "terminated", "timed-out")
        }
        await handles["completed"].result()
        await handles["terminated"].terminate(reason="test")
        await handles["cancelled"].cancel()

        async def settled() -> bool:
            statuses = await asyncio.gather(
                *(handles[k].describe() for k in ("cancelled", "timed-out", "running"))
            )
            return [d.status for d in statuses] == [
                WorkflowExecutionStatus.CANCELED,
                WorkflowExecutionStatus.TIMED_OUT,
                WorkflowExecutionStatus.RUNNING,
            ]

        await eventually(settled, "the cancel and the timeout to land", timeout=60)
        found: StoppedWorkers = await ActivityEnvironment(client=client).run(
            WorkflowActivities().find_stopped_workers,
            FindStoppedWorkersInput(workflow_ids=list(ids.values())),
        )
        await handles["running"].terminate(reason="cleanup")
    # A worker is started with no timeout, so one that timed out was not ours: left alone.
    assert found.workflow_ids == sorted([ids["terminated"], ids["never-started"]])


def _not_found(*details: Message) -> RPCError:
    status = GrpcStatus(code=RPCStatusCode.NOT_FOUND.value, message="not found")
    for detail in details:
        status.details.add().Pack(detail)
    return RPCError("not found", RPCStatusCode.NOT_FOUND, status.SerializeToString())


def test_only_temporals_own_workflow_not_found_counts_as_deleted() -> None:
    """An unknown namespace, or a proxy's bare 404, says nothing about the worker: taken for a
    deleted worker, it would have a live worker's host released."""
    assert _workflow_not_found(_not_found(NotFoundFailure()))
    assert not _workflow_not_found(_not_found(NamespaceNotFoundFailure(namespace="default")))
    assert not _workflow_not_found(_not_found())
    assert not _workflow_not_found(RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""))
