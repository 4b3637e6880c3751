"""Where a run decides to continue as new: only where an event its history keeps resumed it.

A status write is a local activity. When its workflow task also answers a query, the SDK leaves
its result to a task it forces right after, while replay takes the result in the task that
recorded it. The forced task has no event of its own: a run that read the server's suggestion
there (the first task it came with) and continued as new failed to replay, "Non-deprecated patch
marker encountered for change continue-as-new-past-a-refused-status, but there is no corresponding
change command" (seen once in a clean-clone CI run, from the harness's status queries)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine, Generator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from activities.hub import HubActivities
from contracts.activities import HubActivity
from contracts.hub import PublishStatusInput, PublishStatusResult
from contracts.refs import OrderRef
from contracts.worker import WorkerReport, WorkerReports, WorkerStatus
from contracts.workflows import ClusterWorkersStatus
from tests.conftest import start_dev_server
from tests.workflows import held_queries
from tests.workflows.stack import (
    Stack,
    eventually,
    order_run_continued_as_new,
    patches_recorded,
    replay_clean,
    running_stack,
)
from worker.main import build_workers, open_backends
from workflows.cluster_workers import ClusterPatch, ClusterWorkersWorkflow
from workflows.continue_as_new import ContinueAsNewDue

# The history size the server suggests continuing as new past: bytes, which a test can aim at.
SUGGEST_AFTER_BYTES = 192 * 1024


class HeldStatusWrites(HubActivities):
    """Once `hold` is called, the next status write waits for the event it returns, and the write
    after that one opens `ended` a moment after it ended (its result is with the SDK by then)."""

    held: ClassVar[asyncio.Event | None] = None
    holding: ClassVar[asyncio.Event] = asyncio.Event()
    ended: ClassVar[threading.Event | None] = None

    @classmethod
    def hold(cls, ended: threading.Event) -> asyncio.Event:
        cls.holding.clear()
        cls.ended = ended
        release = cls.held = asyncio.Event()
        return release

    @activity.defn(name=HubActivity.PUBLISH_ORDER_STATUS.value)
    async def publish_order_status(self, input: PublishStatusInput) -> PublishStatusResult:
        cls = type(self)
        release, cls.held = cls.held, None
        if release is not None:
            cls.holding.set()
            await release.wait()
            return await super().publish_order_status(input)
        result = await super().publish_order_status(input)
        ended, cls.ended = cls.ended, None
        if ended is not None:
            # The result goes to the SDK as this returns: the query's answer must come after it.
            asyncio.get_running_loop().call_later(0.05, ended.set)
        return result


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    env = await start_dev_server(
        "--dynamic-config-value", f"limit.historySize.suggestContinueAsNew={SUGGEST_AFTER_BYTES}"
    )
    try:
        async with running_stack(
            env.client, tmp_path_factory.mktemp("decided"), in_process_worker=False
        ) as running:
            config = running.client.config()
            config["interceptors"] = [*config["interceptors"], held_queries.QueriesAfterWrites()]
            worker_client = Client(**config)
            async with open_backends(running.settings) as backends:
                backends.hub = HeldStatusWrites(backends.kube)
                async with contextlib.AsyncExitStack() as workers:
                    for worker in build_workers(worker_client, running.settings, backends):
                        await workers.enter_async_context(worker)
                    yield running
    finally:
        await env.shutdown()


def _task_starts(events: list[HistoryEvent]) -> list[HistoryEvent]:
    return [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED]


async def _quiet(handle: WorkflowHandle[ClusterWorkersWorkflow, ClusterWorkersStatus]) -> tuple[str, int]:
    """The latest run's id and history size, once no workflow task of it is pending."""

    async def probe() -> tuple[str, int] | None:
        described = (await handle.describe()).raw_description
        if described.HasField("pending_workflow_task"):
            return None
        info = described.workflow_execution_info
        return info.execution.run_id, info.history_size_bytes

    return await eventually(probe, f"{handle.id} quiet")


