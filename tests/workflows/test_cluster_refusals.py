"""Requests the hub refuses for good (401/403, non-retryable) at the edges of an order's life, a
worker id already taken by a run the order did not start, and a node set whose instance type BMaaS
withdrew: none may fail the order's workflow, which would keep its hosts (and a deleting order's
finalizer) until an operator looked."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import ClassVar

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.assisted import AssistedActivities
from activities.hub import HubActivities
from contracts.activities import HubActivity
from contracts.hub import (
    DeleteInfraEnvResult,
    HubErrorType,
    InfraEnvReady,
    InfraEnvRef,
    PublishStatusInput,
    PublishStatusResult,
    WaitClusterReferenceInput,
)
from contracts.refs import ClusterReference, OrderRef
from contracts.workflows import ClusterWorkersStatus, NodeSetRequest, worker_workflow_id
from starter.api import CommandError, WorkersApi
from tests.workflows.stack import (
    AGENT_API,
    INSTANCE_TYPES,
    Stack,
    eventually,
    replay_clean,
    running_stack,
    timer_started,
)
from worker.main import build_workers, open_backends
from workflows.activity_calls import call_backoff
from workflows.cluster_workers import (
    FAILED_STATUS_WRITE_PAUSE,
    FAILED_STATUS_WRITE_PAUSE_SUMMARY,
    STATUS_COALESCE_SUMMARY,
    STATUS_FLUSH_GIVE_UP,
    STATUS_WRITE_ATTEMPTS,
    ClusterPatch,
)

REFUSED = "RequestRefused"


def _forbidden(what: str) -> ApplicationError:
    """What activities/kube.py raises for a 403: non-retryable HubForbidden."""
    return ApplicationError(
        f"hub refused {what}: 403 Forbidden", type=HubErrorType.FORBIDDEN.value, non_retryable=True
    )


class Refusals:
    """Which orders (by key) the hub refuses what for, and how often it did."""

    cluster_reference: ClassVar[set[str]] = set()
    infraenv_ready: ClassVar[set[str]] = set()
    infraenv_delete: ClassVar[set[str]] = set()
    status_write: ClassVar[set[str]] = set()
    counts: ClassVar[Counter[tuple[HubActivity, str]]] = Counter()

    @classmethod
    def check(cls, refused: set[str], kind: HubActivity, order: OrderRef) -> None:
        if order.key in refused:
            cls.counts[(kind, order.key)] += 1
            raise _forbidden(kind.value)


class RefusingHub(HubActivities):
    @activity.defn(name=HubActivity.WAIT_CLUSTER_REFERENCE.value)
    async def wait_cluster_reference(self, input: WaitClusterReferenceInput) -> ClusterReference:
        Refusals.check(Refusals.cluster_reference, HubActivity.WAIT_CLUSTER_REFERENCE, input.order)
        return await super().wait_cluster_reference(input)

    @activity.defn(name=HubActivity.PUBLISH_ORDER_STATUS.value)
    async def publish_order_status(self, input: PublishStatusInput) -> PublishStatusResult:
        Refusals.check(Refusals.status_write, HubActivity.PUBLISH_ORDER_STATUS, input.order)
        return await super().publish_order_status(input)


class RefusingAssisted(AssistedActivities):
    @activity.defn(name=HubActivity.WAIT_INFRAENV_READY.value)
    async def wait_infraenv_ready(self, ref: InfraEnvRef) -> InfraEnvReady:
        Refusals.check(Refusals.infraenv_ready, HubActivity.WAIT_INFRAENV_READY, ref.order)
        return await super().wait_infraenv_ready(ref)

    @activity.defn(name=HubActivity.DELETE_INFRAENV.value)
    async def delete_infraenv(self, ref: InfraEnvRef) -> DeleteInfraEnvResult:
        Refusals.check(Refusals.infraenv_delete, HubActivity.DELETE_INFRAENV, ref.order)
        return await super().delete_infraenv(ref)


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with running_stack(
        temporal_env.client, tmp_path_factory.mktemp("refusals"), in_process_worker=False
    ) as running:
        async with open_backends(running.settings) as backends:
            backends.hub = RefusingHub(backends.kube)
            backends.assisted = RefusingAssisted(backends.kube, backends.ignition_http)
            async with contextlib.AsyncExitStack() as workers:
                for worker in build_workers(running.client, running.settings, backends):
                    await workers.enter_async_context(worker)
                yield running


async def _running(stack: Stack, order: OrderRef) -> None:
    """The order's workflow must never stop on its own: fail at once rather than at a deadline."""
    description = await stack.api.handle(order).describe()
    assert description.status == WorkflowExecutionStatus.RUNNING, (
        f"the workflow of {order.key} is {description.status!r}, not running"
    )


