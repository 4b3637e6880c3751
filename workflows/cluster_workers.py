"""ClusterWorkersWorkflow: one per ClusterOrder; owns the InfraEnv, the desired counts and the status.

Counts arrive by the `set_node_sets` update (the ClusterOrder spec is the source of truth), a named
worker leaves by the `scale_down_worker` signal, and `decommission` releases everything. Each worker
slot is a WorkerNodeWorkflow child that reports its status back by signal; the status is written to
the ClusterOrder in coalesced batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    TerminatedError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contracts.activities import BmaasActivity, HubActivity
    from contracts.bmaas import (
        ApplySecurityGroupsInput,
        BootImage,
        FindLostInstancesInput,
        LostInstance,
        LostInstances,
        ResolveBootImageInput,
        SecurityGroupsApplied,
    )
    from contracts.hub import (
        NO_PULL_SECRET,
        ClusterRelease,
        ClusterReleaseInput,
        Condition,
        ConditionStatus,
        EnsureInfraEnvResult,
        EventInput,
        EventReason,
        EventType,
        HubErrorType,
        InfraEnvReady,
        InfraEnvRef,
        NodePoolNames,
        OrderFacts,
        PublishStatusInput,
        WaitClusterReferenceInput,
    )
    from contracts.refs import ClusterReference
    from contracts.worker import FailingRequests, FailureReason, WorkerPhase, WorkerStatus
    from contracts.workflows import (
        CURRENT_WORKER_REVISION,
        LEAVING_PHASES,
        NODE_SETS_SUPERSEDED,
        ClusterWorkersCarried,
        ClusterWorkersInput,
        ClusterWorkersStatus,
        FindStoppedWorkersInput,
        NodeSetRequest,
        OrderConditionType,
        ReleasedWorker,
        ScaleDownWorker,
        SetNodeSets,
        SlotRecord,
        StoppedWorkers,
        WorkerNodeInput,
        WorkerNodeResult,
        WorkerProgress,
        WorkerReport,
        WorkerReports,
        WorkerSlotSpec,
        change_superseded,
        cluster_workflow_id,
        is_current,
        node_set_problem,
        worker_workflow_id,
    )
    from workflows.activity_calls import (
        CALL_RETRY,
        attempts_before_shown,
        bmaas_call_through_outages,
        call_activity,
        call_backoff,
    )
    from workflows.continue_as_new import ContinueAsNewDue
    from workflows.metrics import record_order_counts
    from workflows.search_attributes import OSAC_CLUSTER_ORDER, worker_start_attributes
    from workflows.worker_node import WorkerNodeWorkflow

T = TypeVar("T")

# Events a continue-as-new carries at most (each ~200 bytes; the input is limited to 2 MiB).
CARRIED_EVENTS_MAX = 500


# RHCOSImageNotFound's reason while the release to find the image of is not known yet.
RELEASE_IMAGE_UNKNOWN = "ReleaseImageUnknown"
# A prerequisite's request was refused for good (not a missing input of the order): asked again.
REQUEST_REFUSED = "RequestRefused"
# FulfillmentServiceUnavailable's reasons: BMaaS calls keep failing (retried) / none does.
REQUESTS_FAILING = "RequestsFailing"
AVAILABLE = "Available"
# NodePoolNotFound's reasons: a node set's NodePool is not on the hub / all are.
NODEPOOL_NOT_FOUND = "NodePoolNotFound"
NODEPOOLS_FOUND = "NodePoolsFound"
NOT_NEEDED = "NotNeeded"  # no node set wants a NodePool not seen any more
# How far a restarted worker's report numbers start above the last its stopped run delivered.
RESTART_REPORT_GAP = 1000


class CommandRejected(ValueError):
    """A command that is invalid as a whole; its message names the field and the reason."""


# The ApplicationError type of a command refused by its handler rather than by its validator.
COMMAND_REJECTED = "CommandRejected"


class ClusterPatch(StrEnum):
    """Behaviour changes guarded by `workflow.patched`, so histories recorded before them replay."""

    # A worker named by `scale_down_worker` leaves even when the count change it made was offset by
    # a scale-up in the same workflow task.
    NAMED_WORKERS_ALWAYS_LEAVE = "named-workers-always-leave"
    # The status is written by a local activity: one marker instead of three events and a workflow
    # task per write, and the workers' statuses it carries stay out of the history.
    STATUS_PUBLISHED_LOCALLY = "status-published-locally"
    # A command after the InfraEnv was ensured brings it in line with the order again (a rotated
    # pull secret, a new SSH key), before more hosts boot its ignition.
    INFRAENV_FOLLOWS_THE_ORDER = "infraenv-follows-the-order"
    # Every `ready_host_check`, while workers are Ready, BMaaS is asked whether their hosts still
    # run; a worker whose BMI failed, is being deleted or is gone is told (`host_lost`).
    READY_HOSTS_CHECKED = "ready-hosts-checked"
    # A command reads the order again, and the order's security groups (mutable, unlike its subnet)
    # are put on its BMIs: the ones running, and each one a worker booted with the old groups later.
    SECURITY_GROUPS_FOLLOW_THE_ORDER = "security-groups-follow-the-order"
    # A command while the first InfraEnv's image is not built (a bad pull secret or SSH key the
    # tenant then fixed) ensures the InfraEnv again instead of waiting for the old one for ever.
    FIRST_INFRAENV_FOLLOWS_THE_ORDER = "first-infraenv-follows-the-order"
    # A worker whose workflow was stopped from outside (terminated in the Web UI, say) is started
    # again when it is told to leave or that its host is lost, instead of the signal failing this
    # workflow (scale-down) or being dropped (host lost).
    STOPPED_WORKERS_RESTARTED = "stopped-workers-restarted"
    # A host found lost is told to its worker only if the worker is still Ready on it when the check
    # returns: one that a scale-down made leave meanwhile is deleting that BMI itself.
    LOST_HOSTS_TOLD_IF_STILL_READY = "lost-hosts-told-if-still-ready"
    # An order waiting for a prerequisite (a boot image, a pull secret, a release) for days
    # continues as new from that wait, before the server's history limit ends the workflow.
    PREREQUISITE_WAIT_CONTINUES_AS_NEW = "prerequisite-wait-continues-as-new"
    # A worker that found the InfraEnv gone (deleted behind our back) makes this workflow create it
    # again, rather than every attempt failing until the next command.
    MISSING_INFRAENV_RECREATED = "missing-infraenv-recreated"
    # A decommission during the first image wait no longer shows the image as created.
    NO_IMAGE_SHOWN_AFTER_DECOMMISSION = "no-image-shown-after-decommission"
    # A command that arrived while the order prepared (waiting for its hosted cluster or its boot
    # image) has the order read again before the first worker starts: its security groups may have
    # changed since the facts were read.
    ORDER_READ_AGAIN_AFTER_PREPARING = "order-read-again-after-preparing"
    # An InfraEnv created again (deleted behind our back) is waited for off the main loop, shown as
    # InfraEnvReady=False/WaitingForImage meanwhile: commands and scale-downs go on, and an image
    # that cannot be built no longer holds them for ever.
    RECREATED_INFRAENV_WAITED_ASIDE = "recreated-infraenv-waited-aside"
    # A status write refused when the run is due to continue as new no longer holds it there.
    CONTINUE_AS_NEW_PAST_A_REFUSED_STATUS = "continue-as-new-past-a-refused-status"
    # The waits for the hosted cluster and for a discovery image, refused for good by the hub (a
    # 401/403), show the refusal and are made again after `prerequisite_recheck`, instead of failing
    # this workflow (preparing) or ending the wait beside the main loop without a word.
    HUB_WAIT_REFUSALS_ASKED_AGAIN = "hub-wait-refusals-asked-again"
    # A new slot whose worker workflow id is held by a run this workflow did not start (a worker of
    # an earlier run of the order, a reset) is dropped, not adopted; the next pass starts another.
    TAKEN_WORKER_IDS_SKIPPED = "taken-worker-ids-skipped"
    # Once every worker is released, an InfraEnv delete the hub refuses (the ClusterOrder's garbage
    # collection takes it) and a last status write it refuses are given up: the workflow completes.
    DECOMMISSION_ENDS_PAST_REFUSALS = "decommission-ends-past-refusals"
    # While no boot image is known for the release, each look again reads the order first: the
    # tenant may have corrected spec.releaseImage (a typo no cluster version offers).
    RELEASE_READ_AGAIN_WITHOUT_IMAGE = "release-read-again-without-image"
    # A leaving worker (told to, or cancelled) that reports nothing for a `ready_host_check` is told
    # again (`_tell_again_at`): one whose run was stopped from outside while it left is started again
    # to finish its release, instead of its host and a decommission waiting for ever.
    STOPPED_LEAVERS_RESTARTED = "stopped-leavers-restarted"
    # A pull secret removed from the order (no default either) is shown as PullSecretMissing when
    # the InfraEnv's Secret is gone too, and the image is waited for once it is set again; before,
    # the condition kept what it said about the last refused pull secret.
    MISSING_PULL_SECRET_SHOWN = "missing-pull-secret-shown"
    # A worker this run started whose run is then terminated from outside is started again at once
    # (its end reaches this run): a Ready one stays Ready, a leaving one finishes its release, and
    # one not yet Ready releases what it held and is replaced. Before, it waited to be told.
    TERMINATED_WORKERS_RESTARTED = "terminated-workers-restarted"
    # A worker started by an earlier run of this workflow (before a continue-as-new), not yet Ready
    # and quiet for a `ready_host_check`, is looked up in Temporal (`find_stopped_workers`): one
    # terminated from outside is started again at once, to release its host and be replaced, as
    # the workers this run started are. Before, it waited to be told.
    EARLIER_WORKERS_LOOKED_AFTER = "earlier-workers-looked-after"
    # A run's last status write (at a continue-as-new, at the decommission's end) is fixed when it
    # begins: the status generation it must reach, after which the publisher starts no other
    # write, and a give-up timer that is never cancelled. A query answered while that write runs
    # can leave its result to the next workflow task live, while replay takes it at once, before
    # that task's signals: a timer cancelled on the result was then dropped on replay (started and
    # cancelled in one task), and a status change arriving with the result made a live run write
    # once more where its replay continued as new. Either way the closed run failed to replay.
    LAST_STATUS_WRITE_FIXED = "last-status-write-fixed"
    # A continue-as-new waits for the tells under way (a lost host or a leaver told from beside the
    # main loop, and the restart of a worker found stopped by one): the server drops a signal or a
    # child start still pending when its sender's run closes, and the next run would not know.
    TELLS_SENT_BEFORE_CONTINUE_AS_NEW = "tells-sent-before-continue-as-new"
    # A worker that reports leaving though it was never told to (its run cancelled from outside,
    # which it takes as a scale-down) is replaced at once, as a scale-down's leaver is; before, its
    # slot filled the count until its release ended, for ever with a drain that hangs.
    SELF_LEAVERS_REPLACED_AT_ONCE = "self-leavers-replaced-at-once"
    # A Ready worker whose host is lost leaves like a scale-down's victim (told `host_lost`, then
    # `scale_down`) and a new worker replaces it at once; before, it failed (Failed is only for
    # attempts that never reached Ready) and came back in its slot after a backoff.
    LOST_HOSTS_REPLACED_BY_NEW_WORKERS = "lost-hosts-replaced-by-new-workers"
    # The order's security groups BMaaS refused to put on its hosts (a token mid-rotation, a group
    # not there yet) are shown on the order and put again every `prerequisite_recheck` until done;
    # before, one refusal counted as done and the hosts kept their old groups.
    SECURITY_GROUPS_ASKED_AGAIN = "security-groups-asked-again"
    # No worker is started for a node set whose NodePool is not on the hub (its Agent could not be
    # handed to anything): the order shows NodePoolNotFound and looks again every
    # `prerequisite_recheck`. Before, the worker allocated a host and waited at its hand-off.
    NODEPOOLS_FOUND_BEFORE_HOSTS = "nodepools-found-before-hosts"
    # A victim whose run ended, its release done, while the pass that chose it started other
    # workers (its run cancelled from outside, which it takes as a scale-down): the failed
    # `scale_down` signal is left at that. Before, it failed this workflow.
    ENDED_VICTIMS_LEFT_ALONE = "ended-victims-left-alone"
    # The InfraEnv's refresh (after a command, or a worker finding it missing; retried until the
    # hub answers: for good while the InfraEnv is stuck deleting) and the order's read after a
    # command are stopped by a decommission, and say nothing once stopped. Before, the
    # decommission, accepted, waited behind them.
    DECOMMISSION_STOPS_REFRESHES = "decommission-stops-refreshes"
    # A report carrying another ClusterOrder's uid (a late copy from a worker of an earlier order
    # of the same name) is not taken.
    REPORTS_OF_OTHER_ORDERS_IGNORED = "reports-of-other-orders-ignored"
    # A cancel of this workflow (an operator's, in the Web UI) that arrived while a call was under
    # way or retried ends the run Canceled once the call ends, as one during a wait does. Before,
    # the cancelled call was shown as the hub or BMaaS refusing it (RequestRefused), or taken as
    # done, and the run went on.
    CANCELLED_CALLS_NOT_REFUSALS = "cancelled-calls-not-refusals"
    # The main loop continues as new once the server's suggestion was seen where a recorded event
    # resumed the run (workflows.continue_as_new); before, it read the suggestion live, also in a
    # task the SDK forced for a status write's result, which replay does not see.
    CONTINUE_AS_NEW_ON_RECORDED_EVENTS = "continue-as-new-on-recorded-events"
    # A status write is one attempt, and the publisher retries a failed one itself: after 1, 2, 4,
    # 8 and 16 s (STATUS_WRITE_ATTEMPTS in all, as the SDK retried a call), then once a minute,
    # where a round of SDK retries was made every 90 s. A run's last write is tried right after
    # the write under way, even while the publisher waits after a failure, and until its give-up
    # timer: only the hub refusing that write (the activity's non-retryable error) gives it up
    # sooner, not an earlier write's refusal nor a failure (5xx, unanswered). The publisher's waits
    # are timers never cancelled (nor is a retry's backoff, which the SDK ran on a timer the give-up
    # cancelled): a write's result can come a task later live than in replay, and a cancel of a
    # timer started on it could then fall in another task.
    STATUS_WRITES_PACED = "status-writes-paced"


# A status write's attempts in a row backing off as CALL_RETRY does (about 30 s), before the
# publisher waits a minute between them. In a run that keeps the continue-as-new suggestion
# (CONTINUE_AS_NEW_ON_RECORDED_EVENTS) and does not pace the writes, the SDK's retries of one write,
# after which it is back in the publisher, which tries again after its own timer and looks at the
# suggestion there: a hub failing the writes for days would otherwise grow the history with no
# look, up to the server's limit. A paced run makes each attempt itself (STATUS_WRITES_PACED).
STATUS_WRITE_ATTEMPTS = attempts_before_shown(timedelta(seconds=30))

# How long the publisher waits after a status write that keeps failing before the next one, and the
# summary of its waits after a failed write (STATUS_WRITES_PACED) as the Web UI shows them.
FAILED_STATUS_WRITE_PAUSE = CALL_RETRY.maximum_interval or timedelta(seconds=60)
FAILED_STATUS_WRITE_PAUSE_SUMMARY = "Wait after a failed status write"
# The summary of a `status_coalesce` window (STATUS_WRITES_PACED).
STATUS_COALESCE_SUMMARY = "Gather status changes"

# The summary of a last status write's give-up timer (LAST_STATUS_WRITE_FIXED), as the Web UI shows it.
STATUS_FLUSH_GIVE_UP = "Give up the last status write"


def _victim_rank(slot: SlotRecord) -> tuple[int, int]:
    """Lower goes first: named, then leaving already (its run was cancelled), then Failed, then not
    yet Ready (newest first), then Ready (newest)."""
    if slot.named_for_removal or slot.status.phase in LEAVING_PHASES:
        group = 0
    elif slot.status.phase == WorkerPhase.FAILED:
        group = 1
    elif slot.status.phase != WorkerPhase.READY:
        group = 2
    else:
        group = 3
    return (group, -slot.spec.index)


@workflow.defn
class ClusterWorkersWorkflow:
    @workflow.init
    def __init__(self, inp: ClusterWorkersInput) -> None:
        self._input = inp
        carried = inp.carried or ClusterWorkersCarried(slots=[], next_index=0, decommissioning=False)
        self._slots: dict[str, SlotRecord] = {s.spec.name: s for s in carried.slots}
        self._next_index = carried.next_index
        self._decommissioning = carried.decommissioning
        self._ignored_scale_downs = list(carried.ignored_scale_downs)
        self._node_sets: dict[str, NodeSetRequest] = {n.name: n for n in inp.node_sets}
        self._instance_types = set(inp.instance_types)
        self._conditions: dict[OrderConditionType, Condition] = {}
        self._events: list[EventInput] = list(carried.events)
        self._events_in_flight: list[EventInput] = []  # taken by the status write under way
        self._publish_failures = 0  # status writes failed so far (see _flush_status)
        self._status_writes_paced = False
        self._failed_writes_in_a_row = 0  # STATUS_WRITES_PACED
        self._last_write_refused = False  # STATUS_WRITES_PACED
        self._publishing_stopped = False  # the last write is over (_flush_status)
        self._changed = True
        # Status writes: every change bumps the generation, the publisher catches up in batches.
        self._status_generation = 1
        self._published_generation = 0
        self._publish_until: int | None = None  # the last write's generation (LAST_STATUS_WRITE_FIXED)
        self._finished = False
        self._history_limit = ContinueAsNewDue()
        # A command arrived since the InfraEnv was last brought in line with the order.
        self._order_edited = carried.order_edited
        # The order's security groups are to be put on its BMIs (they changed, or a worker started
        # with the old ones reported a new BMI) while this is above the last generation applied.
        self._security_groups_wanted = 1 if carried.security_groups_pending else 0
        self._security_groups_applied = 0
        # A worker reported that the InfraEnv is gone.
        self._infraenv_missing = carried.infraenv_missing
        # Per leaving slot: how many looks in a row found it quiet (`_look_after_leavers`).
        self._quiet_looks: dict[str, int] = {}
        # The InfraEnv was created again: its image is waited for while this is above the last one seen.
        self._infraenv_recreated = 1 if carried.infraenv_image_pending else 0
        self._infraenv_image_seen = 0
        self._cluster: ClusterReference | None = carried.cluster
        self._cluster_release = carried.cluster_release
        self._order_generation = carried.order_generation
        self._facts: OrderFacts | None = carried.facts
        # The previous run continued as new while still preparing: prepare again from the start.
        self._preparing = carried.preparing
        # A command arrived while preparing (a run continued as new then prepares from the start).
        self._edited_while_preparing = False
        self._publisher: asyncio.Future[None] | None = None
        for condition in carried.conditions:
            self._conditions[OrderConditionType(condition.type)] = condition
        # This run's BMaaS calls that keep failing, by call number (the workers' are in their slots).
        self._bmaas_calls = 0
        self._bmaas_failing: dict[int, FailingRequests] = {}
        # What the previous run showed of its own calls is not known to hold (calls are not carried):
        # shown again if this run's keep failing. Carried, it could stay shown with no call left to end it.
        self._show_bmaas_failing()
        # While the order's pull secret is refused (the last ensure kept the Secret the image was
        # built with): what InfraEnvReady=True says instead of ImageCreated.
        self._pull_secret_note = carried.pull_secret_note
        self._pull_secret_note_reason = carried.pull_secret_note_reason
        # The waits on the ends of the workers this run started (one terminated from outside is
        # started again), and how many such restarts are under way (a continue-as-new waits for them).
        self._child_ends: set[asyncio.Future[None]] = set()
        self._restarts_in_flight = 0
        # Signals (and the restarts they lead to) sent to workers and not yet answered.
        self._tells_in_flight = 0
        # The slots whose worker this run started (it sees their end); the others' workers were
        # started by an earlier run and are looked up instead (`_look_after_earlier_workers`).
        self._watched: set[str] = set()
        # Starts not yet confirmed, per slot (a tell and a look-up may start one at once): those
        # slots are this run's, not an earlier run's.
        self._starting: Counter[str] = Counter()
        # Per such slot not yet Ready: how many looks in a row found it quiet.
        self._earlier_quiet_looks: dict[str, int] = {}
        # The NodePools seen on the hub in this run (NODEPOOLS_FOUND_BEFORE_HOSTS); a new run looks
        # again before it starts a worker.
        self._nodepools_found: set[str] = set()

    # ----------------------------------------------------------------------------------- API

    @workflow.update
    async def set_node_sets(self, command: SetNodeSets) -> ClusterWorkersStatus:
        self._history_limit.look()
        self._node_sets = {n.name: n for n in command.node_sets}
        # The order's first command comes while its facts are being read: only a later one counts.
        if self._preparing and self._facts is not None:
            self._edited_while_preparing = True
        if command.instance_types is not None:
            self._instance_types = set(command.instance_types)
        self._order_edited = True
        if command.order_generation is not None:
            self._order_generation = max(command.order_generation, self._order_generation or 0)
        self._touch()
        return self.status()

    @set_node_sets.validator
    def _validate_node_sets(self, command: SetNodeSets) -> None:
        if self._decommissioning:
            raise CommandRejected("set_node_sets: the order is being decommissioned; no further changes")
        if superseded := change_superseded(command, self._node_sets.values()):
            raise ApplicationError(superseded, type=NODE_SETS_SUPERSEDED, non_retryable=True)
        problem = node_set_problem(
            command.node_sets,
            self._instance_types if command.instance_types is None else command.instance_types,
            self._input.max_workers_per_order,
            current=list(self._node_sets.values()),
            confirm_scale_down=command.confirm_scale_down,
            guard=self._input.scale_down_guard,
            order=self._input.order,
            next_index=self._next_index,
        )
        if problem:
            raise CommandRejected(problem)

    @workflow.update
    async def decommission(self) -> ClusterWorkersStatus:
        self._history_limit.look()
        self._decommissioning = True
        self._touch()
        return self.status()

    @decommission.validator
    def _validate_decommission(self) -> None:
        if self._decommissioning:
            raise CommandRejected("decommission: the order is already being decommissioned")

    @workflow.signal
    def scale_down_worker(self, request: ScaleDownWorker) -> None:
        self._history_limit.look()
        slot = self._slots.get(request.name)
        if slot is None or slot.deleted or slot.scale_down_sent or slot.named_for_removal:
            # Signals cannot be rejected (the update `release_worker` can). Keep it visible.
            self._ignored_scale_downs.append(request.name)
            workflow.set_current_details(
                "Ignored scale-down of unknown or departing worker(s): "
                + ", ".join(self._ignored_scale_downs)
            )
            return
        self._name_for_removal(slot)

    @workflow.update
    def release_worker(self, request: ScaleDownWorker) -> ReleasedWorker:
        """The scale-down of one named worker as a command that answers: refused for an unknown or
        departing worker, so of two callers naming the same worker exactly one is told it leaves
        (and lowers the order's count); the signal would have ignored the other without a word."""
        self._history_limit.look()
        problem = self._release_problem(request.name)
        if problem is not None:
            # The updates of one workflow task are all validated before any of their handlers runs.
            raise ApplicationError(problem, type=COMMAND_REJECTED, non_retryable=True)
        slot = self._slots[request.name]
        node_set = self._name_for_removal(slot)
        lowered = node_set or NodeSetRequest(
            name=slot.spec.node_set, instance_type=slot.spec.instance_type, count=0
        )
        return ReleasedWorker(worker=request.name, node_set=lowered)

    @release_worker.validator
    def _validate_release_worker(self, request: ScaleDownWorker) -> None:
        problem = self._release_problem(request.name)
        if problem is not None:
            raise CommandRejected(problem)

    def _release_problem(self, name: str) -> str | None:
        order = self._input.order.key
        if self._decommissioning:
            return f"worker: order {order} is being decommissioned"
        slot = self._slots.get(name)
        if slot is None or slot.deleted:
            known = ", ".join(s.spec.name for s in self._ordered_slots() if not s.deleted) or "none"
            return f"worker: order {order} has no worker {name!r} (workers: {known})"
        if slot.scale_down_sent or slot.named_for_removal or slot.status.phase in LEAVING_PHASES:
            why = (
                f"phase {slot.status.phase.value}"
                if slot.status.phase in LEAVING_PHASES
                else "a scale-down named it before"
            )
            return f"worker: {name} of order {order} is already leaving ({why}); nothing changed"
        return None

    def _name_for_removal(self, slot: SlotRecord) -> NodeSetRequest | None:
        """The worker leaves, and its node set asks for one fewer: its node set as lowered."""
        slot.named_for_removal = True
        node_set = self._node_sets.get(slot.spec.node_set)
        if node_set is not None and node_set.count > 0:
            node_set = self._node_sets[node_set.name] = node_set.model_copy(
                update={"count": node_set.count - 1}
            )
        self._touch()
        return node_set

    @workflow.signal
    def worker_report(self, report: WorkerReport) -> None:
        """From a worker workflow itself (a failure, a wait, its end)."""
        self._history_limit.look()
        if self._take_report(report):
            self._touch()

    @workflow.signal
    def worker_reports(self, batch: WorkerReports) -> None:
        """From the worker process's activities, which start or end their workers' phases."""
        self._history_limit.look()
        if batch.unreadable:
            workflow.logger.warning("%d report(s) of a newer worker version not read", batch.unreadable)
        if any([self._take_report(report) for report in batch.reports]):
            self._touch()

    def _take_report(self, report: WorkerReport) -> bool:
        slot = self._slots.get(report.status.name)
        if slot is None:
            return False
        uid = self._order_uid()
        if (
            report.order_uid
            and uid
            and report.order_uid != uid
            and workflow.patched(ClusterPatch.REPORTS_OF_OTHER_ORDERS_IGNORED.value)
        ):
            # From a worker of an earlier order of this name: its slot is not this one.
            workflow.logger.warning("report of %s for another ClusterOrder ignored", report.status.name)
            return False
        if report.sequence and report.sequence <= slot.report_sequence:
            return False  # a late copy (a retried activity) of a report already superseded
        slot.report_sequence = max(slot.report_sequence, report.sequence)
        self._events.extend(self._events_for(slot.status, report))
        new_bmi = report.status.resource_id and report.status.resource_id != slot.status.resource_id
        if new_bmi and self._in_old_security_groups(slot):
            self._security_groups_wanted += 1
        if (
            report.status.phase == WorkerPhase.FAILED
            and report.status.last_failure_reason == FailureReason.INFRAENV_MISSING
        ):
            self._infraenv_missing = True
        slot.status = report.status
        slot.deleted = slot.deleted or report.deleted
        if slot.bmaas_failing != report.bmaas_failing or report.deleted:
            slot.bmaas_failing = None if report.deleted else report.bmaas_failing
            self._show_bmaas_failing()
        if (
            report.status.phase in LEAVING_PHASES
            and not slot.scale_down_sent
            and not slot.deleted
            and workflow.patched(ClusterPatch.SELF_LEAVERS_REPLACED_AT_ONCE.value)
        ):
            # Leaving though never told to (its run cancelled from outside): replaced now, as a
            # scale-down's leaver is, rather than once its unbind and wipe are done.
            slot.scale_down_sent = True
        return True

    @workflow.query
    def status(self) -> ClusterWorkersStatus:
        live = [s for s in self._ordered_slots() if not s.deleted]
        return ClusterWorkersStatus(
            order=self._input.order,
            node_sets=sorted(self._node_sets.values(), key=lambda n: n.name),
            desired_workers=0 if self._decommissioning else sum(n.count for n in self._node_sets.values()),
            current_workers=sum(1 for s in live if is_current(s.status.phase)),
            ready_workers=sum(1 for s in live if s.status.phase == WorkerPhase.READY),
            workers=[s.status for s in live],
            conditions=self._current_conditions(),
            decommissioning=self._decommissioning,
            finished=self._finished,
            ignored_scale_downs=list(self._ignored_scale_downs),
            order_generation=self._order_generation,
            max_workers_per_order=self._input.max_workers_per_order,
        )

    # ------------------------------------------------------------------------------ main flow

    @workflow.run
    async def run(self, inp: ClusterWorkersInput) -> ClusterWorkersStatus:
        order = inp.order
        workflow.upsert_search_attributes([OSAC_CLUSTER_ORDER.value_set(order.key)])
        self._history_limit.decide(workflow.patched(ClusterPatch.CONTINUE_AS_NEW_ON_RECORDED_EVENTS.value))
        self._status_writes_paced = workflow.patched(ClusterPatch.STATUS_WRITES_PACED.value)
        publisher = self._publisher = asyncio.ensure_future(self._publish_loop())
        host_check = asyncio.ensure_future(self._check_ready_hosts())
        security_groups = asyncio.ensure_future(self._keep_security_groups())
        recreated_image = asyncio.ensure_future(self._wait_recreated_infraenv())
        leavers = asyncio.ensure_future(self._look_after_leavers())
        earlier_workers = asyncio.ensure_future(self._look_after_earlier_workers())
        nodepools = asyncio.ensure_future(self._find_nodepools())

        prepared = self._facts is not None and self._cluster is not None and not self._preparing
        if not prepared and (not self._decommissioning or self._slots):
            self._preparing = True
            await self._prepare()
            self._preparing = False
            if (
                self._facts_outdated()
                and not self._decommissioning
                and workflow.patched(ClusterPatch.ORDER_READ_AGAIN_AFTER_PREPARING.value)
            ):
                await self._refresh_security_groups()

        while True:
            self._end_if_cancelled()
            self._changed = False
            await self._reconcile()
            if self._decommissioning and all(s.deleted for s in self._slots.values()):
                break
            await workflow.wait_condition(lambda: self._changed or self._history_limit.due)
            if self._history_limit.due and not self._changed:
                await self._continue_as_new(publisher)

        if self._facts is not None or self._cluster is not None:
            try:
                await self._hub(
                    HubActivity.DELETE_INFRAENV,
                    InfraEnvRef.for_order(order),
                    None,
                    summary=f"Delete InfraEnv {order.infraenv_name}",
                )
            except ActivityError as err:
                if isinstance(err.cause, CancelledError) or not workflow.patched(
                    ClusterPatch.DECOMMISSION_ENDS_PAST_REFUSALS.value
                ):
                    raise  # a cancellation of this workflow stays one
                # Every host is released: failing now would keep the deleting order's finalizer for
                # an object owner-referenced by the ClusterOrder, garbage-collected with it.
                workflow.logger.warning(
                    "InfraEnv %s not deleted (it goes with the ClusterOrder): %s",
                    order.infraenv_name,
                    err.cause or err,
                )
        self._finished = True
        host_check.cancel()
        security_groups.cancel()
        recreated_image.cancel()
        leavers.cancel()
        earlier_workers.cancel()
        nodepools.cancel()
        # A last write the hub refuses for good is given up after its call timeout: retried for ever,
        # it held the run (and the controller the finalizer) until the server's history limit.
        await self._flush_status(
            publisher, or_give_up=workflow.patched(ClusterPatch.DECOMMISSION_ENDS_PAST_REFUSALS.value)
        )
        return self.status()

    async def _prepare(self) -> None:
        """Cluster reference, boot image and InfraEnv, before the first worker."""
        order = self._input.order
        self._facts = await self._read_order_facts() or self._facts
        if self._decommissioning or self._facts is None:
            return
        self._cluster = await self._wait_cluster_reference()
        if self._cluster is None:
            return
        while not self._decommissioning:
            try:
                release = await self._workers_release()
            except ActivityError as err:
                self._show_refusal(
                    err,
                    OrderConditionType.RHCOS_IMAGE_NOT_FOUND,
                    ConditionStatus.TRUE,
                    "The hub refused to show the hosted cluster's NodePools, whose release the workers"
                    " boot; no workers are created until it does.",
                )
                await self._recheck_later()
                continue
            if release is None:
                self._set_condition(
                    OrderConditionType.RHCOS_IMAGE_NOT_FOUND,
                    ConditionStatus.TRUE,
                    RELEASE_IMAGE_UNKNOWN,
                    "spec.releaseImage is not set and no NodePool of the hosted cluster names a release;"
                    " no workers are created until one does.",
                )
                await self._recheck_later()
                # The tenant may have named one on the order meanwhile.
                self._facts = await self._read_order_facts() or self._facts
                continue
            try:
                await self._bmaas(
                    BmaasActivity.RESOLVE_BOOT_IMAGE,
                    ResolveBootImageInput(release_image=release),
                    BootImage,
                    summary=f"Resolve the boot image of {release}",
                )
                self._set_condition(
                    OrderConditionType.RHCOS_IMAGE_NOT_FOUND, ConditionStatus.FALSE, "BootImageFound"
                )
                # A refusal is over; calls of workers still failing stay shown.
                refusal = self._conditions.get(OrderConditionType.FULFILLMENT_SERVICE_UNAVAILABLE)
                if refusal is not None and refusal.reason != REQUESTS_FAILING:
                    self._set_condition(
                        OrderConditionType.FULFILLMENT_SERVICE_UNAVAILABLE, ConditionStatus.FALSE, AVAILABLE
                    )
                break
            except ActivityError as err:
                no_image = _is_type(err, FailureReason.RHCOS_IMAGE_NOT_FOUND.value)
                if no_image:
                    self._set_condition(
                        OrderConditionType.RHCOS_IMAGE_NOT_FOUND,
                        ConditionStatus.TRUE,
                        FailureReason.RHCOS_IMAGE_NOT_FOUND.value,
                        "No boot image is linked to the cluster version of the release the workers"
                        " boot (spec.releaseImage, or the hosted cluster's when it names none), or no"
                        " cluster version offers that release; no workers are created until one is.",
                    )
                else:
                    # Refused for good by BMaaS (a token rotated before its file, a permission a
                    # rollout forgot): one order's workflow failing would strand it; wait and ask again.
                    self._show_refusal(
                        err,
                        OrderConditionType.FULFILLMENT_SERVICE_UNAVAILABLE,
                        ConditionStatus.TRUE,
                        "The bare-metal service refused a request; no workers are created until it answers.",
                    )
                await self._recheck_later()
                if (
                    no_image
                    and not self._decommissioning
                    and workflow.patched(ClusterPatch.RELEASE_READ_AGAIN_WITHOUT_IMAGE.value)
                ):
                    self._facts = await self._read_order_facts() or self._facts
        while not self._decommissioning:
            ensured = await self._ensure_first_infraenv()
            if ensured is None:
                return
            self._set_condition(
                OrderConditionType.INFRA_ENV_READY,
                ConditionStatus.FALSE,
                "WaitingForImage",
                "Waiting for the discovery image. If this lasts, check spec.pullSecret and spec.sshPublicKey;"
                " a corrected order is applied.",
            )
            if await self._wait_infraenv_ready(ensured.infraenv, until_edited=True):
                break
        else:
            # Decommissioned during the wait. Older code showed the image as created here (a status
            # write and an Event); their histories replay only if it still does.
            if workflow.patched(ClusterPatch.NO_IMAGE_SHOWN_AFTER_DECOMMISSION.value):
                return
        self._show_image_ready()
        self._events.append(
            self._event(EventReason.INFRA_ENV_CREATED, f"InfraEnv {order.infraenv_name} is ready")
        )

    async def _ensure_first_infraenv(self) -> EnsureInfraEnvResult | None:
        """The InfraEnv and its pull Secret, waiting (never failing) for a pull secret to use."""
        order = self._input.order
        while not self._decommissioning:
            try:
                self._order_edited = False  # the ensure reads the order as it is now
                ensured: EnsureInfraEnvResult = await self._hub(
                    HubActivity.ENSURE_INFRAENV,
                    order,
                    EnsureInfraEnvResult,
                    summary=f"Ensure InfraEnv {order.infraenv_name}",
                )
                self._note_pull_secret(ensured)
                return ensured
            except ActivityError as err:
                if _is_type(err, HubErrorType.PULL_SECRET_INVALID.value):
                    self._show_pull_secret_refused(err, "; no workers are created until it is corrected.")
                elif _is_type(err, HubErrorType.PULL_SECRET_MISSING.value):
                    # The tenant can add it to the ClusterOrder at any time: wait for it, never fail.
                    self._set_condition(
                        OrderConditionType.INFRA_ENV_READY,
                        ConditionStatus.FALSE,
                        HubErrorType.PULL_SECRET_MISSING.value,
                        f"{NO_PULL_SECRET}; no workers are created until it is.",
                    )
                else:
                    # Refused for good by the hub (a namespace being deleted forbids new objects, a
                    # quota, a webhook): the order's deletion or a fix must still find this workflow.
                    self._show_refusal(
                        err,
                        OrderConditionType.INFRA_ENV_READY,
                        ConditionStatus.FALSE,
                        "The hub refused the InfraEnv or its pull Secret; no workers are created until it"
                        " accepts them.",
                    )
                await self._recheck_later()
        return None

    async def _wait_cluster_reference(self) -> ClusterReference | None:
        """The hosted cluster, once provisioned; None when a decommission made it moot. A hub that
        refuses to show the order (a 401/403) is shown and asked again, as the order's read is."""
        order = self._input.order
        while True:
            try:
                cluster: ClusterReference | None = await self._until_decommissioned(
                    self._hub(
                        HubActivity.WAIT_CLUSTER_REFERENCE,
                        WaitClusterReferenceInput(order=order),
                        ClusterReference,
                        summary="Wait for the hosted cluster to be provisioned",
                        wait=True,
                    )
                )
                return cluster
            except ActivityError as err:
                self._show_wait_refusal(
                    err,
                    "The hub refused to show the ClusterOrder's hosted cluster; no workers are created"
                    " until it does.",
                )
            if not self._decommissioning:
                await self._recheck_later()
            if self._decommissioning:
                return None

    def _facts_outdated(self) -> bool:
        """A command came from an edit of the order made after its facts were read."""
        if self._facts is None:
            return False
        if self._order_generation is not None and self._facts.generation is not None:
            return self._order_generation > self._facts.generation
        return self._edited_while_preparing

    async def _read_order_facts(self) -> OrderFacts | None:
        """The order as it is now, waiting out a hub that refuses to show it (a permission a rollout
        forgot, the object deleted behind a library caller's back) rather than failing the workflow,
        which would strand its hosts; None once a decommission makes it moot."""
        order = self._input.order
        while True:
            # Read first, decommissioning or not: older code always read here, and its histories
            # must schedule the same command.
            try:
                facts: OrderFacts = await self._hub(
                    HubActivity.READ_ORDER, order, OrderFacts, summary=f"Read ClusterOrder {order.key}"
                )
                return facts
            except ActivityError as err:
                self._show_refusal(
                    err,
                    OrderConditionType.INFRA_ENV_READY,
                    ConditionStatus.FALSE,
                    "The hub refused to show the ClusterOrder; no workers are created until it does.",
                )
            if self._decommissioning:
                return None
            await self._recheck_later()

    def _show_refusal(
        self, err: ActivityError, kind: OrderConditionType, status: ConditionStatus, message: str
    ) -> None:
        """A prerequisite's request refused for good: the tenant sees `message`, ops the error. A
        call cancelled is no refusal: this workflow's cancellation stays one (the run ends Canceled,
        as it does when cancelled during a wait), whatever the call ended with."""
        self._end_if_cancelled()
        workflow.logger.warning("%s: request refused: %s", kind.value, err.cause or err)
        self._set_condition(kind, status, REQUEST_REFUSED, message)

    async def _workers_release(self) -> str | None:
        """The release the workers boot: the order's `releaseImage`, or, when it names none (its
        template's default applies), the release of the hosted cluster's NodePools, read until found."""
        assert self._facts is not None and self._cluster is not None
        if self._facts.release_image:
            return self._facts.release_image
        if self._cluster_release is None:
            found = await self._hub(
                HubActivity.READ_CLUSTER_RELEASE,
                ClusterReleaseInput(order=self._input.order, cluster=self._cluster),
                ClusterRelease,
                summary="Read the release of the hosted cluster's NodePools (the order names none)",
            )
            self._cluster_release = found.release_image
        return self._cluster_release

    def _end_if_cancelled(self) -> None:
        """End the run Canceled if this workflow was cancelled (an operator's cancel in the Web UI).
        A call under way when it came ends with its own result (calls wait for their cancellation
        to complete), and the SDK takes the cancel as delivered: without this look (before every
        call, every recheck and pass, and a continue-as-new), the run would go on after it."""
        if workflow.cancellation_reason() is not None and workflow.patched(
            ClusterPatch.CANCELLED_CALLS_NOT_REFUSALS.value
        ):
            raise asyncio.CancelledError()

    async def _recheck_later(self) -> None:
        """Sit out a missing prerequisite until a command arrives or the recheck interval passes.
        Each recheck adds to the history: a wait of days continues as new from here."""
        self._end_if_cancelled()
        self._changed = False
        try:
            await workflow.wait_condition(
                lambda: self._changed, timeout=self._input.policy.prerequisite_recheck
            )
        except TimeoutError:
            pass
        self._history_limit.look()  # after a timer that fired or a command: a recorded event
        if self._history_limit.due and workflow.patched(
            ClusterPatch.PREREQUISITE_WAIT_CONTINUES_AS_NEW.value
        ):
            assert self._publisher is not None
            await self._continue_as_new(self._publisher)

    async def _until_decommissioned(self, call: Any, *, or_edited: bool = False) -> Any:
        """Await a long wait unless a decommission makes it pointless (or, with `or_edited`, a
        command may have changed what it waits for): then stop it and return None."""
        task = asyncio.ensure_future(call)
        await workflow.wait_condition(
            lambda: task.done() or self._decommissioning or (or_edited and self._order_edited)
        )
        if not task.done() and not self._decommissioning:
            # Interrupted by a command. Histories from before the patch kept waiting here.
            if not workflow.patched(ClusterPatch.FIRST_INFRAENV_FOLLOWS_THE_ORDER.value):
                await workflow.wait_condition(lambda: task.done() or self._decommissioning)
        if not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, ActivityError):
                pass
            self._end_if_cancelled()  # one that came while the stopped call ended
            return None
        return await task

    # ------------------------------------------------------------------------------ reconcile

    async def _reconcile(self) -> None:
        if self._order_edited and not self._decommissioning:
            self._order_edited = False
            if workflow.patched(ClusterPatch.INFRAENV_FOLLOWS_THE_ORDER.value):
                await self._refresh(self._refresh_infraenv())
            if workflow.patched(ClusterPatch.SECURITY_GROUPS_FOLLOW_THE_ORDER.value):
                await self._refresh(self._refresh_security_groups())
        if self._infraenv_missing and not self._decommissioning:
            self._infraenv_missing = False
            if workflow.patched(ClusterPatch.MISSING_INFRAENV_RECREATED.value):
                await self._refresh(self._refresh_infraenv())
        if self._decommissioning:
            desired: dict[str, int] = {}
        else:
            desired = {name: n.count for name, n in self._node_sets.items()}
        starts, victims = self._plan(desired, named_always_leave=False)
        leaving = {v.spec.name for v in victims}
        if any(
            s.named_for_removal and _active(s) and s.spec.name not in leaving for s in self._slots.values()
        ):
            # A named worker whose count change was absorbed by a scale-up in the same task (or
            # carried over a continue-as-new) was kept. Only such histories record the marker.
            if workflow.patched(ClusterPatch.NAMED_WORKERS_ALWAYS_LEAVE.value):
                starts, victims = self._plan(desired, named_always_leave=True)
        new_slots = [
            self._new_slot(self._node_sets[name]) for name in sorted(starts) for _ in range(starts[name])
        ]
        await asyncio.gather(*(self._start_new_child(slot) for slot in new_slots))
        for slot in victims:
            slot.scale_down_sent = True
        await asyncio.gather(*(self._tell_worker(slot, None) for slot in victims))
        if new_slots or victims:
            self._status_generation += 1

    async def _refresh(self, refresh: Coroutine[Any, Any, None]) -> None:
        """A refresh's hub call is retried until the hub answers: for good while the InfraEnv or its
        Secret is stuck deleting behind a finalizer. A decommission does not wait for it."""
        if not workflow.patched(ClusterPatch.DECOMMISSION_STOPS_REFRESHES.value):
            await refresh
        elif self._decommissioning:  # arrived during the refresh before
            refresh.close()
        else:
            await self._until_decommissioned(refresh)

    def _refresh_stopped(self) -> bool:
        """A refresh's call ended because a decommission or this workflow's cancel stopped it:
        whatever it ended with, there is nothing to say or show."""
        stopped = self._decommissioning or workflow.cancellation_reason() is not None
        return stopped and workflow.patched(ClusterPatch.DECOMMISSION_STOPS_REFRESHES.value)

    async def _refresh_infraenv(self) -> None:
        """The order may have changed more than its counts (a rotated pull secret, a new SSH key):
        bring its InfraEnv in line before more hosts boot the InfraEnv's ignition. The activity
        patches only what drifted. A pull secret refused (none, or no pull secret) is never written:
        the Secret the image was built with is kept and the order says why; with no Secret to keep,
        the InfraEnv is left as it is and the order says no new host boots."""
        order = self._input.order
        try:
            ensured = await self._hub(
                HubActivity.ENSURE_INFRAENV,
                order,
                EnsureInfraEnvResult,
                summary=f"Bring InfraEnv {order.infraenv_name} in line with the order",
            )
        except ActivityError as err:
            if self._refresh_stopped():
                return
            workflow.logger.warning("InfraEnv %s left as it is: %s", order.infraenv_name, err.cause or err)
            workflow.set_current_details(f"InfraEnv {order.infraenv_name} left as it is: {err.cause or err}")
            gone = ", and the InfraEnv's pull Secret is gone: no new host boots until that is corrected."
            if _is_type(err, HubErrorType.PULL_SECRET_INVALID.value):
                self._show_pull_secret_refused(err, gone)
            elif _is_type(err, HubErrorType.PULL_SECRET_MISSING.value) and workflow.patched(
                ClusterPatch.MISSING_PULL_SECRET_SHOWN.value
            ):
                self._show_pull_secret_refused(err, gone, HubErrorType.PULL_SECRET_MISSING)
            return
        self._note_pull_secret(ensured)
        current = self._conditions.get(OrderConditionType.INFRA_ENV_READY)
        if current is not None and current.status == ConditionStatus.TRUE:
            self._show_image_ready()
        elif (
            current is not None
            and not ensured.created
            and (
                current.reason == HubErrorType.PULL_SECRET_INVALID.value
                or (
                    current.reason == HubErrorType.PULL_SECRET_MISSING.value
                    and workflow.patched(ClusterPatch.MISSING_PULL_SECRET_SHOWN.value)
                )
            )
        ):
            # Its pull Secret was gone and is back (written again, or restored by hand while the
            # order's is still refused): the image is built again from it.
            self._infraenv_recreated += 1
            return
        if ensured.created:
            # Someone deleted it: no host can boot until its discovery image is there again.
            if workflow.patched(ClusterPatch.RECREATED_INFRAENV_WAITED_ASIDE.value):
                self._infraenv_recreated += 1
                return
            await self._wait_infraenv_ready(ensured.infraenv)

    async def _wait_recreated_infraenv(self) -> None:
        """Off the main loop: the hosts' creates wait for the discovery image themselves (retried
        until the InfraEnv has one); the tenant sees why, and a fixed order is still applied."""
        infraenv = InfraEnvRef.for_order(self._input.order)
        while True:
            await workflow.wait_condition(
                lambda: self._infraenv_recreated > self._infraenv_image_seen and not self._decommissioning
            )
            wanted = self._infraenv_recreated
            self._set_condition(
                OrderConditionType.INFRA_ENV_READY,
                ConditionStatus.FALSE,
                "WaitingForImage",
                "The InfraEnv was deleted and is created again; new hosts boot once its discovery image"
                " is ready. If this lasts, check spec.pullSecret and spec.sshPublicKey; a corrected order"
                " is applied.",
            )
            if await self._wait_infraenv_ready(infraenv):
                self._show_image_ready()
                self._infraenv_image_seen = wanted

    async def _refresh_security_groups(self) -> None:
        """The tenant may change `networkAttachment.securityGroupRefs` on a live order; its hosts
        must follow, or a host keeps what the old groups allowed. The subnet is immutable and stays."""
        assert self._facts is not None
        order = self._input.order
        try:
            facts = await self._hub(
                HubActivity.READ_ORDER, order, OrderFacts, summary=f"Read ClusterOrder {order.key}"
            )
        except ActivityError as err:
            if self._refresh_stopped():
                return
            # Refused for good: the hosts keep their groups; the next command or report tries again.
            workflow.logger.warning("ClusterOrder %s not read again: %s", order.key, err.cause or err)
            workflow.set_current_details(f"ClusterOrder {order.key} not read again: {err.cause or err}")
            self._order_edited = True
            return
        current, wanted = self._facts.network_attachment, facts.network_attachment
        if current is None or wanted is None or wanted.security_groups == current.security_groups:
            return
        self._facts = self._facts.model_copy(
            update={
                "network_attachment": current.model_copy(update={"security_groups": wanted.security_groups})
            }
        )
        # Every live BMI, whatever groups its worker started with: an earlier change may have
        # moved it (a revert to the first groups must move it back).
        if any(not s.deleted for s in self._slots.values()):
            self._security_groups_wanted += 1

    def _in_old_security_groups(self, slot: SlotRecord) -> bool:
        """A live worker started before the order's security groups changed: its BMIs are created
        with the old ones."""
        wanted = self._facts.network_attachment if self._facts is not None else None
        return (
            not slot.deleted
            and slot.spec.network is not None
            and wanted is not None
            and slot.spec.network.security_groups != wanted.security_groups
        )

    async def _keep_security_groups(self) -> None:
        """Off the main loop: a BMaaS outage holds this back, not the order's commands."""
        while True:
            await workflow.wait_condition(
                lambda: (
                    self._security_groups_wanted > self._security_groups_applied and not self._decommissioning
                )
            )
            wanted = self._security_groups_wanted
            refused = await self._apply_security_groups()
            if refused is None or not workflow.patched(ClusterPatch.SECURITY_GROUPS_ASKED_AGAIN.value):
                self._security_groups_applied = wanted
                continue
            self._set_condition(
                OrderConditionType.SECURITY_GROUPS_APPLIED,
                ConditionStatus.FALSE,
                REQUEST_REFUSED,
                (
                    f"The order's security groups [{', '.join(refused)}] could not be put on all its"
                    if refused
                    else "The order's hosts could not be taken out of their security groups on all its"
                )
                + " hosts yet; asked again shortly.",
            )

            # Asked again after a while, or at once for newer groups; a decommission ends it.
            def newer_or_decommissioning(asked: int = wanted) -> bool:
                return self._security_groups_wanted > asked or self._decommissioning

            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    newer_or_decommissioning, timeout=self._input.policy.prerequisite_recheck
                )

    async def _apply_security_groups(self) -> list[str] | None:
        """The order's security groups (maybe none) BMaaS refused to put its live BMIs in; None
        once it did."""
        assert self._facts is not None and self._facts.network_attachment is not None
        groups = self._facts.network_attachment.security_groups
        try:
            applied = await self._bmaas(
                BmaasActivity.APPLY_SECURITY_GROUPS,
                ApplySecurityGroupsInput(order=self._input.order, security_groups=groups),
                SecurityGroupsApplied,
                summary=f"Put the order's hosts in security groups [{', '.join(groups)}]",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            # BMaaS refused (a group that does not exist, a token mid-rotation): ops see why in the
            # details, the tenant (SECURITY_GROUPS_ASKED_AGAIN) that its hosts are not in them yet.
            workflow.logger.warning("security groups not applied: %s", err.cause or err)
            workflow.set_current_details(
                f"Security groups [{', '.join(groups)}] not applied: {err.cause or err}"
            )
            return list(groups)
        if applied.bmi_ids:
            workflow.logger.info("BMIs %s put in security groups %s", applied.bmi_ids, list(groups))
        if OrderConditionType.SECURITY_GROUPS_APPLIED in self._conditions:  # shown refused before
            self._set_condition(OrderConditionType.SECURITY_GROUPS_APPLIED, ConditionStatus.TRUE, "Applied")
        return None

    async def _wait_infraenv_ready(self, infraenv: InfraEnvRef, *, until_edited: bool = False) -> bool:
        """True once the discovery image is ready; False when a decommission (or, `until_edited`, a
        command) stopped the wait first. A hub that refuses to show the InfraEnv (a 401/403) is
        shown and asked again after `prerequisite_recheck`: with `until_edited` (the order's
        preparation, on the main loop) a command cuts that short and a long refusal continues as
        new; without (beside the main loop) the main loop's flags are left alone."""
        while True:
            try:
                ready = await self._until_decommissioned(
                    self._hub(
                        HubActivity.WAIT_INFRAENV_READY,
                        infraenv,
                        InfraEnvReady,
                        summary="Wait for the discovery image to be ready",
                        wait=True,
                    ),
                    or_edited=until_edited,
                )
                return ready is not None
            except ActivityError as err:
                self._show_wait_refusal(
                    err,
                    "The hub refused to show the InfraEnv; no new host boots until its discovery image"
                    " is seen ready.",
                )
            if not self._wait_stopped(until_edited):
                if until_edited:
                    await self._recheck_later()
                else:
                    with contextlib.suppress(TimeoutError):
                        await workflow.wait_condition(
                            lambda: self._decommissioning, timeout=self._input.policy.prerequisite_recheck
                        )
            if self._wait_stopped(until_edited):
                return False

    def _show_pull_secret_refused(
        self, err: ActivityError, consequence: str, reason: HubErrorType = HubErrorType.PULL_SECRET_INVALID
    ) -> None:
        """InfraEnvReady=False: no Secret to keep. The activity's message names the field and what is
        wrong, never the value."""
        assert isinstance(err.cause, ApplicationError)
        self._set_condition(
            OrderConditionType.INFRA_ENV_READY,
            ConditionStatus.FALSE,
            reason.value,
            f"{err.cause.message}{consequence}",
        )

    def _note_pull_secret(self, ensured: EnsureInfraEnvResult) -> None:
        refused = ensured.pull_secret_refused
        self._pull_secret_note = (
            None
            if refused is None
            else f"{refused}. The discovery image keeps the pull secret it was built with, and new hosts"
            " boot with it until that is corrected."
        )
        self._pull_secret_note_reason = ensured.pull_secret_refused_reason

    def _show_image_ready(self) -> None:
        if self._pull_secret_note is None:
            self._set_condition(OrderConditionType.INFRA_ENV_READY, ConditionStatus.TRUE, "ImageCreated")
        else:
            self._set_condition(
                OrderConditionType.INFRA_ENV_READY,
                ConditionStatus.TRUE,
                self._pull_secret_note_reason.value,
                self._pull_secret_note,
            )

    def _show_wait_refusal(self, err: ActivityError, message: str) -> None:
        """A hub wait the order's preparation needs ended for good (a refusal): shown, to be asked
        again. Raises it again where histories from before the patch failed the run, and for a
        cancellation of this workflow, which stays one."""
        if isinstance(err.cause, CancelledError) or not workflow.patched(
            ClusterPatch.HUB_WAIT_REFUSALS_ASKED_AGAIN.value
        ):
            raise err
        self._show_refusal(err, OrderConditionType.INFRA_ENV_READY, ConditionStatus.FALSE, message)

    def _wait_stopped(self, until_edited: bool) -> bool:
        """A decommission (or, `until_edited`, a command) made an image wait pointless."""
        return self._decommissioning or (until_edited and self._order_edited)

    def _plan(
        self, desired: dict[str, int], *, named_always_leave: bool
    ) -> tuple[dict[str, int], list[SlotRecord]]:
        """Slots to start per node set, and the slots to scale down (named ones first)."""
        starts: dict[str, int] = {}
        victims: list[SlotRecord] = []
        can_start = self._cluster is not None and self._facts is not None and not self._decommissioning
        for name in sorted(set(desired) | {s.spec.node_set for s in self._slots.values()}):
            active = sorted(
                (s for s in self._slots.values() if s.spec.node_set == name and _active(s)), key=_victim_rank
            )
            if named_always_leave:
                victims.extend(s for s in active if s.named_for_removal)
                active = [s for s in active if not s.named_for_removal]
            want = desired.get(name, 0)
            if can_start and name in desired and want > len(active) and not self._nodepool_missing(name):
                starts[name] = want - len(active)
            victims.extend(active[: max(len(active) - want, 0)])
        return starts, victims

    def _nodepool_of(self, node_set: str) -> str:
        return self._input.order.nodepool_name(self._node_sets[node_set].instance_type)

    def _nodepool_missing(self, node_set: str) -> bool:
        """Whether new workers of the node set wait for its NodePool (not seen yet in this run)."""
        return self._nodepool_of(node_set) not in self._nodepools_found and workflow.patched(
            ClusterPatch.NODEPOOLS_FOUND_BEFORE_HOSTS.value
        )

    def _nodepools_wanted(self) -> set[str]:
        """The NodePools not seen yet of the node sets that want more workers than they have."""
        if self._cluster is None or self._facts is None or self._decommissioning:
            return set()
        # Checked at every activation (a wait condition): once every NodePool was found, no slots
        # are counted.
        unseen = {
            name: pool
            for name in self._node_sets
            if (pool := self._nodepool_of(name)) not in self._nodepools_found
        }
        if not unseen:
            return set()
        active: Counter[str] = Counter(s.spec.node_set for s in self._slots.values() if _active(s))
        return {pool for name, pool in unseen.items() if self._node_sets[name].count > active[name]}

    async def _find_nodepools(self) -> None:
        """NODEPOOLS_FOUND_BEFORE_HOSTS: the cluster-provisioning flow makes a NodePool per node set
        (osac-reference §3); a worker started before its NodePool exists holds a host it cannot
        hand to anything. Looks for the NodePools the node sets wanting workers need, and again
        every `prerequisite_recheck` while one is missing (or sooner, when another is wanted),
        showing NodePoolNotFound meanwhile; False once none is missing or wanted."""
        while True:
            await workflow.wait_condition(
                lambda: (
                    bool(self._nodepools_wanted()) or self._decommissioning or self._nodepool_shown_missing()
                )
            )
            wanted = self._nodepools_wanted()
            if not wanted:
                if self._nodepool_shown_missing():  # its node set was removed, lowered or decommissioned
                    self._set_condition(
                        OrderConditionType.NODEPOOL_NOT_FOUND, ConditionStatus.FALSE, NOT_NEEDED
                    )
                if self._decommissioning:
                    return
                continue
            if not workflow.patched(ClusterPatch.NODEPOOLS_FOUND_BEFORE_HOSTS.value):
                return
            assert self._cluster is not None
            try:
                listed = await self._hub(
                    HubActivity.LIST_NODEPOOLS,
                    ClusterReleaseInput(order=self._input.order, cluster=self._cluster),
                    NodePoolNames,
                    summary=f"Look for the NodePools {', '.join(sorted(wanted))}",
                )
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):
                    raise
                self._show_refusal(
                    err,
                    OrderConditionType.NODEPOOL_NOT_FOUND,
                    ConditionStatus.TRUE,
                    "The hub refused to list the hosted cluster's NodePools; no host is allocated for"
                    " new workers until it does.",
                )
                listed = None
            found = wanted & set(listed.names if listed is not None else ())
            if found:
                self._nodepools_found |= found
                self._changed = True  # the main loop starts their workers
            missing = wanted - found
            if missing and listed is not None:
                self._set_condition(
                    OrderConditionType.NODEPOOL_NOT_FOUND,
                    ConditionStatus.TRUE,
                    NODEPOOL_NOT_FOUND,
                    f"No NodePool {', '.join(sorted(missing))} in {self._cluster.namespace}: the"
                    " cluster-provisioning flow makes one per node request; no host is allocated for"
                    " its workers until it exists.",
                )
            if missing:
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        functools.partial(self._nodepools_recheck_due, frozenset(wanted)),
                        timeout=self._input.policy.prerequisite_recheck,
                    )
            elif self._nodepool_shown_missing():
                self._set_condition(
                    OrderConditionType.NODEPOOL_NOT_FOUND, ConditionStatus.FALSE, NODEPOOLS_FOUND
                )

    def _nodepools_recheck_due(self, listed: frozenset[str]) -> bool:
        """Before the recheck interval: decommissioned, or another NodePool wanted than `listed`."""
        return self._decommissioning or bool(self._nodepools_wanted() - listed)

    def _nodepool_shown_missing(self) -> bool:
        shown = self._conditions.get(OrderConditionType.NODEPOOL_NOT_FOUND)
        return shown is not None and shown.status == ConditionStatus.TRUE

    def _new_slot(self, node_set: NodeSetRequest) -> SlotRecord:
        assert self._facts is not None and self._cluster is not None
        index = self._next_index
        self._next_index += 1
        spec = WorkerSlotSpec(
            order=self._input.order,
            node_set=node_set.name,
            instance_type=node_set.instance_type,
            index=index,
            release_image=self._release_image(),
            network=self._facts.network_attachment,
            cluster_namespace=self._cluster.namespace,
        )
        slot = SlotRecord(spec=spec, status=WorkerStatus(node_set=node_set.name, name=spec.name))
        self._slots[spec.name] = slot
        self._starting[spec.name] += 1  # until `_start_child` has started it
        return slot

    async def _start_new_child(self, slot: SlotRecord) -> None:
        """A new slot's worker. Its workflow id may still be held by a run this workflow did not
        start (a worker of an earlier run of the order still finishing, a `temporal workflow
        reset`): that run is never adopted but told to leave (its host released, as a victim's),
        and the slot dropped, so the next pass starts one on the next index (the other starts of
        the pass go on)."""
        try:
            await self._start_child(slot)
        except WorkflowAlreadyStartedError:
            if not workflow.patched(ClusterPatch.TAKEN_WORKER_IDS_SKIPPED.value):
                raise
            workflow.logger.warning(
                "worker workflow %s is held by a run this order did not start: slot %s skipped",
                self._child_id(slot),
                slot.spec.name,
            )
            del self._slots[slot.spec.name]
            self._touch()  # another pass of the main loop fills the count
            # The id is this order's, so the run is a worker of it that nobody tells to leave any
            # more (abandoned by a reset to before its start): released like a victim, not left
            # holding its host. One already leaving takes the signal as the no-op it is.
            try:
                await workflow.get_external_workflow_handle(self._child_id(slot)).signal(
                    WorkerNodeWorkflow.scale_down
                )
            except ApplicationError as err:
                workflow.logger.warning("could not tell %s to leave: %s", self._child_id(slot), err)

    async def _start_child(
        self, slot: SlotRecord, *, restart: bool = False, scale_down: bool = False
    ) -> None:
        """Start the slot's worker; `restart`: again, after its run was stopped from outside, from
        its last report (its next reports number on from it, so none is taken for a late copy)."""
        order = self._input.order
        progress = (
            WorkerProgress(
                status=slot.status,
                bmi_id=slot.status.resource_id,
                scale_down_requested=scale_down,
                restarted=True,
                # Above any report the stopped run's activities may still deliver late.
                report_sequence=slot.report_sequence + RESTART_REPORT_GAP,
            )
            if restart
            else None
        )
        if restart:  # a new slot counts from `_new_slot` on
            self._starting[slot.spec.name] += 1
        try:
            handle = await workflow.start_child_workflow(
                WorkerNodeWorkflow.run,
                WorkerNodeInput(
                    slot=slot.spec,
                    policy=self._input.policy,
                    bmaas_task_queue=self._input.bmaas_task_queue,
                    parent_workflow_id=cluster_workflow_id(order),
                    revision=CURRENT_WORKER_REVISION,
                    order_uid=self._order_uid(),
                    progress=progress,
                ),
                id=self._child_id(slot),
                # Children outlive a continue-as-new of this workflow; they talk to it by workflow id.
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=worker_start_attributes(
                    order.key,
                    slot.spec.node_set,
                    slot.status.phase.value if restart else WorkerPhase.PROVISIONING.value,
                    slot.status.attempt_count if restart else 1,
                ),
                static_summary=f"Worker {slot.spec.name} ({slot.spec.instance_type}) of {order.key}",
                static_details=(
                    f"Order: {order.key}\nNode set: {slot.spec.node_set}\nSlot: {slot.spec.name}\n"
                    f"Instance type: {slot.spec.instance_type}"
                ),
            )
        finally:
            self._starting[slot.spec.name] -= 1
            if self._starting[slot.spec.name] <= 0:
                del self._starting[slot.spec.name]
        if workflow.patched(ClusterPatch.TERMINATED_WORKERS_RESTARTED.value):
            self._watched.add(slot.spec.name)
            ended = asyncio.ensure_future(self._restart_if_terminated(slot, handle))
            self._child_ends.add(ended)  # held while it waits, dropped once done
            ended.add_done_callback(self._child_ends.discard)

    async def _restart_if_terminated(
        self, slot: SlotRecord, handle: workflow.ChildWorkflowHandle[Any, WorkerNodeResult]
    ) -> None:
        """Only a scale-down ends a worker; a run terminated from outside (the Web UI) held what its
        last report says: started again (`_restart_stopped`)."""
        try:
            await handle
            return
        except ChildWorkflowError as err:
            if not isinstance(err.cause, TerminatedError):
                return  # failed or cancelled: not this workflow's to undo
        await self._restart_stopped(slot)

    async def _restart_stopped(self, slot: SlotRecord) -> None:
        """Start again a worker whose run was stopped from outside: a Ready worker stays Ready on its
        host, a leaving one finishes its release, and one not yet Ready (or failed) releases what it
        held, from its last report and by the slot's name, and the order replaces it."""
        name = slot.spec.name
        if slot.deleted:  # its release ended as it should (slots are only dropped before a start)
            return
        leaving = slot.scale_down_sent or slot.status.phase in LEAVING_PHASES
        release = leaving or slot.status.phase != WorkerPhase.READY
        workflow.logger.warning(
            "worker %s was stopped from outside while %s: starting it again%s",
            name,
            slot.status.phase.value,
            " to release its host" if release else "",
        )
        if release and not leaving:
            slot.scale_down_sent = True
            self._touch()  # the main loop starts its replacement
        self._restarts_in_flight += 1
        try:
            await self._start_child(slot, restart=True, scale_down=release)
        except WorkflowAlreadyStartedError:
            # A tell started it a moment ago, or a reset run of it goes on: that run must leave too.
            if release:
                await self._tell_leaver_again(slot)
        except Exception as err:  # a background wait's: logged, not lost in a task nobody awaits
            workflow.logger.warning("could not start terminated worker %s again: %s", name, err)
        finally:
            self._restarts_in_flight -= 1

    async def _tell_worker(self, slot: SlotRecord, lost: LostInstance | None, *, leaves: bool = True) -> None:
        """Signal `scale_down` (no `lost`) or `host_lost` to the slot's worker, and with `leaves`
        `scale_down` after it (a worker of any version then leaves, the lost host shown as its
        reason). A worker only ends after a scale-down, so one that is not running while its slot is
        live was stopped from outside; it is started again to release what its stopped run held
        (without `leaves`, for a lost host, to come back on a new one)."""
        self._tells_in_flight += 1
        try:
            await self._signal_or_restart(slot, lost, leaves)
        finally:
            self._tells_in_flight -= 1

    async def _signal_or_restart(self, slot: SlotRecord, lost: LostInstance | None, leaves: bool) -> None:
        handle = workflow.get_external_workflow_handle(self._child_id(slot))
        leaves = leaves or lost is None

        async def tell() -> None:
            if lost is not None:
                await handle.signal(WorkerNodeWorkflow.host_lost, lost)
            if leaves:
                await handle.signal(WorkerNodeWorkflow.scale_down)

        try:
            await tell()
            return
        except ApplicationError as err:
            ended = slot.deleted and lost is None
            if ended and workflow.patched(ClusterPatch.ENDED_VICTIMS_LEFT_ALONE.value):
                # Its release ended meanwhile: what the scale-down asked for is done.
                workflow.logger.info("worker %s ended before it was told: %s", slot.spec.name, err)
                return
            # Only a live slot's worker is started again; a deleted one's ended as it should.
            if slot.deleted or not workflow.patched(ClusterPatch.STOPPED_WORKERS_RESTARTED.value):
                if lost is None:
                    raise
                workflow.logger.warning("could not tell worker %s: %s", slot.spec.name, err)
                return
            workflow.logger.warning("worker %s is not running (%s): starting it again", slot.spec.name, err)
        try:
            await self._start_child(slot, restart=True, scale_down=leaves)
            if leaves:
                return  # the new run starts with its scale-down
        except WorkflowAlreadyStartedError:
            pass  # another call (the host check, a scale-down) started it a moment ago: tell that run
        try:
            await tell()
        except ApplicationError as err:
            workflow.logger.warning("could not tell the restarted worker %s: %s", slot.spec.name, err)

    def _order_uid(self) -> str | None:
        return (self._facts.uid or None) if self._facts is not None else None

    def _child_id(self, slot: SlotRecord) -> str:
        return worker_workflow_id(self._input.order, slot.spec.name)

    # --------------------------------------------------------------------------------- status

    def _set_condition(
        self, kind: OrderConditionType, status: ConditionStatus, reason: str, message: str = ""
    ) -> None:
        new = Condition(type=kind.value, status=status, reason=reason, message=message)
        if self._conditions.get(kind) != new:
            self._conditions[kind] = new
            self._status_generation += 1

    def _current_conditions(self) -> list[Condition]:
        failed = sum(
            1 for s in self._slots.values() if not s.deleted and s.status.phase == WorkerPhase.FAILED
        )
        workers_failed = (
            Condition(
                type=OrderConditionType.WORKERS_FAILED.value,
                status=ConditionStatus.TRUE,
                reason="ProvisioningFailed",
                message=f"{failed} worker(s) failed to provision and are being retried.",
            )
            if failed
            else Condition(
                type=OrderConditionType.WORKERS_FAILED.value,
                status=ConditionStatus.FALSE,
                reason="NoFailures",
            )
        )
        conditions = {**self._conditions, OrderConditionType.WORKERS_FAILED: workers_failed}
        return [conditions[t] for t in sorted(conditions)]

    def _touch(self) -> None:
        self._changed = True
        self._status_generation += 1

    def _event(self, reason: EventReason, message: str, warning: bool = False) -> EventInput:
        return EventInput(
            order=self._input.order,
            reason=reason,
            message=message,
            type=EventType.WARNING if warning else EventType.NORMAL,
            key=str(workflow.uuid4()),  # deterministic: a retried publish writes the Event once
        )

    def _events_for(self, before: WorkerStatus, report: WorkerReport) -> list[EventInput]:
        name, after = before.name, report.status
        if report.deleted:
            return [self._event(EventReason.WORKER_DELETED, f"Worker {name} released; its host was wiped")]
        if after.phase == before.phase:
            return []
        if after.phase == WorkerPhase.WAITING_FOR_AGENT:
            return [self._event(EventReason.WORKER_CREATED, f"Worker {name} runs on BMI {after.resource_id}")]
        if after.phase == WorkerPhase.BINDING:
            return [self._event(EventReason.AGENT_CORRELATED, f"Worker {name} matched its agent by MAC")]
        if after.phase == WorkerPhase.READY:
            return [self._event(EventReason.WORKER_READY, f"Worker {name} joined the cluster")]
        if after.phase == WorkerPhase.FAILED:
            reason = after.last_failure_reason
            kind = (
                EventReason.AGENT_REGISTRATION_TIMEOUT
                if reason == FailureReason.AGENT_REGISTRATION_TIMEOUT
                else EventReason.WORKER_FAILED
            )
            return [
                self._event(
                    kind,
                    f"Worker {name} attempt {after.attempt_count} failed: {reason.value if reason else ''}",
                    warning=True,
                )
            ]
        return []

    def _ready_bmis(self) -> dict[str, SlotRecord]:
        """The BMIs of the Ready workers that stay (none being scaled down)."""
        return {
            s.status.resource_id: s
            for s in self._slots.values()
            if _active(s) and s.status.phase == WorkerPhase.READY and s.status.resource_id
        }

    async def _check_ready_hosts(self) -> None:
        """A Ready worker waits for its scale-down and nothing else, so a host that fails or is
        deleted behind our back (hardware, an admin) would stay allocated and counted Ready. Every
        `ready_host_check` while workers are Ready, one BMaaS list per order finds such hosts, and
        their workers are told to release and replace them. Only runs that recorded the patch check:
        the timer is new in their histories."""
        await workflow.wait_condition(lambda: bool(self._ready_bmis()) or self._decommissioning)
        if self._decommissioning or not workflow.patched(ClusterPatch.READY_HOSTS_CHECKED.value):
            return
        while not self._decommissioning:
            await workflow.wait_condition(lambda: bool(self._ready_bmis()) or self._decommissioning)
            await workflow.sleep(self._input.policy.ready_host_check)
            ready = self._ready_bmis()
            if not ready or self._decommissioning:
                continue
            try:
                found = await self._bmaas(
                    BmaasActivity.FIND_LOST_INSTANCES,
                    FindLostInstancesInput(order=self._input.order, bmi_ids=sorted(ready)),
                    LostInstances,
                    summary=f"Check that the hosts of {len(ready)} Ready worker(s) still run",
                )
            except ActivityError as err:
                workflow.logger.warning("checking the Ready workers' hosts failed: %s", err.cause or err)
                continue
            for lost in found.lost:
                slot = ready[lost.bmi_id]
                if lost.bmi_id not in self._ready_bmis() and workflow.patched(
                    ClusterPatch.LOST_HOSTS_TOLD_IF_STILL_READY.value
                ):
                    continue
                workflow.logger.warning("worker %s lost its host: %s", slot.spec.name, lost.describe())
                leaves = workflow.patched(ClusterPatch.LOST_HOSTS_REPLACED_BY_NEW_WORKERS.value)
                if leaves:
                    slot.scale_down_sent = True
                    # Said here, where it is decided, once: the worker may leave without saying why
                    # (told to leave as well before it read the news, restarted after a stop).
                    self._events.append(
                        self._event(
                            EventReason.WORKER_FAILED,
                            f"Worker {slot.spec.name} lost its host ({FailureReason.HOST_LOST.value}):"
                            " it is released and replaced",
                            warning=True,
                        )
                    )
                    self._touch()  # the main loop starts its replacement
                await self._tell_worker(slot, lost, leaves=leaves)

    def _leavers(self) -> dict[str, int]:
        """The slots told to leave, or leaving on their own (their run was cancelled), that have not
        reported their end, with their last report's number."""
        return {
            s.spec.name: s.report_sequence
            for s in self._slots.values()
            if (s.scale_down_sent or s.status.phase in LEAVING_PHASES) and not s.deleted
        }

    async def _look_after_leavers(self) -> None:
        """A worker is told to leave once, then reports until its host is wiped. One whose run was
        stopped from outside meanwhile (terminated in the Web UI) would never be told anything again:
        its host, and a decommission, would wait for ever. A `ready_host_check` after a look began,
        a slot that was leaving then and reported nothing since is told again (see `_tell_again_at`);
        a run that is not running is started again to finish the release, a running one takes it as
        a no-op. Only runs that recorded the patch look: the timer is new in their histories."""
        await workflow.wait_condition(lambda: bool(self._leavers()))
        if not workflow.patched(ClusterPatch.STOPPED_LEAVERS_RESTARTED.value):
            return
        while True:
            quiet = await self._quiet_at_next_look(
                self._leavers, self._quiet_looks, "Look after the leaving workers"
            )
            await asyncio.gather(*(self._tell_leaver_again(self._slots[name]) for name in quiet))

    async def _quiet_at_next_look(
        self, slots: Callable[[], dict[str, int]], quiet_looks: dict[str, int], summary: str
    ) -> list[str]:
        """Once `slots` names slots (with their last report's number), wait a `ready_host_check`
        and return those that reported nothing meanwhile and are due a look: at the 1st, 2nd, 4th
        and 8th quiet look in a row, then every 12th (`quiet_looks` counts them), so a wipe stuck
        for days is not looked at every time, and a run stopped meanwhile is still found."""
        await workflow.wait_condition(lambda: bool(slots()))
        seen = slots()
        try:  # a timer that their progress cancels: no wake-up once they all moved on
            await workflow.wait_condition(
                lambda: not slots(), timeout=self._input.policy.ready_host_check, timeout_summary=summary
            )
            return []
        except TimeoutError:
            self._history_limit.look()
        now = slots()
        quiet = {
            name: quiet_looks.get(name, 0) + 1 for name, sequence in seen.items() if now.get(name) == sequence
        }
        quiet_looks.clear()
        quiet_looks.update(quiet)
        return [name for name, looks in quiet.items() if _tell_again_at(looks)]

    def _earlier_before_ready(self) -> dict[str, int]:
        """The slots staying whose worker an earlier run started and that are not Ready (nor
        leaving: `_look_after_leavers` has those), with their last report's number."""
        return {
            s.spec.name: s.report_sequence
            for s in self._slots.values()
            if _active(s)
            and s.status.phase != WorkerPhase.READY
            and s.status.phase not in LEAVING_PHASES
            and s.spec.name not in self._watched
            and s.spec.name not in self._starting
        }

    async def _look_after_earlier_workers(self) -> None:
        """This run sees the end of the workers it started, not of those an earlier run started. A
        Ready one waits to be told anything, and is started again then if it was stopped; one not yet
        Ready would hold the order short of its count, and its host, for ever. A `ready_host_check`
        after a look began, such a slot that reported nothing since is looked up in Temporal (at the
        quiet looks `_tell_again_at` picks) and, if its run was terminated, started again. Only runs
        that recorded the patch look: the timer and the activity are new in their histories."""
        await workflow.wait_condition(lambda: bool(self._earlier_before_ready()))
        if not workflow.patched(ClusterPatch.EARLIER_WORKERS_LOOKED_AFTER.value):
            return
        while True:
            quiet = await self._quiet_at_next_look(
                self._earlier_before_ready,
                self._earlier_quiet_looks,
                "Look after the workers of an earlier run not yet Ready",
            )
            looked_up = {self._child_id(self._slots[name]): name for name in quiet}
            if not looked_up:
                continue
            try:
                stopped = await self._hub(
                    HubActivity.FIND_STOPPED_WORKERS,
                    FindStoppedWorkersInput(workflow_ids=sorted(looked_up)),
                    StoppedWorkers,
                    summary=f"Check that {len(looked_up)} quiet worker(s) of an earlier run still run",
                )
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):
                    raise  # the run is ending
                workflow.logger.warning("looking up the earlier run's workers failed: %s", err.cause or err)
                continue
            # A tell may have started one again meanwhile: then this run watches it.
            still_earlier = self._earlier_before_ready()
            restarted = [
                self._slots[looked_up[workflow_id]]
                for workflow_id in stopped.workflow_ids
                if looked_up[workflow_id] in still_earlier
            ]
            await asyncio.gather(*(self._restart_stopped(slot) for slot in restarted))

    async def _tell_leaver_again(self, slot: SlotRecord) -> None:
        try:
            await self._tell_worker(slot, None)
        except ApplicationError as err:  # it ended meanwhile; its report is on its way
            workflow.logger.warning("could not tell leaving worker %s again: %s", slot.spec.name, err)

    async def _publish_loop(self) -> None:
        """Coalesce status changes into few ClusterOrder writes: what changes while a write is in
        flight goes in the next. The optional window is always the same timer (from the input),
        never a branch on elapsed workflow time, which replay after a worker crash did not reproduce."""
        while True:
            await workflow.wait_condition(
                lambda: (
                    self._status_generation > self._published_generation
                    and (self._publish_until is None or self._published_generation < self._publish_until)
                )
            )
            if self._input.policy.status_coalesce and self._status_writes_paced:
                await _sleep_never_cancelled(
                    self._input.policy.status_coalesce, summary=STATUS_COALESCE_SUMMARY
                )
                self._history_limit.look()
            elif self._input.policy.status_coalesce:
                await workflow.sleep(self._input.policy.status_coalesce)
                self._history_limit.look()
            generation = self._status_generation
            status = self.status()
            failed = sum(1 for w in status.workers if w.phase == WorkerPhase.FAILED)
            record_order_counts(self._input.order, status.desired_workers, status.ready_workers, failed)
            events, self._events = self._events, []
            self._events_in_flight = events  # a continue-as-new that gives the write up carries them
            last_write = self._publish_until is not None
            try:
                await self._publish(status, events)
            except (ActivityError, ApplicationError) as err:
                # A rejected write must not stop later ones: keep the events, try again later.
                workflow.logger.warning("publishing the order status failed: %s", err)
                self._events = events + self._events
                self._events_in_flight = []
                self._publish_failures += 1
                if self._status_writes_paced:
                    if self._publishing_stopped:
                        return  # given up by the flush, whose cancel ends the write as a failure
                    self._last_write_refused = last_write and _refused(err)
                    await self._wait_after_a_failed_write(last_write)
                else:
                    await workflow.sleep(FAILED_STATUS_WRITE_PAUSE)
                    self._history_limit.look()  # a hub failing the writes for days: the run still ends
                continue
            self._events_in_flight = []
            self._published_generation = generation
            self._failed_writes_in_a_row = 0

    async def _wait_after_a_failed_write(self, last_write: bool) -> None:
        """As CALL_RETRY backs off for the first STATUS_WRITE_ATTEMPTS, then FAILED_STATUS_WRITE_PAUSE;
        cut short by a run's last write beginning, unless the failed write was that one."""

        def last_write_began() -> bool:
            return self._publish_until is not None and not last_write

        if last_write_began():
            return  # it is tried at once, backing off from the start
        self._failed_writes_in_a_row += 1
        failed = self._failed_writes_in_a_row
        wait = call_backoff(failed) if failed < STATUS_WRITE_ATTEMPTS else FAILED_STATUS_WRITE_PAUSE
        if await _sleep_never_cancelled(
            wait, summary=FAILED_STATUS_WRITE_PAUSE_SUMMARY, cut_short=last_write_began
        ):
            self._history_limit.look()  # a hub failing the writes for days: the run still ends

    async def _publish(self, status: ClusterWorkersStatus, events: list[EventInput]) -> None:
        local = workflow.patched(ClusterPatch.STATUS_PUBLISHED_LOCALLY.value)
        await self._hub(
            HubActivity.PUBLISH_ORDER_STATUS,
            PublishStatusInput(
                order=self._input.order,
                workers=status.workers,
                desired=status.desired_workers,
                current=status.current_workers,
                ready=status.ready_workers,
                conditions=status.conditions,
                events=events,
            ),
            None,
            summary=f"Publish status: {status.ready_workers}/{status.desired_workers} ready"
            + (f", {len(events)} event(s)" if events else ""),
            local=local,
            attempts=self._status_write_attempts() if local and self._history_limit.kept else 0,
        )

    def _status_write_attempts(self) -> int:
        """A write's attempts in a run that keeps the suggestion to continue as new."""
        return 1 if self._status_writes_paced else STATUS_WRITE_ATTEMPTS

    async def _flush_status(self, publisher: asyncio.Future[None], *, or_give_up: bool = False) -> None:
        """Write the latest status, then stop the publisher. `or_give_up`: a write refused, or not
        through within a call timeout (retried on a hub answering 5xx), is given up: its events stay
        in `_events_in_flight` and `_events` to carry over, as do those of changes made meanwhile."""
        self._status_generation += 1
        failures = self._publish_failures

        def flushed() -> bool:
            return self._published_generation >= self._status_generation or (
                or_give_up and self._publish_failures > failures
            )

        if or_give_up and workflow.patched(ClusterPatch.LAST_STATUS_WRITE_FIXED.value):
            target = self._publish_until = self._status_generation
            give_up = asyncio.ensure_future(
                workflow.sleep(self._input.policy.call_timeout, summary=STATUS_FLUSH_GIVE_UP)
            )
            # Paced: only its own refusal gives the write up before its timer; a failing one is
            # tried on, backing off from the start again.
            self._failed_writes_in_a_row = 0

            def given_up() -> bool:
                if self._status_writes_paced:
                    return self._last_write_refused
                return self._publish_failures > failures

            await workflow.wait_condition(
                lambda: self._published_generation >= target or given_up() or give_up.done()
            )
        elif or_give_up:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(flushed, timeout=self._input.policy.call_timeout)
        else:
            await workflow.wait_condition(flushed)
        self._publishing_stopped = True
        publisher.cancel()

    async def _continue_as_new(self, publisher: asyncio.Future[None]) -> None:
        self._end_if_cancelled()  # the next run would not know of it
        # A hub refusing the status writes (an outage, a role a rollout forgot) must not hold the
        # continue-as-new: the run would take no command until the server's history limit ended it.
        # The new run writes the status at its start, with the events carried over.
        await self._flush_status(
            publisher, or_give_up=workflow.patched(ClusterPatch.CONTINUE_AS_NEW_PAST_A_REFUSED_STATUS.value)
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._restarts_in_flight:  # no yield otherwise: histories from before it replay as they ran
            # A terminated worker being started again: its start must not be dropped with this run.
            await workflow.wait_condition(lambda: self._restarts_in_flight == 0)
        if self._tells_in_flight and workflow.patched(ClusterPatch.TELLS_SENT_BEFORE_CONTINUE_AS_NEW.value):
            await workflow.wait_condition(
                lambda: self._tells_in_flight == 0 and self._restarts_in_flight == 0
            )
        carried = ClusterWorkersCarried(
            slots=[s for s in self._ordered_slots() if not s.deleted],
            next_index=self._next_index,
            decommissioning=self._decommissioning,
            ignored_scale_downs=self._ignored_scale_downs[-20:],
            facts=self._facts,
            # Not yet prepared: without the cluster, code that predates `preparing` prepares again too.
            cluster=None if self._preparing else self._cluster,
            cluster_release=self._cluster_release,
            order_generation=self._order_generation,
            security_groups_pending=self._security_groups_wanted > self._security_groups_applied,
            preparing=self._preparing,
            order_edited=self._order_edited,
            infraenv_image_pending=self._infraenv_recreated > self._infraenv_image_seen,
            # The newest only: a refusal lasting days must not outgrow the new run's input.
            events=(self._events_in_flight + self._events)[-CARRIED_EVENTS_MAX:],
            infraenv_missing=self._infraenv_missing,
            pull_secret_note=self._pull_secret_note,
            pull_secret_note_reason=self._pull_secret_note_reason,
            conditions=[c for c in self._current_conditions() if c.type != OrderConditionType.WORKERS_FAILED],
        )
        workflow.continue_as_new(
            self._input.model_copy(
                update={
                    "node_sets": sorted(self._node_sets.values(), key=lambda n: n.name),
                    "instance_types": sorted(self._instance_types),
                    "carried": carried,
                }
            )
        )

    # ------------------------------------------------------------------------------- helpers

    def _release_image(self) -> str:
        """Known once `_prepare` resolved the boot image, before any worker can start."""
        release = (self._facts.release_image if self._facts else None) or self._cluster_release
        assert release is not None, "no release before the first worker"
        return release

    def _ordered_slots(self) -> list[SlotRecord]:
        return sorted(self._slots.values(), key=lambda s: s.spec.index)

    async def _bmaas(self, name: BmaasActivity, arg: Any, result_type: type[T] | None, *, summary: str) -> T:
        """A BMaaS call, retried until answered; one that keeps failing shows the order's condition."""
        self._end_if_cancelled()  # this workflow's cancel, taken in by a call that ended
        self._bmaas_calls += 1
        call = self._bmaas_calls

        def show(failing: FailingRequests | None) -> None:
            if failing is None:
                if self._bmaas_failing.pop(call, None) is not None:
                    self._show_bmaas_failing()
            elif call not in self._bmaas_failing:
                self._bmaas_failing[call] = failing
                self._show_bmaas_failing()

        async def call_round(attempts: int, failing: bool) -> T:
            # A remote call each round: looked after at the end of each (an outage's is half an hour).
            return await self._call(
                name.value,
                arg,
                result_type,
                summary=summary,
                task_queue=self._input.bmaas_task_queue,
                attempts=attempts,
                failing=failing,
            )

        return await bmaas_call_through_outages(
            call_round, policy=self._input.policy, name=name.value, on_failing=show
        )

    def _show_bmaas_failing(self) -> None:
        """FulfillmentServiceUnavailable while a BMaaS call of the order or of a worker keeps failing;
        False once none does (a refusal shown while preparing is that step's to clear)."""
        workers = [s.bmaas_failing for s in self._ordered_slots() if s.bmaas_failing and not s.deleted]
        failing = sorted([*workers, *self._bmaas_failing.values()], key=lambda f: f.since)
        shown = self._conditions.get(OrderConditionType.FULFILLMENT_SERVICE_UNAVAILABLE)
        if failing:
            whose = [f"for {len(workers)} worker(s)"] if workers else []
            if self._bmaas_failing:
                whose.append("for the order")
            self._set_condition(
                OrderConditionType.FULFILLMENT_SERVICE_UNAVAILABLE,
                ConditionStatus.TRUE,
                REQUESTS_FAILING,
                f"The bare-metal service has not answered requests {' and '.join(whose)} since"
                f" {failing[0].since.strftime('%Y-%m-%dT%H:%M:%SZ')}; they are retried until it does.",
            )
        elif shown is not None and shown.reason == REQUESTS_FAILING:
            self._set_condition(
                OrderConditionType.FULFILLMENT_SERVICE_UNAVAILABLE, ConditionStatus.FALSE, AVAILABLE
            )

    async def _hub(
        self,
        name: HubActivity,
        arg: Any,
        result_type: type[T] | None,
        *,
        summary: str,
        wait: bool = False,
        local: bool = False,
        attempts: int = 0,
    ) -> T:
        self._end_if_cancelled()  # this workflow's cancel, taken in by a call that ended
        return await self._call(
            name.value, arg, result_type, summary=summary, wait=wait, local=local, attempts=attempts
        )

    async def _call(
        self,
        name: str,
        arg: Any,
        result_type: type[T] | None,
        *,
        summary: str,
        local: bool = False,
        **options: Any,
    ) -> T:
        """One call of the order's. A remote one's end is recorded, so the suggestion to continue as
        new is looked at there; a local one's result may come in a task replay does not see."""
        look = not local
        try:
            return await call_activity(
                name, arg, result_type, policy=self._input.policy, summary=summary, local=local, **options
            )
        except GeneratorExit:
            look = False  # closed with its run (evicted from the cache): no workflow left to look at
            raise
        finally:
            if look:
                self._history_limit.look()


def _tell_again_at(quiet_looks: int) -> bool:
    """The 1st, 2nd, 4th and 8th quiet look in a row, then every 12th."""
    return quiet_looks in (1, 2, 4, 8) or quiet_looks % 12 == 0


async def _sleep_never_cancelled(
    duration: timedelta, *, summary: str | None = None, cut_short: Callable[[], bool] = lambda: False
) -> bool:
    """Wait `duration` on a timer that is not cancelled when this wait is cancelled or cut short
    (`cut_short` returns True): it is left to fire. Whether it fired."""
    timer = asyncio.ensure_future(workflow.sleep(duration, summary=summary))
    await workflow.wait_condition(lambda: timer.done() or cut_short())
    return timer.done()


def _refused(err: ActivityError | ApplicationError) -> bool:
    """The hub refused the call, as its activity decided (a non-retryable error), as against failing
    (5xx, unanswered: a local call's retries ran out, a remote one's timed out)."""
    cause = err.cause if isinstance(err, ActivityError) else err
    return isinstance(cause, ApplicationError) and cause.non_retryable


def _active(slot: SlotRecord) -> bool:
    return not slot.deleted and not slot.scale_down_sent


def _is_type(err: ActivityError, error_type: str) -> bool:
    return isinstance(err.cause, ApplicationError) and err.cause.type == error_type
