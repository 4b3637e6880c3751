"""A worker interceptor that answers the order's status queries only once the status write under
way has ended, so that its result is in by the time the query's answer completes the task."""

from __future__ import annotations

from typing import Any

from temporalio.worker import HandleQueryInput, WorkflowInboundInterceptor

from tests.workflows import write_gate
from tests.workflows.held_restarts import WorkflowInterceptorOnClient


class _QueryAfterWrite(WorkflowInboundInterceptor):
    def handle_query(self, input: HandleQueryInput) -> Any:
        gate = write_gate.query_waits_for
        if gate is not None and input.query == "status":
            # A thread of the worker's pool; the write's activity runs on the event loop.
            gate.wait(write_gate.WAIT_SECONDS)
        return super().handle_query(input)


class QueriesAfterWrites(WorkflowInterceptorOnClient):
    inbound = _QueryAfterWrite
