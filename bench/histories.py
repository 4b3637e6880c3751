"""Fetched histories, reduced to what the figures need: event counts and activity timestamps."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client


@dataclass
class ActivityCall:
    name: str
    scheduled: float
    started: float | None = None
    closed: float | None = None


@dataclass
class RunHistory:
    workflow_id: str
    run_id: str
    workflow_type: str
    events: int
    activities: list[ActivityCall] = field(default_factory=list)
    event_types: Counter[str] = field(default_factory=Counter)
    # Per workflow task: seconds waiting for a poller (scheduled -> started), and seconds the worker
    # took to answer (started -> completed).
    workflow_task_queue_s: list[float] = field(default_factory=list)
    workflow_task_run_s: list[float] = field(default_factory=list)
    # The same waits for a poller, by what made the task (the event just before its scheduling:
    # workflow_execution_started, activity_task_completed, workflow_execution_signaled, ...).
    workflow_task_queue_by_cause: dict[str, list[float]] = field(default_factory=dict)
    # Workflow tasks given to the task queue rather than to the worker holding the workflow (its
    # sticky queue): the first, then one after each eviction from the cache or sticky timeout,
    # each a replay of the whole history.
    workflow_tasks_not_sticky: int = 0


def _seconds(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


_CLOSED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}


LOCAL_ACTIVITY_MARKER = "core_local_activity"


def local_activity_call(event: HistoryEvent) -> ActivityCall | None:
    """A local activity's marker: run by the workflow's worker as soon as it is scheduled."""
    attributes = event.marker_recorded_event_attributes
    if attributes.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in attributes.details:
        return None
    data = json.loads(attributes.details["data"].payloads[0].data)
    scheduled = data.get("original_schedule_time") or {}
    completed = data.get("complete_time") or {}
    start = scheduled.get("seconds", 0) + scheduled.get("nanos", 0) / 1e9 or _seconds(event)
    end = completed.get("seconds", 0) + completed.get("nanos", 0) / 1e9 or _seconds(event)
    return ActivityCall(data["activity_type"], start, started=start, closed=max(start, end))


def reduce(workflow_id: str, run_id: str, workflow_type: str, events: list[HistoryEvent]) -> RunHistory:
    run = RunHistory(workflow_id, run_id, workflow_type, len(events))
    by_scheduled: dict[int, ActivityCall] = {}
    task_times: dict[int, float] = {}  # event id of a workflow task's schedule or start -> its time
    task_causes: dict[int, str] = {}  # event id of a workflow task's schedule -> what made it
    previous = "none"
    for event in events:
        name = EventType.Name(event.event_type)
        run.event_types[name] += 1
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            task_times[event.event_id] = _seconds(event)
            kind = event.workflow_task_scheduled_event_attributes.task_queue.kind
            if kind != TaskQueueKind.TASK_QUEUE_KIND_STICKY:
                run.workflow_tasks_not_sticky += 1
            task_causes[event.event_id] = previous
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            scheduled_id = event.workflow_task_started_event_attributes.scheduled_event_id
            scheduled_at = task_times.get(scheduled_id)
            if scheduled_at is not None:
                waited = _seconds(event) - scheduled_at
                run.workflow_task_queue_s.append(waited)
                cause = task_causes.get(scheduled_id, "none")
                run.workflow_task_queue_by_cause.setdefault(cause, []).append(waited)
            task_times[event.event_id] = _seconds(event)
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            started_at = task_times.get(event.workflow_task_completed_event_attributes.started_event_id)
            if started_at is not None:
                run.workflow_task_run_s.append(_seconds(event) - started_at)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            call = ActivityCall(
                event.activity_task_scheduled_event_attributes.activity_type.name, _seconds(event)
            )
            by_scheduled[event.event_id] = call
            run.activities.append(call)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = by_scheduled.get(event.activity_task_started_event_attributes.scheduled_event_id)
            if started is not None:
                started.started = _seconds(event)
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            local = local_activity_call(event)
            if local is not None:
                run.activities.append(local)
        elif event.event_type in _CLOSED:
            attributes = getattr(event, _CLOSED[event.event_type])
            closed = by_scheduled.get(attributes.scheduled_event_id)
            if closed is not None:
                closed.closed = _seconds(event)
        previous = name.removeprefix("EVENT_TYPE_").lower()
    return run


async def fetch_task_queue(client: Client, task_queue: str, concurrency: int = 16) -> list[RunHistory]:
    """Every run (continued-as-new runs included) of every workflow on the task queue."""
    executions = [
        (w.id, w.run_id, w.workflow_type) async for w in client.list_workflows(f"TaskQueue = '{task_queue}'")
    ]
    gate = asyncio.Semaphore(concurrency)

    async def one(workflow_id: str, run_id: str, workflow_type: str) -> RunHistory:
        async with gate:
            history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        return reduce(workflow_id, run_id, workflow_type, list(history.events))

    return list(await asyncio.gather(*(one(*e) for e in executions)))
