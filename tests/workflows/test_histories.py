"""Histories: no secret ever reaches one, and recorded histories replay clean on the current code
while a changed workflow fails replay."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from contracts.activities import BmaasActivity, HubActivity
from contracts.worker import WorkerPhase, WorkerReport
from contracts.workflows import cluster_workflow_id
from tests.workflows.changed_workflow import ReorderedWorkerNodeWorkflow
from tests.workflows.stack import (
    PULL_SECRET,
    Stack,
    delivered_reports,
    eventually,
    patches_recorded,
    replay_clean,
    running_stack,
    scheduled_activities,
    signal_payloads,
)
from workflows.cluster_workers import ClusterPatch
from workflows.worker_node import WorkerPatch

HISTORIES = Path(__file__).parent / "histories"
REGRESSIONS = HISTORIES / "regressions"
RECORD = os.environ.get("OSAC_RECORD_HISTORIES") == "1"


@pytest.fixture(scope="module")
async def lifecycle(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Stack, list[WorkflowHistory], list[str]]]:
    """One order through scale-up, a targeted scale-down and decommission; its closed histories."""
    async with running_stack(temporal_env.client, tmp_path_factory.mktemp("histories")) as stack:
        # Agents register a little after the worker starts waiting, so the wait's heartbeats and
        # the hand-off that follows the registration are in the histories.
        await stack.set_agent_faults({"slow_registration": {"rate": 1.0, "extra_delay_s": 2.0}})
        order = await stack.create_order({"bm-standard": 2})
        await stack.apply(order, {"bm-standard": 2})
        await stack.wait_ready(order, 2)
        await stack.clear_agent_faults()
        infraenv = (await stack.infraenvs(order.namespace))[0]
        ignition_url = infraenv["status"]["bootArtifacts"]["discoveryIgnitionURL"]
        ignition = (await stack.hub_http.get(ignition_url)).text
        await stack.api.scale_down_worker(order, order.worker_name(0))
        # The same count again (as the controller sends for an edit of other fields): the InfraEnv
        # is brought in line with the order, so that path is in the histories too.
        await stack.apply(order, {"bm-standard": 1})

        async def infraenv_refreshed() -> bool:
            handle = stack.client.get_workflow_handle(cluster_workflow_id(order))
            scheduled = scheduled_activities((await handle.fetch_history()).events)
            return scheduled.count(HubActivity.ENSURE_INFRAENV) == 2

        await eventually(infraenv_refreshed, "the InfraEnv brought in line after the second command")
        await stack.decommission_and_wait(order)

        query = f"OsacClusterOrder = '{order.key}'"

        async def all_closed() -> bool:
            found = [e async for e in stack.client.list_workflows(query)]
            return len(found) >= 3 and all(e.close_time is not None for e in found)

        await eventually(all_closed, "every workflow of the order closed")
        histories = await stack.histories(order)
        secrets = [
            PULL_SECRET,
            base64.b64encode(b"robot:sup3r-s3cret-pull").decode(),
            "sup3r-s3cret",
            stack.fulfillment.admin_token,
            stack.lab.hub.token,
            stack.lab.hub.controller_token,
            ignition_url,
            ignition[:200],
            "PULL_SECRET_TOKEN",
            "api_key=",
        ]
        yield stack, histories, secrets


async def test_no_secret_in_any_history(lifecycle: tuple[Stack, list[WorkflowHistory], list[str]]) -> None:
    _, histories, secrets = lifecycle
    kinds = {h.workflow_id.split("/")[0] for h in histories}
    assert kinds == {"cluster-workers", "worker"}
    for history in histories:
        text = history.to_json()
        # Payloads are base64 JSON inside the history JSON: scan both the raw and decoded forms.
        decoded = _decoded_payloads(text)
        for secret in secrets:
            assert secret not in text, f"a secret leaked into {history.workflow_id}"
            assert secret not in decoded, f"a secret leaked into a payload of {history.workflow_id}"


async def test_workers_wait_for_their_agent_and_hand_it_over_in_one_activity(
    lifecycle: tuple[Stack, list[WorkflowHistory], list[str]],
) -> None:
    """No timer, signal or workflow task between the Agent's registration and its approval: the
    wait and the hand-off are one activity (WorkerRevision.AGENT_HANDED_IN_WAIT)."""
    _, histories, _ = lifecycle
    workers = [h for h in histories if h.workflow_id.startswith("worker/")]
    assert len(workers) == 2
    for history in workers:
        scheduled = scheduled_activities(history.events)
        assert scheduled[2:4] == [HubActivity.WAIT_AGENT_AND_HAND, HubActivity.WAIT_AGENT_INSTALLED], (
            history.workflow_id,
            scheduled,
        )
        assert HubActivity.HAND_AGENT_TO_NODEPOOL not in scheduled
        signals = {
            e.workflow_execution_signaled_event_attributes.signal_name
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        }
        assert signals == {"scale_down"}, (history.workflow_id, signals)
        assert not [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]


async def test_workers_report_through_their_activities(
    lifecycle: tuple[Stack, list[WorkflowHistory], list[str]],
) -> None:
    """A worker's history holds none of its status reports: the activities that start and end its
    phases deliver them, numbered, and the cluster workflow hears every phase of every worker."""
    _, histories, _ = lifecycle
    workers = [h for h in histories if h.workflow_id.startswith("worker/")]
    for history in workers:
        sent = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
        ]
        assert sent == [], history.workflow_id
    cluster = next(h for h in histories if h.workflow_id.startswith("cluster-workers/"))
    assert signal_payloads(cluster, "worker_report") == []
    heard: dict[str, list[WorkerReport]] = {}
    for report in delivered_reports(cluster):
        heard.setdefault(report.status.name, []).append(report)
    assert len(heard) == 2
    for name, reports in heard.items():
        phases = [r.status.phase for r in reports]
        assert phases == [
            WorkerPhase.WAITING_FOR_AGENT,
            WorkerPhase.BINDING,
            WorkerPhase.READY,
            WorkerPhase.UNBINDING,
            WorkerPhase.DELETING,
            WorkerPhase.DELETING,
        ], (name, phases)
        assert [r.deleted for r in reports] == [False] * 5 + [True]
        assert [r.sequence for r in reports] == list(range(1, 7)), name


async def test_the_cluster_status_is_written_by_local_activities(
    lifecycle: tuple[Stack, list[WorkflowHistory], list[str]],
) -> None:
    """Each ClusterOrder status write is one marker in the cluster workflow's history: no activity
    events, and none of the workers' statuses it carries."""
    _, histories, _ = lifecycle
    cluster = next(h for h in histories if h.workflow_id.startswith("cluster-workers/"))
    assert HubActivity.PUBLISH_ORDER_STATUS.value not in scheduled_activities(cluster.events)
    local = [
        json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)["activity_type"]
        for e in cluster.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    assert local and set(local) == {HubActivity.PUBLISH_ORDER_STATUS.value}


