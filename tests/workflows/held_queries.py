"""A worker interceptor that answers the order's status queries only once the status write under
way has ended, so that its result is in by the time the query's answer completes the task."""

from __future__ import annotations

import threading
from typing import Any

from temporalio.worker import HandleQueryInput, WorkflowInboundInterceptor

from tests.workflows.held_restarts import WorkflowInterceptorOnClient

# Well under the SDK's 2 s deadlock detection of a workflow thread that does not yield.
WAIT_SECONDS = 1.0

# Set by the test: a status query waits for it; the write it waits for sets it once it ended.
query_waits_for: threading.Event | None = None


class _QueryAfterWrite(WorkflowInboundInterceptor):
    def handle_query(self, input: HandleQueryInput) -> Any:
        gate = query_waits_for
        if gate is not None and input.query == "status":
            # A thread of the worker's pool; the write's activity runs on the event loop.
            gate.wait(WAIT_SECONDS)
        return super().handle_query(input)


class QueriesAfterWrites(WorkflowInterceptorOnClient):
    inbound = _QueryAfterWrite
