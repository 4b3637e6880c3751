"""A careless change to WorkerNodeWorkflow, for the replay test: it sleeps before provisioning,
which its recorded histories never did. Its own module, so the sandbox imports nothing else."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.workflows import WorkerNodeInput, WorkerNodeResult
    from workflows.worker_node import WorkerNodeWorkflow


@workflow.defn(name="WorkerNodeWorkflow")
class ReorderedWorkerNodeWorkflow(WorkerNodeWorkflow):
    @workflow.run
    async def run(self, inp: WorkerNodeInput) -> WorkerNodeResult:
        await workflow.sleep(1)
        return await super().run(inp)
