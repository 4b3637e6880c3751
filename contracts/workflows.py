"""Payloads of the two workflows: inputs, updates, signals, query results and carried state.

Everything here is non-secret: the pull secret, the ignition and tokens stay inside activities.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import IntEnum, StrEnum

from pydantic import BaseModel, Field

from contracts.hub import AgentMatch, Condition, EventInput, HubErrorType, OrderFacts, PullSecretRefusal
from contracts.refs import DNS_LABEL, ClusterReference, NetworkAttachmentRef, OrderRef
from contracts.worker import (  # noqa: F401  (WorkerReport(s): the signals' payloads, re-exported)
    FailingRequests,
    FailureReason,
    TimingPolicy,
    WorkerPhase,
    WorkerReport,
    WorkerReports,
    WorkerStatus,
)

WORKFLOW_TASK_QUEUE = "osac-workers"
BMAAS_TASK_QUEUE = "osac-workers-bmaas"
DEFAULT_MAX_WORKERS_PER_ORDER = 100


def cluster_workflow_id(order: OrderRef) -> str:
    return f"cluster-workers/{order.namespace}/{order.name}"


def worker_workflow_id(order: OrderRef, slot_name: str) -> str:
    return f"worker/{order.namespace}/{order.name}/{slot_name}"


class NodeSetRequest(BaseModel):
    """One bare-metal entry of `spec.nodeRequests`: its name is its instance type."""

    name: str = Field(pattern=DNS_LABEL)
    instance_type: str = Field(pattern=DNS_LABEL)
    # Not constrained here: the set_node_sets validator names the field when a count is negative,
    # which a constraint would pre-empt with a bare decoding failure for callers on the wire.
    count: int


class SetNodeSets(BaseModel):
    node_sets: list[NodeSetRequest]
    # Required for a mass scale-down (see ScaleDownGuard); decommission never needs it.
    confirm_scale_down: bool = False
    # The ClusterOrder generation the command comes from (the controller's), so the status can say
    # which edit of the order the workflow has seen even when the counts did not change.
    order_generation: int | None = Field(default=None, ge=0)
    # The instance types BMaaS offers now (the caller's catalog), so a type added after the order
    # started is accepted; None keeps the ones the workflow knows.
    instance_types: list[str] | None = None
    # The node sets the caller saw when it decided (compare-and-swap): a change decided on a state
    # that changed since (another controller's newer edit, a named scale-down) is refused, not
    # applied over it. None: no expectation (a new order, a caller that does not look first).
    expected_node_sets: list[NodeSetRequest] | None = None


def same_node_sets(a: Iterable[NodeSetRequest], b: Iterable[NodeSetRequest]) -> bool:
    """The same sets with the same types and counts, in whatever order."""

    def key(sets: Iterable[NodeSetRequest]) -> dict[str, tuple[str, int]]:
        return {n.name: (n.instance_type, n.count) for n in sets}

    return key(a) == key(b)


# The ApplicationError type of a set_node_sets refused because the workflow's node sets changed since
# its caller looked: not the tenant's bad input; look again.
NODE_SETS_SUPERSEDED = "NodeSetsSuperseded"


def change_superseded(command: SetNodeSets, node_sets: Iterable[NodeSetRequest]) -> str | None:
    """Why a change decided on node sets the workflow no longer has must not be applied over them;
    None when it may. (Not the generation: an order restored from a backup counts from 1 again.)"""
    expected = command.expected_node_sets
    if expected is not None and not same_node_sets(expected, node_sets):
        return "expected_node_sets: the node sets changed since the caller looked"
    return None


CONFIRM_SCALE_DOWN_ANNOTATION = "osac.openshift.io/confirm-scale-down"


class ScaleDownGuard(BaseModel):
    """A mistyped count must not wipe many hosts at once: a large reduction needs a confirmation."""

    max_fraction: float = Field(default=0.5, ge=0, le=1)
    max_workers: int = Field(default=2, ge=0)

    def refusal(self, current: int, requested: int, removed: int, field: str) -> str | None:
        """Why going from `current` to `requested` workers, `removed` of them leaving (more than
        `current - requested` when node sets are swapped), needs confirming, or None."""
        if removed <= self.max_workers or removed <= current * self.max_fraction:
            return None
        change = (
            f"lowering the order from {current} to {requested} workers"
            if removed == current - requested
            else f"changing the order's node sets ({current} workers now, {requested} requested)"
        )
        return (
            f"{field}: {change} removes"
            f" {removed} at once (more than {self.max_fraction:.0%} of the order and more than"
            f" {self.max_workers} workers);"
            " confirm it (CLI --confirm, the ClusterOrder annotation"
            f" {CONFIRM_SCALE_DOWN_ANNOTATION}=true, or confirm_scale_down in the library call)"
        )


def workers_removed(current: Sequence[NodeSetRequest], node_sets: Sequence[NodeSetRequest]) -> int:
    """How many workers going from `current` to `node_sets` releases, counted per node set (a node
    set given another instance type releases all its workers)."""
    requested = {n.name: n.count for n in node_sets}
    return sum(max(n.count - requested.get(n.name, 0), 0) for n in current)


class NodeSetFields:
    """How a node-set refusal names the fields: as the command has them (`SetNodeSets.node_sets`);
    a caller that took the node sets from elsewhere (a ClusterOrder) names its own."""

    counts = "node_sets[].count"

    def instance_type(self, index: int) -> str:
        return f"node_sets[{index}].instance_type"

    def count(self, index: int) -> str:
        return f"node_sets[{index}].count"


def node_set_problem(
    node_sets: Sequence[NodeSetRequest],
    instance_types: Iterable[str],
    max_workers_per_order: int | None,
    *,
    current: Sequence[NodeSetRequest] = (),
    confirm_scale_down: bool = False,
    guard: ScaleDownGuard | None = None,
    order: OrderRef | None = None,
    next_index: int = 0,
    fields: NodeSetFields | None = None,
) -> str | None:
    """The first broken node-set rule, as a message naming the field, or None. The one statement
    of the rules: `ClusterWorkersWorkflow.set_node_sets` refuses with it, and the controller and the
    CLI check it before they send a command, so an order is refused without starting a workflow.

    `instance_types`: the known ones (none known: any), checked only for the node sets that would
    get new hosts (new, raised, or given another type): a type BMaaS withdrew can still be lowered,
    released or left as it is while another node set changes. `current`: the node sets the workflow
    holds now (none before it exists), for the guard against mass scale-downs: the workers leaving
    are counted per node set, so renaming a node set's instance type removes all its workers. `order`
    and `next_index` (the next worker slot's index): for the names new workers would be given.
    `fields`: how the message names the fields (default: the command's). `max_workers_per_order`
    None: not checked (a running workflow keeps the maximum it was started with)."""
    fields = fields or NodeSetFields()
    names = [n.name for n in node_sets]
    for name in sorted({n for n in names if names.count(n) > 1}):
        return f"node_sets[].name: duplicate node set {name!r}"
    known = set(instance_types)
    held = {n.name: n for n in current}
    for i, node_set in enumerate(node_sets):
        if node_set.count < 0:
            return f"{fields.count(i)}: must not be negative (got {node_set.count})"
        before = held.get(node_set.name)
        needs_hosts = (
            before is None or node_set.instance_type != before.instance_type or node_set.count > before.count
        )
        if known and needs_hosts and node_set.instance_type not in known:
            return (
                f"{fields.instance_type(i)}: unknown instance type {node_set.instance_type!r}"
                f" (known: {', '.join(sorted(known))})"
            )
    total = sum(n.count for n in node_sets)
    current_counts = {n.name: n.count for n in current}
    current_total = sum(current_counts.values())
    if not confirm_scale_down:
        removed = workers_removed(current, node_sets)
        refusal = (guard or ScaleDownGuard()).refusal(current_total, total, removed, fields.counts)
        if refusal:
            return refusal
    if max_workers_per_order is not None and total > max_workers_per_order:
        return f"{fields.counts}: {total} workers exceed the maximum of {max_workers_per_order} per order"
    if order is not None:  # only new workers need new names
        for node_set in node_sets:
            if node_set.count > current_counts.get(node_set.name, 0):
                problem = order.long_name_problem(node_set.instance_type, next_index + total)
                if problem:
                    return problem
    return None


class OrderConditionType(StrEnum):
    INFRA_ENV_READY = "InfraEnvReady"
    WORKERS_FAILED = "WorkersFailed"
    RHCOS_IMAGE_NOT_FOUND = "RHCOSImageNotFound"
    FULFILLMENT_SERVICE_UNAVAILABLE = "FulfillmentServiceUnavailable"
    SECURITY_GROUPS_APPLIED = "SecurityGroupsApplied"
    NODEPOOL_NOT_FOUND = "NodePoolNotFound"


class WorkerSlotSpec(BaseModel):
    """What a worker slot is, fixed for its whole life."""

    order: OrderRef
    node_set: str
    instance_type: str
    index: int
    release_image: str
    network: NetworkAttachmentRef | None = None
    cluster_namespace: str  # where the hosted cluster's NodePools live

    @property
    def name(self) -> str:
        return self.order.worker_name(self.index)

    @property
    def nodepool_name(self) -> str:
        return self.order.nodepool_name(self.instance_type)


class FailedAttempt(BaseModel):
    """The failure an attempt ended with, shown to the tenant again once its host is released."""

    reason: FailureReason
    message: str
    time: datetime


class WorkerProgress(BaseModel):
    """The worker's carried state: enough to resume after continue-as-new."""

    status: WorkerStatus
    bmi_id: str | None = None
    macs: list[str] = Field(default_factory=list)
    agent_name: str | None = None
    agent_handed: bool = False
    failures_in_a_row: int = 0
    ready_since: datetime | None = None
    # When the slot first entered Provisioning: provisioning time counts every attempt.
    provisioning_since: datetime | None = None
    scale_down_requested: bool = False
    # The registration deadline of the current attempt, set when it starts waiting for its Agent.
    agent_deadline: datetime | None = None
    report_sequence: int = 0  # of the latest status change; see WorkerReport.sequence
    # Started again by the cluster workflow after its run was stopped from outside (terminated in
    # the Web UI, say): what that run held is known only from its last report, so the release finds
    # the Agent handed to the slot by its label and the BMIs by the slot's name.
    restarted: bool = False
    # The current attempt's create ended unanswered (timed out, or given up while a scale-down asked
    # to cancel it): it may yet make the slot's BMI, so the release looks for it once it cannot.
    create_unsettled: bool = False
    # A failed attempt's release under way: a release can outlast a run (a drain that hangs), so the
    # next run finishes it, then backs off from this failure before the next attempt.
    releasing_failed_attempt: FailedAttempt | None = None
    # A BMaaS request of the current step that keeps failing; reported until it is answered.
    bmaas_failing: FailingRequests | None = None


class WorkerRevision(IntEnum):
    """What a WorkerNodeWorkflow does, fixed when it starts and carried by continue-as-new: a worker
    started by an earlier release keeps replaying the way it ran, at no history cost."""

    # Every status change a signal of the worker workflow; every activity a remote one.
    SIGNALLED_REPORTS = 1
    # Status changes delivered by the activities that start or end a phase; the Agent lookup (a
    # read of the process's cache) runs as a local activity.
    ACTIVITY_REPORTS = 2
    # One heartbeating activity waits for the host's Agent and hands it to the NodePool: no timer,
    # signal or workflow task between registration and approval, the same events however long the
    # host takes; the release unbinds an Agent that activity handed before it was cancelled.
    AGENT_HANDED_IN_WAIT = 3


CURRENT_WORKER_REVISION = WorkerRevision.AGENT_HANDED_IN_WAIT


class WorkerNodeInput(BaseModel):
    slot: WorkerSlotSpec
    policy: TimingPolicy = Field(default_factory=TimingPolicy)
    bmaas_task_queue: str = BMAAS_TASK_QUEUE
    parent_workflow_id: str | None = None
    progress: WorkerProgress | None = None  # set only by continue-as-new
    # Absent in the inputs of workers started before revisions existed, which ran as the first.
    revision: WorkerRevision = WorkerRevision.SIGNALLED_REPORTS
    # The ClusterOrder's uid, put on every report (`WorkerReport.order_uid`).
    order_uid: str | None = None


class WorkerOutcome(StrEnum):
    DELETED = "Deleted"


class WorkerNodeResult(BaseModel):
    name: str
    outcome: WorkerOutcome
    attempts: int


class AgentRegistered(BaseModel):
    """Signal `agent_registered`: the watch of watch_agent_for_macs found the worker's Agent (or
    found two, `failure_reason` AmbiguousAgentMatch). `bmi_id` ties it to one attempt: a late
    signal about an earlier attempt's host is ignored."""

    bmi_id: str
    match: AgentMatch | None = None
    failure_reason: FailureReason | None = None
    failure_message: str | None = None


class ClusterWorkersInput(BaseModel):
    order: OrderRef
    node_sets: list[NodeSetRequest] = Field(default_factory=list)
    instance_types: list[str] = Field(default_factory=list)  # known types, refreshed by each command
    max_workers_per_order: int = DEFAULT_MAX_WORKERS_PER_ORDER
    scale_down_guard: ScaleDownGuard = Field(default_factory=ScaleDownGuard)
    policy: TimingPolicy = Field(default_factory=TimingPolicy)
    bmaas_task_queue: str = BMAAS_TASK_QUEUE
    carried: ClusterWorkersCarried | None = None  # set only by continue-as-new


class SlotRecord(BaseModel):
    spec: WorkerSlotSpec
    status: WorkerStatus
    scale_down_sent: bool = False
    named_for_removal: bool = False
    deleted: bool = False
    report_sequence: int = 0  # the highest WorkerReport.sequence taken
    bmaas_failing: FailingRequests | None = None  # as the worker last reported


class ClusterWorkersCarried(BaseModel):
    slots: list[SlotRecord]
    next_index: int
    decommissioning: bool
    ignored_scale_downs: list[str] = Field(default_factory=list)
    # What the previous run already established, so a new run does not redo it.
    facts: OrderFacts | None = None
    cluster: ClusterReference | None = None
    conditions: list[Condition] = Field(default_factory=list)
    # The hosted cluster's release, read when the order names no `releaseImage`.
    cluster_release: str | None = None
    order_generation: int | None = None
    # The order's security groups were still to be put on some of its BMIs.
    security_groups_pending: bool = False
    # Continued as new while waiting for a prerequisite (`facts` and `cluster` may be set already).
    preparing: bool = False
    # A command arrived that the previous run had not yet brought the InfraEnv and the security
    # groups in line with (it continued as new first).
    order_edited: bool = False
    # The InfraEnv had been created again and its discovery image was still awaited.
    infraenv_image_pending: bool = False
    # Events the previous run could not write (the hub refused its status writes), and whether a
    # worker had found the InfraEnv gone: the new run writes and acts on them.
    events: list[EventInput] = Field(default_factory=list)
    infraenv_missing: bool = False
    # The order's pull secret was refused and the InfraEnv kept its Secret: what the order shows,
    # and its reason (PullSecretInvalid or PullSecretMissing).
    pull_secret_note: str | None = None
    pull_secret_note_reason: PullSecretRefusal = HubErrorType.PULL_SECRET_INVALID


class ClusterWorkersStatus(BaseModel):
    order: OrderRef
    node_sets: list[NodeSetRequest]
    desired_workers: int
    current_workers: int
    ready_workers: int
    workers: list[WorkerStatus]
    conditions: list[Condition]
    decommissioning: bool
    finished: bool
    ignored_scale_downs: list[str]
    # The latest ClusterOrder generation a `set_node_sets` came from (None: none said).
    order_generation: int | None = None
    # The maximum of workers the run was started with, which it keeps (None: a worker older than
    # the field), so callers check a change by the workflow's own rule before they write it.
    max_workers_per_order: int | None = None


class ScaleDownWorker(BaseModel):
    name: str


class ReleasedWorker(BaseModel):
    """Update `release_worker`: the named worker leaves. `node_set` is its node set with the count the
    workflow lowered it to (the count 0 when the node set went meanwhile, by another command)."""

    worker: str
    node_set: NodeSetRequest


class FindStoppedWorkersInput(BaseModel):
    """Activity `find_stopped_workers`: worker workflow ids the cluster workflow has no handle on."""

    workflow_ids: list[str] = Field(min_length=1)


class StoppedWorkers(BaseModel):
    """Of the ids asked about, those whose latest run was terminated from outside or that no longer
    exist (deleted): nobody would ever release what they held."""

    workflow_ids: list[str]


# A worker in these phases is on its way out (its scale-down, a lost host or the decommission).
LEAVING_PHASES = frozenset({WorkerPhase.UNBINDING, WorkerPhase.DELETING})


# The ClusterOrder CRD: "CurrentWorkers is the number of workers in a non-terminal phase
# (Provisioning, WaitingForAgent, Binding, or Ready)". A Failed worker holds no host while it backs off.
CURRENT_PHASES = frozenset(
    {WorkerPhase.PROVISIONING, WorkerPhase.WAITING_FOR_AGENT, WorkerPhase.BINDING, WorkerPhase.READY}
)


def is_current(phase: WorkerPhase) -> bool:
    return phase in CURRENT_PHASES


ClusterWorkersInput.model_rebuild()