async def test_an_order_that_never_continued_as_new_never_looks_up_earlier_workers(
    lifecycle: tuple[Stack, list[WorkflowHistory], list[str]],
) -> None:
    """Only the workers of an earlier run of the order are looked up. The lifecycle's order never
    continued as new, so its run never woke the look (its patch is the first thing it records): a
    worker whose start is not yet confirmed is this run's, not an earlier one's."""
    _, histories, _ = lifecycle
    cluster = next(h for h in histories if h.workflow_id.startswith("cluster-workers/"))
    patches = patches_recorded(cluster)
    assert ClusterPatch.TERMINATED_WORKERS_RESTARTED.value in patches
    assert ClusterPatch.EARLIER_WORKERS_LOOKED_AFTER.value not in patches


async def test_installed_workers_are_not_swept_again_after_their_wipe(
    lifecycle: tuple[Stack, list[WorkflowHistory], list[str]],
) -> None:
    """Only a host that may still run the discovery image registers again before its wipe: the
    lifecycle's workers were installed, so their releases add nothing after the wipe."""
    _, histories, _ = lifecycle
    for history in (h for h in histories if h.workflow_id.startswith("worker/")):
        patches = patches_recorded(history)
        assert WorkerPatch.REGISTRATIONS_SWEPT_AFTER_WIPE.value not in patches, history.workflow_id
        scheduled = scheduled_activities(history.events)
        assert scheduled[-1] == BmaasActivity.WAIT_INSTANCE_GONE, (history.workflow_id, scheduled)


async def test_status_changes_are_written_without_waiting_on_a_timer(
    lifecycle: tuple[Stack, list[WorkflowHistory], list[str]],
) -> None:
    """OSAC's default `status_coalesce` (0) writes a change at once; changes arriving meanwhile go in
    the next write. A window would be a timer, and the server holds timers shorter than a second
    (its `history.timerProcessorMaxTimeShift`) for that second."""
    _, histories, _ = lifecycle
    cluster = next(h for h in histories if h.workflow_id.startswith("cluster-workers/"))
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in cluster.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    assert all(t >= timedelta(seconds=1) for t in timers), timers
    writes = sum(
        1
        for e in cluster.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    )
    assert writes >= 4  # Provisioning, Ready, a worker leaving, and the end at least


async def test_live_histories_replay_clean(lifecycle: tuple[Stack, list[WorkflowHistory], list[str]]) -> None:
    _, histories, _ = lifecycle
    await replay_clean(histories)
    if RECORD:
        HISTORIES.mkdir(exist_ok=True)
        for history in histories:
            kind = history.workflow_id.split("/")[0]
            (HISTORIES / f"{kind}.json").write_text(history.to_json())


