"""Worker reports delivered from activities: batched per cluster workflow, at least once, never
held up by a cluster workflow that has ended."""

from __future__ import annotations

import asyncio
import uuid

from temporalio import workflow
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.reporting import ReportSender
from contracts.worker import WorkerPhase, WorkerReport, WorkerReports, WorkerStatus


@workflow.defn(sandboxed=False)
class ReportSink:
    """Stands in for the cluster workflow: counts `worker_reports` signals and their reports."""

    def __init__(self) -> None:
        self.signals = 0
        self.reports: list[WorkerReport] = []

    @workflow.signal
    def worker_reports(self, batch: WorkerReports) -> None:
        self.signals += 1
        self.reports.extend(batch.reports)

    @workflow.query
    def heard(self) -> tuple[int, int]:
        return self.signals, len(self.reports)

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


def _report(i: int) -> WorkerReport:
    status = WorkerStatus(node_set="bm-standard", name=f"o1-worker-{i}", phase=WorkerPhase.BINDING)
    return WorkerReport(status=status, sequence=1)


async def test_a_burst_of_reports_reaches_the_cluster_workflow_in_few_signals(
    temporal_env: WorkflowEnvironment,
) -> None:
    client = temporal_env.client
    queue = f"reports-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[ReportSink]):
        handle = await client.start_workflow(ReportSink.run, id=f"sink-{queue}", task_queue=queue)
        sender = ReportSender(client, batch_window_s=0.2)
        # Every deliver returns only once its report is signalled.
        await asyncio.gather(*(sender.deliver(handle.id, _report(i)) for i in range(40)))
        signals, reports = await handle.query(ReportSink.heard)
        assert reports == 40
        assert signals <= 4, signals

        # Without a window, reports queued while a signal is in flight still share the next one.
        eager = ReportSender(client, batch_window_s=0)
        await asyncio.gather(*(eager.deliver(handle.id, _report(i)) for i in range(40)))
        after, reports = await handle.query(ReportSink.heard)
        assert reports == 80
        assert after - signals <= 2, after - signals
        await handle.terminate()


async def test_a_cluster_workflow_that_ended_does_not_hold_up_the_activity(
    temporal_env: WorkflowEnvironment,
) -> None:
    sender = ReportSender(temporal_env.client, batch_window_s=0)
    await sender.deliver(f"cluster-workers/gone-{uuid.uuid4().hex[:8]}", _report(0))


class _FailingSender(ReportSender):
    async def _signal(self, parent_workflow_id: str, reports: list[WorkerReport]) -> Exception | None:
        return ApplicationError("unavailable", type="WorkerReportNotDelivered")


async def test_an_undelivered_report_fails_its_activity_for_a_retry(
    temporal_env: WorkflowEnvironment,
) -> None:
    client: Client = temporal_env.client
    sender = _FailingSender(client, batch_window_s=0)
    results = await asyncio.gather(
        *(sender.deliver("cluster-workers/x", _report(i)) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, ApplicationError) and r.type == "WorkerReportNotDelivered" for r in results)
    # Nothing is left queued: the next report is tried afresh.
    assert not sender._queues and not sender._senders