async def _ready(stack: Stack, order: OrderRef, ready: int, timeout: float = 120.0) -> ClusterWorkersStatus:
    async def probe() -> ClusterWorkersStatus | None:
        await _running(stack, order)
        status = await stack.api.status(order)
        return status if status.ready_workers == ready and status.current_workers == ready else None

    return await eventually(probe, f"{ready} ready workers of {order.key}", timeout)


async def _replays_as_it_ran(stack: Stack, order: OrderRef, patch: ClusterPatch) -> None:
    """The order's (closed) workflow took the new path behind `patch`, and its history replays."""
    history = await stack.api.handle(order).fetch_history()
    markers = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert any(patch.value.encode() in e.SerializeToString() for e in markers), f"no {patch.value} marker"
    await replay_clean([history])


async def _refusal_shown_and_asked_again(stack: Stack, order: OrderRef, kind: HubActivity) -> None:
    async def probe() -> bool:
        await _running(stack, order)
        shown = await stack.order_condition(order, "InfraEnvReady")
        asked = Refusals.counts[(kind, order.key)]
        return shown is not None and shown["status"] == "False" and shown["reason"] == REFUSED and asked >= 2

    await eventually(probe, f"InfraEnvReady=False/{REFUSED} on {order.key} and {kind.value} asked again")


@pytest.mark.parametrize(
    ("refused", "wait"),
    [
        ("cluster_reference", HubActivity.WAIT_CLUSTER_REFERENCE),
        ("infraenv_ready", HubActivity.WAIT_INFRAENV_READY),
    ],
)
async def test_a_refused_wait_while_the_order_prepares_is_shown_and_asked_again(
    stack: Stack, refused: str, wait: HubActivity
) -> None:
    """The hub answers the wait for the order's hosted cluster, or for its first discovery image,
    with a 403: the order shows the refusal, the wait is made again after `prerequisite_recheck`,
    and once the hub answers the order's workers come up."""
    order = await stack.create_order({"bm-standard": 1})
    refusing: set[str] = getattr(Refusals, refused)
    refusing.add(order.key)
    try:
        await stack.apply(order, {"bm-standard": 1})
        await _refusal_shown_and_asked_again(stack, order, wait)
    finally:
        refusing.discard(order.key)
    status = await _ready(stack, order, 1)
    assert [c.reason for c in status.conditions if c.type == "InfraEnvReady"] == ["ImageCreated"]
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    await _replays_as_it_ran(stack, order, ClusterPatch.HUB_WAIT_REFUSALS_ASKED_AGAIN)