def _reports(ready: WorkerStatus, padding: int) -> WorkerReports:
    """An unnumbered report of the Ready worker as it is (taken: a status write), and a report of a
    slot the order does not have, `padding` bytes long (ignored, kept nowhere)."""
    return WorkerReports(
        reports=[
            WorkerReport(status=ready.model_copy(update={"name": "x" * padding})),
            WorkerReport(status=ready),
        ]
    )


async def _write_answering_a_query(
    stack: Stack, order: OrderRef, ready: WorkerStatus, padding: int
) -> tuple[str, int, int, int] | None:
    """Make the order's run write its status in a task (W) that answers a query, the write's result
    in before the answer: a write is held while a second one's signal and a status query arrive,
    which the server hands to the next task together, and the query's answer waits for the second
    write. The SDK then records the write's result with W and forces a task (F) to take it. Returns
    the run, its size before, and the sizes W and F began at; None if that is not how it went."""
    handle = stack.api.handle(order)
    run_id, before = await _quiet(handle)
    ended = held_queries.query_waits_for = threading.Event()
    try:
        release = HeldStatusWrites.hold(ended)
        await handle.signal(ClusterWorkersWorkflow.worker_reports, _reports(ready, 0))
        await asyncio.wait_for(HeldStatusWrites.holding.wait(), 60)
        await handle.signal(ClusterWorkersWorkflow.worker_reports, _reports(ready, padding))
        query = asyncio.ensure_future(handle.query(ClusterWorkersWorkflow.status))
        # The query must reach the server while the held write's task runs; whether it did is read
        # from the history below, and the caller tries again if not.
        await asyncio.sleep(0.5)
        release.set()
        await query
        await _quiet(handle)
    finally:
        held_queries.query_waits_for = None
        HeldStatusWrites.ended = None
    history = await stack.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
    starts = _task_starts(list(history.events))
    if len(starts) < 3:
        return None
    # The last two tasks of the run since: a run continued as new in F ends with F.
    task, forced = starts[-2], starts[-1]
    # F: scheduled right after W's completion and its status write's marker, with no event.
    between = [e.event_type for e in history.events if task.event_id < e.event_id < forced.event_id - 1]
    if between != [EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, EventType.EVENT_TYPE_MARKER_RECORDED]:
        return None
    return (
        run_id,
        before,
        task.workflow_task_started_event_attributes.history_size_bytes,
        forced.workflow_task_started_event_attributes.history_size_bytes,
    )


async def test_a_status_write_answering_a_query_does_not_decide_a_continue_as_new(stack: Stack) -> None:
    order = await stack.create_order({"bm-standard": 1})
    # Nothing wakes the Ready order but the test.
    await stack.apply(order, {"bm-standard": 1}, stack.with_policy(ready_host_check=timedelta(hours=1)))
    (ready,) = (await stack.wait_ready(order, 1)).workers
    handle = stack.api.handle(order)

    # A first write answering a query measures what the steps add: the size W begins at above the
    # size before and the padding, and what F begins at above W.
    measured = None
    for _ in range(10):
        measured = await _write_answering_a_query(stack, order, ready, padding=1)
        if measured is not None:
            break
    assert measured is not None, "no status write answered a query in its task"
    _, before, task_began, forced_began = measured
    to_task, to_forced = task_began - before - 1, forced_began - task_began

    # Again, padded so that W begins below the size the server suggests continuing as new at and
    # F at or past it: the suggestion first comes with F, a task replay does not see.
    landed = None
    for _ in range(10):
        run_id, before = await _quiet(handle)
        padding = SUGGEST_AFTER_BYTES - before - to_task - to_forced // 2
        if padding <= 0:  # a try that went otherwise left the run past the size: start a new one
            await order_run_continued_as_new(stack, order, run_id, ready)
            continue
        landed = await _write_answering_a_query(stack, order, ready, padding)
        if landed is not None and landed[2] < SUGGEST_AFTER_BYTES <= landed[3]:
            break
        landed = None  # not that structure, or not those sizes (a task more on a loaded machine)
    assert landed is not None, "no padded status write answered a query in its task at that size"
    run_id = landed[0]

    # Not in F: at the next event the history keeps.
    await order_run_continued_as_new(stack, order, run_id, ready)
    closed = await stack.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
    await replay_clean([closed])
    assert ClusterPatch.CONTINUE_AS_NEW_ON_RECORDED_EVENTS.value in patches_recorded(closed)
    assert (await stack.wait_ready(order, 1)).ready_workers == 1
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    await replay_clean(await stack.histories(order))


