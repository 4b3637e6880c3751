"""What Temporal itself says about the worker workflows, asked through the worker's own client.

A cluster workflow sees the end of the workers its run started; a worker started by an earlier run
(before a continue-as-new) ends unseen. Describing it (its latest run, by workflow id) is the only
way to learn that an operator terminated it while it still held a host.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.api.errordetails.v1 import NotFoundFailure
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from contracts.activities import HubActivity
from contracts.workflows import FindStoppedWorkersInput, StoppedWorkers

# Describes in flight at once: a few hundred ids answer in a few round trips.
MAX_CONCURRENT_DESCRIBES = 16
# This worker's own credentials or request refused: asking again cannot help.
REFUSED = frozenset(
    {RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.INVALID_ARGUMENT}
)


class WorkflowActivities:
    def all(self) -> list[Any]:
        """Every activity of this class, bound, for `Worker(activities=...)`."""
        return [self.find_stopped_workers]

    @activity.defn(name=HubActivity.FIND_STOPPED_WORKERS.value)
    async def find_stopped_workers(self, input: FindStoppedWorkersInput) -> StoppedWorkers:
        """The ids whose latest run was terminated and those Temporal says it does not know
        (deleted). A worker only completes after its release, and is started with no timeout, so
        no other end means it left a host behind. Read-only."""
        client = activity.client()
        limit = asyncio.Semaphore(MAX_CONCURRENT_DESCRIBES)

        async def stopped(workflow_id: str) -> bool:
            async with limit:
                try:
                    described = await client.get_workflow_handle(workflow_id).describe()
                except RPCError as err:
                    if _workflow_not_found(err):
                        return True
                    raise ApplicationError(
                        f"could not describe worker workflow {workflow_id}: {err.status.name}",
                        type="WorkerDescribeFailed",
                        non_retryable=err.status in REFUSED,
                    ) from None
            return described.status == WorkflowExecutionStatus.TERMINATED

        ids = sorted(set(input.workflow_ids))
        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the other describes
                answers = [group.create_task(stopped(workflow_id)) for workflow_id in ids]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return StoppedWorkers(workflow_ids=[i for i, task in zip(ids, answers, strict=True) if task.result()])


def _workflow_not_found(err: RPCError) -> bool:
    """NOT_FOUND about the workflow itself: an unknown namespace, or a proxy's 404, is no answer
    about the worker, and taking it for one would release a live worker's host."""
    if err.status != RPCStatusCode.NOT_FOUND:
        return False
    return any(detail.Is(NotFoundFailure.DESCRIPTOR) for detail in err.grpc_status.details)