async def test_a_refused_wait_for_a_recreated_infraenvs_image_is_shown_and_asked_again(stack: Stack) -> None:
    """The InfraEnv is deleted behind our back and created again on the next command; the hub
    refuses the wait for its new image. The wait beside the main loop must not die with the
    refusal (nobody awaits it): it shows it, asks again, and the image is seen once the hub answers."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await _ready(stack, order, 1)
    Refusals.infraenv_ready.add(order.key)
    try:
        name = InfraEnvRef.for_order(order).name
        deleted = await stack.hub_http.delete(f"{AGENT_API}/namespaces/{order.namespace}/infraenvs/{name}")
        deleted.raise_for_status()
        await stack.apply(order, {"bm-standard": 1})  # the next command creates it again
        await _refusal_shown_and_asked_again(stack, order, HubActivity.WAIT_INFRAENV_READY)
    finally:
        Refusals.infraenv_ready.discard(order.key)

    async def image_seen() -> bool:
        await _running(stack, order)
        shown = await stack.order_condition(order, "InfraEnvReady")
        return shown is not None and shown["status"] == "True" and shown["reason"] == "ImageCreated"

    await eventually(image_seen, "InfraEnvReady=True/ImageCreated after the hub answered")
    await stack.apply(order, {"bm-standard": 2})  # a host booted from the new image
    await _ready(stack, order, 2)
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
    await _replays_as_it_ran(stack, order, ClusterPatch.HUB_WAIT_REFUSALS_ASKED_AGAIN)


async def test_a_worker_id_held_by_a_run_the_order_did_not_start_is_skipped(stack: Stack) -> None:
    """`worker/<ns>/<order>/<order>-worker-0` still runs (a worker of an earlier run of the order
    still finishing, a `temporal workflow reset`) when the order starts afresh from slot 0: that
    slot is skipped, never adopted, and the order gets its workers on the next indices. The run
    holding the id is told to leave (an abandoned worker would otherwise hold its host for ever)."""
    order = await stack.create_order({"bm-standard": 2})
    taken = order.worker_name(0)
    # Any long-running workflow under that id: one nobody polls for stays running, and only ever
    # gets the signal.
    foreign = await stack.client.start_workflow(
        "ForeignWorker",
        id=worker_workflow_id(order, taken),
        task_queue=f"{stack.settings.task_queue}-nobody",
    )
    try:
        await stack.apply(order, {"bm-standard": 2})
        status = await _ready(stack, order, 2)
        names = sorted(w.name for w in status.workers)
        assert taken not in names and len(names) == 2, names
        assert len(await stack.bmis(order)) == 2
        final = await stack.decommission_and_wait(order)
        assert final.finished and final.workers == []
        assert await stack.bmis(order) == []
        description = await foreign.describe()
        assert description.status == WorkflowExecutionStatus.RUNNING
        assert description.run_id == foreign.result_run_id
        touched = [
            (e.event_type, e.workflow_execution_signaled_event_attributes.signal_name)
            for e in (await foreign.fetch_history()).events
            if e.event_type
            not in (
                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
            )
        ]
        assert touched == [(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, "scale_down")]
    finally:
        await foreign.terminate(reason="test cleanup")
    assert await stack.audit_violations() == []
    await _replays_as_it_ran(stack, order, ClusterPatch.TAKEN_WORKER_IDS_SKIPPED)


async def test_an_infraenv_delete_refused_at_the_end_of_a_decommission_still_ends_it(stack: Stack) -> None:
    """Every host is wiped; the hub then refuses the InfraEnv's delete (403). The InfraEnv is
    owner-referenced by the ClusterOrder and goes with it: the workflow completes."""
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await _ready(stack, order, 1)
    Refusals.infraenv_delete.add(order.key)
    try:
        final = await stack.decommission_and_wait(order, timeout=120)
    finally:
        Refusals.infraenv_delete.discard(order.key)
    assert final.finished and final.workers == []
    assert Refusals.counts[(HubActivity.DELETE_INFRAENV, order.key)] == 1
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
    await _replays_as_it_ran(stack, order, ClusterPatch.DECOMMISSION_ENDS_PAST_REFUSALS)


async def test_a_final_status_write_refused_at_the_end_of_a_decommission_still_ends_it(stack: Stack) -> None:
    """The hub refuses every status write from the decommission on: the last one is given up at its
    refusal and the workflow completes, instead of retrying until the history limit while the
    controller keeps the deleting order's finalizer."""
    api = stack.with_policy(call_timeout=timedelta(seconds=10))
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    await _ready(stack, order, 1)
    Refusals.status_write.add(order.key)
    try:
        await api.decommission(order)
        final = await asyncio.wait_for(api.wait_finished(order), 120)
    finally:
        Refusals.status_write.discard(order.key)
    assert final.finished and final.workers == []
    assert Refusals.counts[(HubActivity.PUBLISH_ORDER_STATUS, order.key)] >= 1
    assert await stack.bmis(order) == []
    await _replays_as_it_ran(stack, order, ClusterPatch.DECOMMISSION_ENDS_PAST_REFUSALS)
    # The last write is tried at once, though the publisher waited after an earlier refusal, and
    # its own refusal gives it up: its give-up timer never fired.
    events = list((await stack.api.handle(order).fetch_history()).events)
    (give_up,) = [e.event_id for e in events if timer_started(e, summary=STATUS_FLUSH_GIVE_UP)]
    assert [e for e in events if _failed_status_write(e) and e.event_id > give_up], (
        "the last write was not tried"
    )
    assert give_up not in _fired(events), "the refused last write was tried until its give-up timer"
    assert _publishers_timers_cancelled(events) == []


