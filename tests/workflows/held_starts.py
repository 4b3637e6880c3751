"""A worker interceptor that makes one reconcile pass race a victim's own end: when the order
starts its third worker (index 2), it first cancels its first worker's run (as an operator's cancel
in the Web UI would), holds the start until that worker's release has been reported and its run
has closed. The pass that started the third worker then tells the first,
already chosen as a victim, to leave (a module of its own so the sandbox can import it)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import StartChildWorkflowInput, WorkflowOutboundInterceptor

from tests.workflows.held_restarts import OutboundInstalled, WorkflowInterceptorOnClient

HELD_SUFFIX = "-worker-2"
VICTIM_SUFFIX = "-worker-0"
# The victim's last report goes out before its run closes (a workflow task later): asked again this
# often whether it has closed.
CLOSED_YET_EVERY = timedelta(seconds=1)


class _RacingOutbound(WorkflowOutboundInterceptor):
    async def start_child_workflow(
        self, input: StartChildWorkflowInput
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        if input.id.endswith(HELD_SUFFIX):
            victim_id = input.id.removesuffix(HELD_SUFFIX) + VICTIM_SUFFIX
            victim = victim_id.rsplit("/", 1)[1]
            await workflow.get_external_workflow_handle(victim_id).cancel()
            order = workflow.instance()
            await workflow.wait_condition(lambda: victim not in {w.name for w in order.status().workers})
            while True:  # a leaving worker takes scale_down as the no-op it is; a closed one fails it
                try:
                    await workflow.get_external_workflow_handle(victim_id).signal("scale_down")
                except ApplicationError:
                    break
                await workflow.sleep(CLOSED_YET_EVERY)
        return await super().start_child_workflow(input)


class _RacingInbound(OutboundInstalled):
    outbound = _RacingOutbound


class CancelVictimWhileStarting(WorkflowInterceptorOnClient):
    inbound = _RacingInbound
