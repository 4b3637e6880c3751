"""Continue-as-new under a tiny history limit: state and pending commands survive new runs."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from contracts.activities import HubActivity
from contracts.refs import OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerStatus
from contracts.workflows import cluster_workflow_id, worker_workflow_id
from tests.conftest import start_dev_server
from tests.workflows.held_restarts import HoldRestartsUntilContinueAsNew
from tests.workflows.stack import (
    QUICK_RESTARTS,
    Stack,
    eventually,
    patches_recorded,
    replay_clean,
    running_stack,
    scheduled_activities,
    timer_started,
)
from workflows.cluster_workers import STATUS_FLUSH_GIVE_UP, ClusterPatch, ClusterWorkersWorkflow

# The server suggests continue-as-new past this many history events (the default is thousands).
SUGGEST_AFTER_EVENTS = 25


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    env: WorkflowEnvironment = await start_dev_server(
        "--dynamic-config-value", f"limit.historyCount.suggestContinueAsNew={SUGGEST_AFTER_EVENTS}"
    )
    try:
        async with running_stack(env.client, tmp_path_factory.mktemp("can")) as running:
            yield running
    finally:
        await env.shutdown()


async def _runs(stack: Stack, workflow_id: str) -> list[WorkflowExecutionStatus | None]:
    return [e.status async for e in stack.client.list_workflows(f"WorkflowId = '{workflow_id}'")]


async def _continues_as_new_while_its_drain_hangs(
    stack: Stack, order: OrderRef, worker: str, leave: Callable[[], Awaitable[object]]
) -> None:
    """With the worker's Agent's drain hanging, `leave` makes it release its host: its run continues
    as new twice while the release waits. The drain ends after."""
    (agent,) = [a["metadata"]["name"] for a in await stack.agents(order.namespace)]
    worker_id = worker_workflow_id(order, worker)
    await stack.set_agent_faults({"hanging_drain": {"agents": [agent]}})
    try:
        continued_before = (await _runs(stack, worker_id)).count(WorkflowExecutionStatus.CONTINUED_AS_NEW)
        await leave()

        async def continued_while_releasing() -> bool:
            runs = await _runs(stack, worker_id)
            return runs.count(WorkflowExecutionStatus.CONTINUED_AS_NEW) > continued_before + 1

        await eventually(continued_while_releasing, f"{worker} continuing as new while its drain hangs")
    finally:
        await stack.clear_agent_faults()


async def test_state_and_commands_survive_continue_as_new(stack: Stack) -> None:
    order = await stack.create_order({"bm-standard": 2})
    await stack.apply(order, {"bm-standard": 2})
    await stack.wait_ready(order, 2)
    cluster_id = cluster_workflow_id(order)
    first_run = await stack.api.run_id(order)

    # Ready workers and the cluster workflow move to fresh runs once their history passes the limit.
    async def cluster_continued() -> bool:
        runs = await _runs(stack, cluster_id)
        return WorkflowExecutionStatus.CONTINUED_AS_NEW in runs

    await eventually(cluster_continued, "the cluster workflow to continue as new")
    worker_id = worker_workflow_id(order, order.worker_name(0))

    async def worker_continued() -> bool:
        runs = await _runs(stack, worker_id)
        return WorkflowExecutionStatus.CONTINUED_AS_NEW in runs

    await eventually(worker_continued, "a Ready worker to continue as new")

    # The carried state still answers, and commands sent across run boundaries all land.
    status = await stack.api.status(order)
    assert status.ready_workers == 2 and status.desired_workers == 2
    # Following a run (as `decommission --wait` does) follows the runs it continued as.
    followed = await stack.api.run_status(order, first_run)
    assert followed.ready_workers == 2 and not followed.finished
    await stack.apply(order, {"bm-standard": 3})
    await stack.api.scale_down_worker(order, order.worker_name(0))
    expected = {order.worker_name(1), order.worker_name(2)}

    async def settled() -> bool:
        # Ready counts can match while the released worker is still Deleting: wait for it to go.
        st = await stack.api.status(order)
        return {w.name for w in st.workers} == expected and st.ready_workers == 2

    await eventually(settled, f"exactly {sorted(expected)} Ready")
    status = await stack.api.status(order)
    assert status.node_sets[0].count == 2

    final = await stack.decommission_and_wait(order)
    assert final.finished and final.workers == []
    assert (await stack.api.run_status(order, first_run)).finished  # the last run's result
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []


async def test_a_worker_of_an_earlier_run_terminated_from_outside_is_restarted_when_told(
    stack: Stack,
) -> None:
    """The order's current run sees the end only of the workers it started. One started before its
    continue-as-new and then terminated is started again when it is next told something: a named
    scale-down releases its host (wiped) through the restarted run."""
    order = await stack.create_order({"bm-standard": 2})
    await stack.apply(order, {"bm-standard": 2}, stack.with_policy(**QUICK_RESTARTS))
    before = {w.name: w.resource_id for w in (await stack.wait_ready(order, 2)).workers}
    cluster_id = cluster_workflow_id(order)

    async def cluster_continued() -> bool:
        return WorkflowExecutionStatus.CONTINUED_AS_NEW in await _runs(stack, cluster_id)

    await eventually(cluster_continued, "the cluster workflow to continue as new")
    leaving, staying = order.worker_name(0), order.worker_name(1)
    stopped_run = await stack.terminate_worker(order, leaving)
    await stack.api.scale_down_worker(order, leaving)

    async def released() -> bool:
        status = await stack.api.status(order)
        return [w.name for w in status.workers] == [staying] and status.ready_workers == 1

    await eventually(released, f"{leaving} started again and released")
    await stack.wait_restarted_run_released(order, leaving, stopped_run, before[leaving])
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []


async def test_a_worker_of_an_earlier_run_terminated_before_it_is_ready_is_found_and_replaced(
    stack: Stack,
) -> None:
    """A worker started before the order's continue-as-new, terminated while it waits for its
    Agent: the current run never sees its end. Quiet for a `ready_host_check`, it is looked up in
    Temporal, started again to release its host (wiped), and replaced; the order reaches its count
    without being told anything."""
    api = stack.with_policy(**QUICK_RESTARTS, agent_registration_timeout=timedelta(minutes=10))
    await stack.set_agent_faults({"never_register": {"rate": 1.0}})
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1}, api)
        first = order.worker_name(0)
        cluster_id = cluster_workflow_id(order)
        held = await stack.wait_worker_phase(order, first, WorkerPhase.WAITING_FOR_AGENT)

        async def cluster_continued() -> bool:
            if WorkflowExecutionStatus.CONTINUED_AS_NEW in await _runs(stack, cluster_id):
                return True
            await stack.apply(order, {"bm-standard": 1}, api)  # a command that changes nothing: events
            return False

        await eventually(cluster_continued, "the cluster workflow to continue as new")
        stopped_run = await stack.terminate_worker(order, first)
    finally:
        await stack.clear_agent_faults()
    await stack.wait_terminated_worker_replaced(
        order, first, stopped_run, held.resource_id, replacement=order.worker_name(1)
    )
    cluster_runs = [h for h in await stack.histories(order) if h.workflow_id == cluster_id]
    assert any(HubActivity.FIND_STOPPED_WORKERS in scheduled_activities(h.events) for h in cluster_runs)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []
    await replay_clean(await stack.histories(order))


async def test_a_restart_told_as_the_order_continues_as_new_is_sent_first(
    stack: Stack, tmp_path: Path
) -> None:
    """A Ready worker terminated from outside, whose host is then lost: the host check's tell finds
    it stopped and starts it again. The start is held (an interceptor) until the order's run is due
    to continue as new, and a few seconds more: the run waits for it. Had it continued as new, the
    server would have dropped the pending start, and every later run's tell the same way."""
    held_restarts = [HoldRestartsUntilContinueAsNew()]
    async with running_stack(stack.client, tmp_path, worker_interceptors=held_restarts) as held:
        order = await held.create_order({"bm-standard": 1})
        await held.apply(order, {"bm-standard": 1}, held.with_policy(**QUICK_RESTARTS))
        before = (await held.wait_ready(order, 1)).workers[0]
        stopped_run = await held.terminate_worker(order, before.name)
        broken = f"/lab/v1/baremetal_instances/{before.resource_id}/break"
        (await held.bmaas_http.post(broken)).raise_for_status()

        async def back() -> bool:
            status = await held.api.status(order)
            worker = status.workers[0]
            return status.ready_workers == 1 and worker.resource_id != before.resource_id

        await eventually(back, f"{before.name} started again and back on a new host", timeout=120)
        cluster_runs = [h for h in await held.histories(order) if h.workflow_id == cluster_workflow_id(order)]
        waited = ClusterPatch.TELLS_SENT_BEFORE_CONTINUE_AS_NEW.value
        assert any(waited in patches_recorded(h) for h in cluster_runs), "no run waited for its tell"
        latest = await held.client.get_workflow_handle(worker_workflow_id(order, before.name)).describe()
        assert latest.run_id != stopped_run
        await held.decommission_and_wait(order)
        assert await held.bmis(order) == []
        assert await held.audit_violations() == []
        await replay_clean(await held.histories(order), held_restarts)