def _fired(events: list[HistoryEvent]) -> dict[int, int]:
    """The started event of each timer that fired, to the event of its firing."""
    return {
        e.timer_fired_event_attributes.started_event_id: e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED
    }


def _failed_status_write(event: HistoryEvent) -> bool:
    """An attempt of a status write that failed (the order's only local activity)."""
    return (
        event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and event.marker_recorded_event_attributes.marker_name == "core_local_activity"
        and event.marker_recorded_event_attributes.HasField("failure")
    )


async def test_a_status_write_the_hub_keeps_failing_is_made_once_a_minute_and_a_last_one_until_given_up(
    stack: Stack,
) -> None:
    """The hub answers every status write with a 500. After STATUS_WRITE_ATTEMPTS backing off, a
    write is made once a minute, not a round each time (about six requests every 90 s before).
    The decommission's last write, beginning while the publisher waits after a failure, is tried
    at once and until its give-up timer: before, the failing round counted as a refusal and gave
    it up, or the publisher's minute-long wait outlasted the give-up and it was not tried at all.
    No wait of the publisher's (a status coalesce window included), nor a retry's backoff, is a
    timer cancelled."""
    api = stack.with_policy(call_timeout=timedelta(seconds=10), status_coalesce=timedelta(seconds=1))
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1}, api)
    await _ready(stack, order, 1)
    handle = stack.api.handle(order)
    failing = {"errors": [{"code": 500, "verbs": ["patch"], "resources": ["clusterorders/status"]}]}
    (await stack.hub_http.put("/lab/v1/faults/api", json=failing)).raise_for_status()
    try:
        await stack.apply(order, {"bm-standard": 2}, api)  # status changes the hub will not take

        async def second_pause() -> list[HistoryEvent] | None:
            events = list((await handle.fetch_history()).events)
            return events if len(_minute_waits(events)) >= 2 else None

        events = await eventually(second_pause, "a second wait after a failed status write", timeout=300)
        first, second = _minute_waits(events)[:2]
        assert (
            len([e for e in events if _failed_status_write(e) and e.event_id < first])
            == STATUS_WRITE_ATTEMPTS
        )
        between = [e for e in events if _failed_status_write(e) and first < e.event_id < second]
        assert len(between) == 1, f"{len(between)} attempts between the waits after a failed write"
        await api.decommission(order)
        final = await asyncio.wait_for(api.wait_finished(order), 180)
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    assert final.finished and final.workers == []
    assert await stack.bmis(order) == []
    history = await handle.fetch_history()
    events = list(history.events)
    fired = _fired(events)
    (give_up,) = [e.event_id for e in events if timer_started(e, summary=STATUS_FLUSH_GIVE_UP)]
    assert give_up in fired, "the failing last write was given up before its timer"
    tried = [e.event_id for e in events if _failed_status_write(e) and give_up < e.event_id]
    assert len(tried) >= 2, f"the last write was tried {len(tried)} time(s) before its give-up"
    waiting = [p for p in _minute_waits(events) if p < give_up and fired.get(p, give_up + 1) > give_up]
    if waiting:  # the decommission ended while the publisher waited: that wait did not hold the write
        assert tried[0] < fired.get(waiting[-1], tried[0] + 1)
    assert _publishers_timers_cancelled(events) == []
    await _replays_as_it_ran(stack, order, ClusterPatch.STATUS_WRITES_PACED)