def _recorded() -> list[WorkflowHistory]:
    """The current code's histories, and those started by earlier releases, which workflows still
    running at an upgrade have: revision-1 (WorkerRevision.SIGNALLED_REPORTS), revision-2
    (ACTIVITY_REPORTS, before the cluster workflow's `ClusterPatch`es), revision-2-patched
    (ACTIVITY_REPORTS, with them), revision-3-before-security-groups (AGENT_HANDED_IN_WAIT, with
    the patches up to ready-hosts-checked), revision-3-before-leavers-looked-after (recorded on
    63ed246, before the patch stopped-leavers-restarted),
    revision-3-before-continue-as-new-on-recorded-events (recorded on 36fd7ec, which read the
    server's continue-as-new suggestion live) and revision-3-before-status-writes-paced (recorded on
    9c977c8, before the patch status-writes-paced)."""
    files = sorted(f for f in HISTORIES.glob("**/*.json") if REGRESSIONS not in f.parents)
    names = {str(f.relative_to(HISTORIES).with_suffix("")) for f in files}
    prefixes = (
        "",
        "revision-1/",
        "revision-2/",
        "revision-2-patched/",
        "revision-3-before-security-groups/",
        "revision-3-before-leavers-looked-after/",
        "revision-3-before-continue-as-new-on-recorded-events/",
        "revision-3-before-status-writes-paced/",
    )
    expected = {f"{prefix}{kind}" for prefix in prefixes for kind in ("cluster-workers", "worker")}
    assert names == expected, "recorded histories are missing"
    return [
        WorkflowHistory.from_json(f"recorded/{f.relative_to(HISTORIES).with_suffix('')}", f.read_text())
        for f in files
    ]


async def test_recorded_histories_replay_clean() -> None:
    await replay_clean(_recorded())


async def test_histories_of_states_the_lifecycle_does_not_reach_replay_clean() -> None:
    """Histories recorded on earlier code in a state the recorded lifecycle never passes through
    (`regressions/`, named after it): a decommission while the order named no release and no NodePool
    had one yet (recorded on 8e6b029 with stand-in activities; it read the order after the wait); a
    run whose status write the hub refused, retried inside the workflow task until the run continued
    as new past it (recorded on 8ae76b1; the retries now wait on timers); an order whose release had
    no boot image, looked for again and again until one was linked (recorded on 13a70de; each look
    now reads the order first); workers cancelled from outside, one while it waited for its Agent and
    one Ready (recorded on 87a495c; the run ended Canceled, with its host, where a cancel is now a
    scale-down); an order whose pull secret was refused, its Secret deleted, then removed, set again
    and removed again (recorded on 476a29c; the refresh's PullSecretMissing changed nothing then,
    and is shown now); the restarted release of a worker terminated after its host's Agent
    registered (recorded on 21077d4; the release now lists the slot's BMIs before it deletes the
    Agents); an order's run after a continue-as-new, its worker terminated before Ready (recorded on
    996e8e6; such a worker is now looked up after a quiet `ready_host_check`); a worker scaled down
    while its host's Agent was registered but not handed over (recorded on 8bb6bc5; the release now
    sweeps the host's registrations again after the wipe); an order whose Ready worker was cancelled
    from outside (recorded on d932d1a with the replacement as it was: once the release ended; it now
    starts at the first leaving report); an order whose new security groups BMaaS refused once
    (recorded on b0a79fd, where that refusal counted as done; they are now shown and put again).
    Without their patch guards, the last six fail to replay. And a worker whose create BMaaS
    answered with 503 until it ran out of its attempts, reported, and was made again, with its
    order showing FulfillmentServiceUnavailable (recorded on 93a8bd2, where that path began). And an
    order whose Ready workers' hosts broke or were deleted, with its broken worker, from before a
    lost host's worker left as a scale-down does (recorded on 4073a3f: it failed and came back in its
    slot); without patches lost-host-leaves and lost-hosts-replaced-by-new-workers, both fail. And
    an order whose status writes the hub failed with 500 from a scale-up to its decommission's end
    (recorded on 9c977c8: a round of attempts every 90 s, the last write given up untried while
    the publisher slept); without patch status-writes-paced it fails. And a worker scaled down while
    BMaaS was asked about its Agent's extra NIC (recorded on 4b1f598: it handed the Agent over on its
    way out); without patch stop-after-nic-check it fails."""
    files = sorted(REGRESSIONS.glob("*.json"))
    assert files
    await replay_clean(WorkflowHistory.from_json(f"regression/{f.stem}", f.read_text()) for f in files)


async def test_changed_workflow_fails_replay() -> None:
    worker_history = next(h for h in _recorded() if h.workflow_id == "recorded/worker")
    replayer = Replayer(workflows=[ReorderedWorkerNodeWorkflow], data_converter=pydantic_data_converter)
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(worker_history)


def _decoded_payloads(history_json: str) -> str:
    out: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, str) and "metadata" in node:
                try:
                    out.append(base64.b64decode(data).decode("utf-8", "replace"))
                except ValueError:
                    pass
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(history_json))
    return "\n".join(out)