async def test_an_order_waiting_days_for_its_boot_image_continues_as_new_and_still_waits(
    stack: Stack,
) -> None:
    """Each recheck of a missing prerequisite adds to the cluster workflow's history; a wait of
    days would reach the server's history limit, which ends the workflow. It continues as new from
    the wait instead, and the new run still waits (nothing is started) until the image is linked."""
    api = stack.with_policy(prerequisite_recheck=timedelta(seconds=0.2))
    release = "quay.io/openshift-release-dev/ocp-release:4.20.0-x86_64"
    order = await stack.create_order({"bm-standard": 1}, release_image=release)
    await stack.apply(order, {"bm-standard": 1}, api)
    cluster_id = cluster_workflow_id(order)

    async def continued_twice() -> bool:
        runs = await _runs(stack, cluster_id)
        return runs.count(WorkflowExecutionStatus.CONTINUED_AS_NEW) >= 2

    await eventually(continued_twice, "the waiting cluster workflow to continue as new")
    status = await stack.api.status(order)
    assert status.workers == [] and await stack.bmis(order) == []
    missing = next(c for c in status.conditions if c.type == "RHCOSImageNotFound")
    assert missing.status == "True"

    await stack.link_boot_image(release, "4.20.0")
    await stack.wait_ready(order, 1)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_a_hub_refusing_status_writes_does_not_hold_the_continue_as_new(stack: Stack) -> None:
    """A run due to continue as new writes its status first. A hub refusing the writes (an outage,
    a role a rollout forgot) held it there: commands were accepted and nothing acted on them until
    the server's history limit ended the run (found by review). It now continues as new past a
    refused write (a 500 here, retried for a call timeout), carrying the events, and the next run
    acts and writes the status once the hub takes it."""
    api = stack.with_policy(call_timeout=timedelta(seconds=5))  # how long a write is tried at that point
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    await stack.wait_ready(order, 1)
    cluster_id = cluster_workflow_id(order)
    refused = {"errors": [{"code": 500, "verbs": ["patch"], "resources": ["clusterorders/status"]}]}
    (await stack.hub_http.put("/lab/v1/faults/api", json=refused)).raise_for_status()
    try:
        # A change to write under the fault, in the run that answers the command.
        await stack.apply(order, {"bm-standard": 2}, api)
        run_id = (await stack.client.get_workflow_handle(cluster_id).describe()).run_id
        for _ in range(5):  # commands that change nothing, each a few events: past the limit
            await stack.apply(order, {"bm-standard": 2}, api)

        async def continued_while_refused() -> bool:
            run = stack.client.get_workflow_handle(cluster_id, run_id=run_id)
            return (await run.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW

        await eventually(continued_while_refused, "a continue-as-new while the status writes fail")
        # Each refused attempt is recorded and the next waits on a timer, so the commands above
        # went on meanwhile (retried inside the workflow task, each command waited 8-16 s).
        refused_run = stack.client.get_workflow_handle(cluster_id, run_id=run_id)
        events = [e async for e in refused_run.fetch_history_events()]
        retried_on_a_timer = [
            event
            for event, after in itertools.pairwise(events)
            if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and event.marker_recorded_event_attributes.HasField("failure")
            and after.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        ]
        assert retried_on_a_timer, "no refused status write retried on a timer"
        # The failed attempts, their timers and the write given up at the continue-as-new replay.
        replayer = Replayer(workflows=[ClusterWorkersWorkflow], data_converter=pydantic_data_converter)
        await replayer.replay_workflow(await refused_run.fetch_history())
        await stack.apply(order, {"bm-standard": 3}, api)

        async def acted() -> bool:
            return len((await stack.api.status(order)).workers) == 3

        await eventually(acted, "the scale-up acted on while the status writes fail")
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    await stack.wait_ready(order, 3)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []


async def test_a_worker_whose_drain_hangs_continues_as_new_and_still_releases_its_host(stack: Stack) -> None:
    """Each unbinding timeout of a hanging drain adds to the leaving worker's history; over weeks
    the server's limit would end the worker with its host still allocated (found by review). Its
    teardown continues as new instead, and the next run, once the drain ends, releases the host."""
    api = stack.with_policy(agent_unbinding_timeout=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    await stack.wait_ready(order, 1)
    worker = order.worker_name(0)
    await _continues_as_new_while_its_drain_hangs(
        stack, order, worker, leave=lambda: api.scale_down_worker(order, worker)
    )

    async def released() -> bool:
        return (await stack.api.status(order)).workers == [] and await stack.bmis(order) == []

    await eventually(released, f"{worker} released once the drain ended")
    await stack.decommission_and_wait(order)
    assert await stack.audit_violations() == []


async def test_a_failed_attempt_whose_release_hangs_continues_as_new_and_tries_again(stack: Stack) -> None:
    """A failed attempt releases its host before the next attempt. A release that keeps waiting (a
    drain that hangs, here after the install failed on a claimed Agent) added to the run's history
    until the server's limit ended the worker with its host still allocated (found by review). It
    continues as new; the next run finishes the release, shows the attempt's failure and tries again."""
    api = stack.with_policy(agent_unbinding_timeout=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 1})
    worker = order.worker_name(0)
    worker_id = worker_workflow_id(order, worker)
    await stack.set_agent_faults({"install_error": {"rate": 1.0}, "hanging_drain": {"rate": 1.0}})
    try:
        await stack.apply(order, {"bm-standard": 1}, api)

        async def continued_while_releasing() -> bool:
            runs = await _runs(stack, worker_id)
            return runs.count(WorkflowExecutionStatus.CONTINUED_AS_NEW) >= 2

        await eventually(continued_while_releasing, f"{worker} continuing as new while its drain hangs")
        status = await stack.api.status(order)
        assert [w.phase for w in status.workers] == [WorkerPhase.FAILED]
        first_bmi = next(b["id"] for b in await stack.bmis(order))
    finally:
        await stack.clear_agent_faults()

    async def replaced() -> WorkerStatus | None:
        status = await stack.api.status(order)
        (worker_status,) = status.workers
        return worker_status if status.ready_workers == 1 and worker_status.resource_id != first_bmi else None

    ready = await eventually(replaced, f"{worker} on a new host once the drain ended", timeout=120)
    assert ready.attempt_count == 2 and ready.last_failure_reason == FailureReason.AGENT_INSTALL_FAILED
    wiped = {r["bmi_id"] for r in await stack.audit() if r["kind"] == "WIPE_FINISHED"}
    assert first_bmi in wiped
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
    # The runs that continued mid-release, and the one that finished it, replay as they ran.
    runs = [h for h in await stack.histories(order) if h.workflow_id == worker_id]
    assert len(runs) > 2
    await replay_clean(runs)


def _answered_a_task_later(history: WorkflowHistory, marker_id: int) -> WorkflowHistory:
    """`history` as it is recorded when the local activity of marker `marker_id` completed inside
    its workflow task but the workflow saw its result only in the next one (a query answered
    meanwhile): a workflow task ends right after the marker, and what followed is that next task's."""
    data = json.loads(history.to_json())
    events: list[dict] = data["events"]
    at = next(i for i, e in enumerate(events) if int(e["eventId"]) == marker_id)
    task = {
        kind: copy.deepcopy(next(e for e in reversed(events[:at]) if e["eventType"] == f"EVENT_TYPE_{kind}"))
        for kind in ("WORKFLOW_TASK_SCHEDULED", "WORKFLOW_TASK_STARTED", "WORKFLOW_TASK_COMPLETED")
    }
    scheduled, started, completed = (str(marker_id + n) for n in (1, 2, 3))
    for event_id, event in zip((scheduled, started, completed), task.values(), strict=True):
        event["eventId"] = event_id
    task["WORKFLOW_TASK_STARTED"]["workflowTaskStartedEventAttributes"]["scheduledEventId"] = scheduled
    done = task["WORKFLOW_TASK_COMPLETED"]["workflowTaskCompletedEventAttributes"]
    done.update(scheduledEventId=scheduled, startedEventId=started)

    def shifted(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "workflowTaskCompletedEventId" and int(value) <= marker_id:
                    node[key] = completed  # a command of the next task now
                elif key.endswith("EventId") and isinstance(value, str) and int(value) > marker_id:
                    node[key] = str(int(value) + 3)
                else:
                    shifted(value)
        elif isinstance(node, list):
            for item in node:
                shifted(item)

    later = events[at + 1 :]
    for event in later:
        event["eventId"] = str(int(event["eventId"]) + 3)
        shifted({k: v for k, v in event.items() if k != "eventId"})
    data["events"] = [*events[: at + 1], *task.values(), *later]
    return WorkflowHistory.from_json(history.workflow_id, data)


async def test_a_last_status_write_seen_a_task_later_replays(stack: Stack) -> None:
    """A status query answered while a run's last status write (a local activity) runs can leave
    the write's result to the next workflow task live, while replay takes it at once. The write's
    give-up timer, cancelled on that result, was then dropped on replay (started and cancelled in
    one task) and the closed run failed to replay: "Continue as new workflow machine does not
    handle this event: TimerStarted" (seen once in a loaded full run; reproduced with the SDK by
    queries hammering such a run). The timer is now left to run out, so a run's end replays
    whichever task the result came in: here each run's history is made to look that way. (The
    write's target is fixed when it begins too, so a status change arriving with the result
    starts no other write live either; the live race that would show it cannot be forced.)"""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await stack.wait_ready(order, 1)
    cluster_id = cluster_workflow_id(order)

    async def continued() -> bool:
        return WorkflowExecutionStatus.CONTINUED_AS_NEW in await _runs(stack, cluster_id)

    await eventually(continued, "the cluster workflow to continue as new")
    await stack.decommission_and_wait(order)
    runs = [e async for e in stack.client.list_workflows(f"WorkflowId = '{cluster_id}'")]
    assert {r.status for r in runs} == {
        WorkflowExecutionStatus.CONTINUED_AS_NEW,
        WorkflowExecutionStatus.COMPLETED,
    }
    split = []
    for run in runs:
        history = await stack.client.get_workflow_handle(cluster_id, run_id=run.run_id).fetch_history()
        events = history.events
        give_up = [e.event_id for e in events if timer_started(e, summary=STATUS_FLUSH_GIVE_UP)]
        assert len(give_up) == 1, f"run {run.run_id}: give-up timers {give_up}"
        cancelled = [
            e.timer_canceled_event_attributes.started_event_id
            for e in events
            if e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED
        ]
        assert give_up[0] not in cancelled, f"run {run.run_id}: the give-up timer was cancelled"
        last_write = max(
            e.event_id
            for e in events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
        )
        assert last_write > give_up[0], f"run {run.run_id}: the last write ended before its give-up timer"
        between = [e.event_type for e in events if give_up[0] < e.event_id < last_write]
        if EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in between:
            # The write outlived its task (a loaded machine: the SDK completes a task whose local
            # activity runs long, to keep it alive): its result was seen tasks later, live.
            split.append(history)
            continue
        after = [e.event_type for e in events if e.event_id > last_write]
        if after[:-1] == [
            EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        ]:
            split.append(history)  # the race itself, recorded live (the harness's queries)
            continue
        # Nothing after the write but the run's end: the split below is the race, nothing else.
        assert len(after) == 1, after
        split.append(_answered_a_task_later(history, last_write))
    await replay_clean(split)