async def test_an_idle_order_whose_status_writes_keep_failing_still_continues_as_new(stack: Stack) -> None:
    """A hub failing the status writes (a 500, retried) grows an idle order's history by each
    retry's timer, and nothing else happens in its run. The run decides to continue as new only
    where its history keeps an event, and an attempt of a local activity retried by the SDK is none
    it sees: a write now returns to the order's workflow after STATUS_WRITE_ATTEMPTS, which tries
    again after a timer of its own and looks at the suggestion there. Before, the run waited for a
    command or a report, for days up to the server's history limit (found by review)."""
    api = stack.with_policy(ready_host_check=timedelta(hours=1), call_timeout=timedelta(seconds=5))
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    (ready,) = (await stack.wait_ready(order, 1)).workers
    handle = stack.api.handle(order)
    run_id, before = await _quiet(handle)
    failing = {"errors": [{"code": 500, "verbs": ["patch"], "resources": ["clusterorders/status"]}]}
    (await stack.hub_http.put("/lab/v1/faults/api", json=failing)).raise_for_status()
    try:
        # A status change the hub will not take (an unnumbered report of the worker, a count
        # changed), with a report the order ignores padding the run to a little below the size
        # the server suggests continuing as new at: only the write's retries take it past.
        changed = ready.model_copy(update={"attempt_count": ready.attempt_count + 1})
        padding = SUGGEST_AFTER_BYTES - before - 2560
        reports = [*_reports(ready, padding).reports[:1], WorkerReport(status=changed)]
        await handle.signal(ClusterWorkersWorkflow.worker_reports, WorkerReports(reports=reports))

        async def continued() -> bool:
            return (await handle.describe()).run_id != run_id

        await eventually(continued, "the run continuing as new while its status writes fail", timeout=240)
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    history = await stack.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
    events = list(history.events)
    # The last thing sent to the run was the report, taken below the size: nothing it was sent
    # decided the continue-as-new.
    sent = [
        e.event_id
        for e in events
        if e.HasField("workflow_execution_signaled_event_attributes")
        or e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    (took_the_report,) = [e for e in _task_starts(events) if e.event_id > sent[-1]][:1]
    assert not took_the_report.workflow_task_started_event_attributes.suggest_continue_as_new
    await replay_clean([history])
    await stack.wait_ready(order, 1)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


class _Pending:
    """An awaitable that never ends: a call in flight when its run is evicted."""

    def __await__(self) -> Generator[None, None, None]:
        yield


def test_a_call_closed_with_its_evicted_run_looks_at_no_workflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run evicted from the worker's cache has its coroutines closed (GeneratorExit) outside the
    workflow's event loop: a call in flight then must not look at the continue-as-new suggestion
    (`workflow.info()` there raised, logged as an exception ignored in the coroutine)."""
    from workflows import cluster_workers

    async def never_ends(*args: object, **kwargs: object) -> None:
        await _Pending()

    monkeypatch.setattr(cluster_workers, "call_activity", never_ends)
    run = cluster_workers.ClusterWorkersWorkflow.__new__(cluster_workers.ClusterWorkersWorkflow)
    run._input = SimpleNamespace(policy=None)  # type: ignore[assignment]
    run._history_limit = ContinueAsNewDue()
    run._history_limit.decide(True)
    call: Coroutine[Any, Any, None] = run._call("read_order", None, None, summary="Read the order")
    call.send(None)  # in flight
    call.close()  # raised _NotInWorkflowEventLoopError from the look before