def _minute_waits(events: list[HistoryEvent]) -> list[int]:
    """The publisher's waits of a minute after a failed write (started events)."""
    return [
        e.event_id
        for e in events
        if timer_started(e, summary=FAILED_STATUS_WRITE_PAUSE_SUMMARY, lasting=FAILED_STATUS_WRITE_PAUSE)
    ]


def _publishers_timers_cancelled(events: list[HistoryEvent]) -> list[int]:
    """Timers cancelled that the publisher started: its waits and coalesce windows, a give-up, or a
    retry's backoff (no summary, CALL_RETRY's length, started in the task of a failed write)."""
    by_id = {e.event_id: e for e in events}
    backoffs = {call_backoff(failures) for failures in range(1, 8)}
    found = []
    for event in events:
        if event.event_type != EventType.EVENT_TYPE_TIMER_CANCELED:
            continue
        started = by_id[event.timer_canceled_event_attributes.started_event_id]
        if any(
            timer_started(started, summary=summary)
            for summary in (FAILED_STATUS_WRITE_PAUSE_SUMMARY, STATUS_COALESCE_SUMMARY, STATUS_FLUSH_GIVE_UP)
        ):
            found.append(started.event_id)
            continue
        lasting = started.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        if started.user_metadata.summary.data or lasting not in backoffs:
            continue
        before = started.event_id - 1
        while before in by_id and by_id[before].event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            if _failed_status_write(by_id[before]):
                found.append(started.event_id)
                break
            before -= 1
    return found


async def test_a_node_set_of_a_withdrawn_instance_type_can_still_be_lowered(stack: Stack) -> None:
    """BMaaS retires `bm-gpu` while an order holds two: the tenant can still lower it (and edit
    other node sets), but not raise it."""
    order = await stack.create_order({"bm-gpu": 2})
    await stack.apply(order, {"bm-gpu": 2})
    await _ready(stack, order, 2)
    catalog = [t for t in INSTANCE_TYPES if t != "bm-gpu"]

    def node_sets(counts: dict[str, int]) -> list[NodeSetRequest]:
        return [NodeSetRequest(name=k, instance_type=k, count=v) for k, v in counts.items()]

    async def apply(counts: dict[str, int], on: WorkersApi | None = None) -> ClusterWorkersStatus:
        return await (on or stack.api).apply(order, node_sets(counts), instance_types=catalog)

    with pytest.raises(CommandError, match=r"node_sets\[0\]\.instance_type: unknown instance type 'bm-gpu'"):
        await apply({"bm-gpu": 3})
    with pytest.raises(CommandError, match=r"node_sets\[1\]\.instance_type: unknown instance type 'bm-gpu'"):
        await apply({"bm-standard": 0, "bm-gpu": 3})
    assert (await stack.api.status(order)).desired_workers == 2
    lowered = await apply({"bm-gpu": 1})
    assert lowered.desired_workers == 1
    await _ready(stack, order, 1)
    # Another node set edited while the withdrawn one keeps its count.
    await apply({"bm-gpu": 1, "bm-standard": 0})
    assert (await stack.api.status(order)).desired_workers == 1
    await stack.decommission_and_wait(order)
    assert await stack.bmis(order) == []
