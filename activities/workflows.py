"""What Temporal itself says about the worker workflows, asked through the worker's own client.

A cluster workflow sees the end of the workers its run started; a worker started by an earlier run
(before a continue-as-new) ends unseen. Describing it (its latest run, by workflow id) is the only
way to learn that an operator terminated it while it still held a host.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from contracts.activities import HubActivity
from contracts.workflows import FindStoppedWorkersInput, StoppedWorkers

# Ended by someone else's hand: a worker only completes after its release (or a cancel it took as
# one), and fails only on a bug that Temporal shows as such.
STOPPED_STATUSES = frozenset({WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.TIMED_OUT})
# Describes in flight at once: a few hundred ids answer in a few round trips.
MAX_CONCURRENT_DESCRIBES = 16


class WorkflowActivities:
    def all(self) -> list[Any]:
        """Every activity of this class, bound, for `Worker(activities=...)`."""
        return [self.find_stopped_workers]

    @activity.defn(name=HubActivity.FIND_STOPPED_WORKERS.value)
    async def find_stopped_workers(self, input: FindStoppedWorkersInput) -> StoppedWorkers:
        """The ids whose latest run was terminated (or timed out) and the ids Temporal no longer
        knows (deleted). Read-only; any other answer is retried."""
        client = activity.client()
        limit = asyncio.Semaphore(MAX_CONCURRENT_DESCRIBES)

        async def stopped(workflow_id: str) -> bool:
            async with limit:
                try:
                    described = await client.get_workflow_handle(workflow_id).describe()
                except RPCError as err:
                    if err.status == RPCStatusCode.NOT_FOUND:
                        return True
                    raise ApplicationError(
                        f"could not describe worker workflow {workflow_id}: {err.status.name}",
                        type="WorkerDescribeFailed",
                    ) from None
            return described.status in STOPPED_STATUSES

        ids = sorted(set(input.workflow_ids))
        answers = await asyncio.gather(*(stopped(workflow_id) for workflow_id in ids))
        return StoppedWorkers(workflow_ids=[i for i, gone in zip(ids, answers, strict=True) if gone])
