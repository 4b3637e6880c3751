"""A worker interceptor that holds the order's restarts of stopped workers until its run is due to
continue as new, and a little longer: the window in which a continue-as-new could drop a restart
(a module of its own so the sandbox can import it)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import client, workflow
from temporalio.worker import (
    Interceptor,
    StartChildWorkflowInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

# Long enough for the run to write its last status and continue as new meanwhile, if it does not wait.
HELD_PAST_THE_SUGGESTION = timedelta(seconds=5)


def _restarts_a_stopped_worker(args: Any) -> bool:
    progress = getattr(args[0], "progress", None) if args else None
    return bool(getattr(progress, "restarted", False))


class _HoldingOutbound(WorkflowOutboundInterceptor):
    async def start_child_workflow(
        self, input: StartChildWorkflowInput
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        if _restarts_a_stopped_worker(input.args):
            await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
            await workflow.sleep(HELD_PAST_THE_SUGGESTION)
        return await super().start_child_workflow(input)


class OutboundInstalled(WorkflowInboundInterceptor):
    """Puts `outbound` around the workflow's calls out (child starts, signals, timers)."""

    outbound: type[WorkflowOutboundInterceptor]

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(self.outbound(outbound))


class WorkflowInterceptorOnClient(client.Interceptor, Interceptor):
    """On the worker's client (workers take the client's interceptors that are worker
    interceptors): installs `inbound` in every workflow."""

    inbound: type[WorkflowInboundInterceptor]

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return self.inbound


class _HoldingInbound(OutboundInstalled):
    outbound = _HoldingOutbound


class HoldRestartsUntilContinueAsNew(WorkflowInterceptorOnClient):
    inbound = _HoldingInbound
