"""Worker reports delivered by the activities that start or end a phase.

A worker workflow that signals its cluster workflow itself pays five history events per report;
handing the report to the phase's activity costs it none. The activity delivers before it starts
its work (`on_start`) or before it returns (`on_success`), so a report is delivered at least once:
an activity that could not deliver fails and Temporal retries it. Reports to one cluster workflow
that meet in this process go in one `worker_reports` signal: while a signal is in flight the next
ones queue, and a report waits up to a short window for others to the same cluster workflow: a
burst of workers changing phase together (a scale-up of a hundred) wakes it a few times, not
hundreds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from contracts.worker import CarriesReport, WorkerReport, WorkerReports

log = logging.getLogger(__name__)

WORKER_REPORTS_SIGNAL = "worker_reports"
# Bounds one signal's payload (a report is ~300 bytes); the rest go in the next one.
MAX_REPORTS_PER_SIGNAL = 200
# How long a report waits for others: short beside the cluster workflow's status coalescing (0.5 s).
DEFAULT_BATCH_WINDOW_S = 0.1

_Pending = tuple[WorkerReport, "asyncio.Future[None]"]


class ReportSender:
    """One per Temporal client: a queue and at most one signal in flight per cluster workflow."""

    def __init__(self, client: Client, batch_window_s: float = DEFAULT_BATCH_WINDOW_S) -> None:
        self._client = client
        self._batch_window_s = batch_window_s
        self._queues: dict[str, list[_Pending]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}

    async def deliver(self, parent_workflow_id: str, report: WorkerReport) -> None:
        """Return once the report is signalled (or its cluster workflow is gone); raise otherwise."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(parent_workflow_id, []).append((report, done))
        if parent_workflow_id not in self._senders:
            self._senders[parent_workflow_id] = asyncio.create_task(
                self._send_queued(parent_workflow_id), name=f"reports to {parent_workflow_id}"
            )
        await done

    async def _send_queued(self, parent_workflow_id: str) -> None:
        in_flight: list[_Pending] = []
        try:
            if self._batch_window_s > 0:
                await asyncio.sleep(self._batch_window_s)
            while queue := self._queues.get(parent_workflow_id):
                in_flight = queue[:MAX_REPORTS_PER_SIGNAL]
                self._queues[parent_workflow_id] = queue[MAX_REPORTS_PER_SIGNAL:]
                _settle(in_flight, await self._signal(parent_workflow_id, [r for r, _ in in_flight]))
                in_flight = []
        finally:
            # Normally nothing is left; after a cancellation (worker shutdown) no activity may hang.
            left = in_flight + self._queues.pop(parent_workflow_id, [])
            _settle(left, ApplicationError("worker shutting down", type="WorkerReportNotDelivered"))
            self._senders.pop(parent_workflow_id, None)

    async def _signal(self, parent_workflow_id: str, reports: list[WorkerReport]) -> Exception | None:
        handle = self._client.get_workflow_handle(parent_workflow_id)
        try:
            await handle.signal(WORKER_REPORTS_SIGNAL, WorkerReports(reports=reports))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                # A cluster workflow that has ended cannot be told; the worker's query still answers.
                log.warning(
                    "cluster workflow %s is gone; %d report(s) dropped", parent_workflow_id, len(reports)
                )
                return None
            return _not_delivered(parent_workflow_id, err.status.name)
        except Exception as err:  # a timeout or a closed connection: the activity is retried
            return _not_delivered(parent_workflow_id, type(err).__name__)
        return None


def _not_delivered(parent_workflow_id: str, why: str) -> ApplicationError:
    return ApplicationError(
        f"could not report to cluster workflow {parent_workflow_id}: {why}", type="WorkerReportNotDelivered"
    )


def _settle(pending: list[_Pending], error: Exception | None) -> None:
    for _, done in pending:
        if done.done():  # its activity was cancelled meanwhile
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)


_senders: weakref.WeakKeyDictionary[Client, ReportSender] = weakref.WeakKeyDictionary()


def use_batch_window(client: Client, seconds: float) -> None:
    """Set the batch window of the reports this process delivers through `client` (at start)."""
    _senders[client] = ReportSender(client, seconds)


async def deliver(parent_workflow_id: str, report: WorkerReport) -> None:
    """Deliver from inside an activity, through the worker's own Temporal client."""
    client = activity.client()
    sender = _senders.get(client)
    if sender is None:
        sender = _senders[client] = ReportSender(client)
    await sender.deliver(parent_workflow_id, report)


In = TypeVar("In", bound=CarriesReport)
R = TypeVar("R")


def delivers_reports(
    run: Callable[[Any, In], Awaitable[R]],
) -> Callable[[Any, In], Awaitable[R]]:
    """Wrap an activity whose input carries a ReportDelivery: `on_start` before, `on_success` after."""

    @functools.wraps(run)
    async def wrapper(self: Any, input: In) -> R:
        delivery = input.report
        if delivery is not None and delivery.on_start is not None:
            await deliver(delivery.parent_workflow_id, delivery.on_start)
        result = await run(self, input)
        if delivery is not None and delivery.on_success is not None:
            await deliver(delivery.parent_workflow_id, delivery.on_success)
        return result

    return wrapper
