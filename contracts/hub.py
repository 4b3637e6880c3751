"""Inputs, outputs and error types of the hub activities (Assisted Installer objects, NodePools,
ClusterOrder status and Events).

Non-secret by construction: no model here carries the pull secret, the discovery ignition, its URL
(which embeds a token) or any credential. Activities read those themselves, by reference.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.refs import DNS_LABEL, ClusterReference, NetworkAttachmentRef, OrderRef
from contracts.worker import CarriesReport, WorkerStatus

# ---------------------------------------------------------------------------------------------
# Names on the hub (osac-reference.md §3-§5)

# Label the InfraEnv puts on its Agents and the NodePool selects on. Not the BMI label of
# contracts.bmaas ("osac.openshift.io/cluster-order"): the hub objects use OSAC's operator spelling.
ORDER_LABEL = "osac.openshift.io/clusterorder"
RESOURCE_CLASS_LABEL = "osac.openshift.io/resource_class"
# Names the worker slot an Agent was handed to (so an operator can tell which slot owns a host).
WORKER_LABEL = "osac.openshift.io/worker"
# The same, under the key OSAC's own bare-metal worker reconciler and its runbooks use.
OSAC_WORKER_NAME_LABEL = "osac.openshift.io/worker-name"
# An Agent on its way out: it no longer counts towards its NodePool's replicas.
REMOVING_LABEL = "osac.openshift.io/removing"
INFRAENV_LABEL = "infraenvs.agent-install.openshift.io"
# Set by the agent CAPI provider on the Agent it claims: the uid of its AgentMachine.
AGENT_MACHINE_REF_LABEL = "agentMachineRef"
# What the provider's AgentMachine (at its claim) and then its Machine (once installed) carry as
# spec.providerID, followed by the Agent's name.
AGENT_PROVIDER_ID_PREFIX = "agent://"
# Set by the agent CAPI provider beside the label: the namespace of that AgentMachine (and its Machine).
AGENT_MACHINE_NAMESPACE_ANNOTATION = "agentMachineRefNamespace"
DELETE_MACHINE_ANNOTATION = "cluster.x-k8s.io/delete-machine"
MANAGEMENT_STATE_ANNOTATION = "osac.openshift.io/management-state"
# Secret key assisted-service reads the pull secret from.
PULL_SECRET_KEY = ".dockerconfigjson"
# Where a pull secret came from, as the tenant reads it.
PULL_SECRET_FIELD = "spec.pullSecret"
DEFAULT_PULL_SECRET = "the provider's default pull secret (spec.pullSecret is not set)"
NO_PULL_SECRET = "spec.pullSecret is not set and no default pull secret is configured"

# The discovery ignition becomes the BMI's user_data (limit 64 KiB); OSAC warns well before that.
IGNITION_WARN_BYTES = 48 * 1024
IGNITION_LIMIT_BYTES = 64 * 1024

EVENT_COMPONENT = "osac-baremetal-workers"


def pull_secret_name(order_name: str) -> str:
    return f"{order_name}-pull-secret"


# ---------------------------------------------------------------------------------------------
# Enums


class ManagementState(StrEnum):
    MANAGED = "managed"
    UNMANAGED = "unmanaged"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    """OSAC's ClusterOrder Event reasons."""

    INFRA_ENV_CREATED = "InfraEnvCreated"
    WORKER_CREATED = "WorkerCreated"
    AGENT_CORRELATED = "AgentCorrelated"
    WORKER_READY = "WorkerReady"
    AGENT_REGISTRATION_TIMEOUT = "AgentRegistrationTimeout"
    WORKER_FAILED = "WorkerFailed"
    WORKER_DELETED = "WorkerDeleted"
    DISCOVERY_IGNITION_SIZE_WARNING = "DiscoveryIgnitionSizeWarning"


IMAGE_CREATED_CONDITION = "ImageCreated"  # the InfraEnv condition type


class ImageCreatedReason(StrEnum):
    """assisted-service's reasons on the InfraEnv condition ImageCreated."""

    IMAGE_CREATED = "ImageCreated"
    IMAGE_CREATION_ERROR = "ImageCreationError"


# What wait_infraenv_ready shows for each reason in place of the condition's own message, which
# assisted-service may fill with the rejected pull secret itself ("Failed to create image: invalid
# pull secret data in secret <name> <pull secret>: ..."). The hub keeps the full text.
IMAGE_CREATED_TEXT: dict[ImageCreatedReason, str] = {
    ImageCreatedReason.IMAGE_CREATED: "Image has been created",
    ImageCreatedReason.IMAGE_CREATION_ERROR: (
        "Failed to create image: see the InfraEnv's ImageCreated condition on the hub"
    ),
}


class AgentState(StrEnum):
    """`status.debugInfo.state` values the activities act on (assisted-service host states)."""

    DISCOVERING_UNBOUND = "discovering-unbound"
    KNOWN_UNBOUND = "known-unbound"
    INSUFFICIENT_UNBOUND = "insufficient-unbound"
    DISCONNECTED_UNBOUND = "disconnected-unbound"
    BINDING = "binding"
    DISCOVERING = "discovering"
    KNOWN = "known"
    INSUFFICIENT = "insufficient"
    DISCONNECTED = "disconnected"
    PENDING_FOR_INPUT = "pending-for-input"
    INSTALLING = "installing"
    INSTALLING_IN_PROGRESS = "installing-in-progress"
    INSTALLING_PENDING_USER_ACTION = "installing-pending-user-action"
    ADDED_TO_EXISTING_CLUSTER = "added-to-existing-cluster"
    ERROR = "error"
    UNBINDING = "unbinding"
    UNBINDING_PENDING_USER_ACTION = "unbinding-pending-user-action"

    @staticmethod
    def is_unbound(state: str | None) -> bool:
        return bool(state) and (str(state).endswith("-unbound"))


# States in which an install will not finish without a human (or a new host).
AGENT_INSTALL_FAILED_STATES: frozenset[str] = frozenset(
    {AgentState.ERROR, AgentState.INSTALLING_PENDING_USER_ACTION}
)


class HubErrorType(StrEnum):
    """`ApplicationError.type` values raised by the hub and assisted activities.

    Non-retryable: see NON_RETRYABLE_HUB_ERRORS (UNAUTHORIZED and FORBIDDEN are retried by the
    activities that hold a host: `activities.kube.refusals_retried`). Retryable: CONFLICT,
    ALREADY_EXISTS (a retry adopts), GONE, UNAVAILABLE (also a 404 that does not name the object),
    TRANSPORT, PROTOCOL, INFRAENV_NOT_READY, IGNITION_FETCH_FAILED, OBJECT_DELETING, NODEPOOL_NOT_FOUND.
    """

    # Kubernetes API status mapping.
    NOT_FOUND = "HubNotFound"
    CONFLICT = "HubConflict"
    ALREADY_EXISTS = "HubAlreadyExists"
    INVALID = "HubInvalid"
    BAD_REQUEST = "HubBadRequest"
    UNAUTHORIZED = "HubUnauthorized"
    FORBIDDEN = "HubForbidden"
    GONE = "HubGone"
    UNAVAILABLE = "HubUnavailable"
    TRANSPORT = "HubTransportError"
    PROTOCOL = "HubProtocolError"
    # Contract errors of the activities.
    ORDER_NOT_FOUND = "OrderNotFound"
    PULL_SECRET_MISSING = "PullSecretMissing"
    PULL_SECRET_INVALID = "PullSecretInvalid"
    OBJECT_DELETING = "HubObjectDeleting"
    INFRAENV_NOT_READY = "InfraEnvNotReady"
    IGNITION_FETCH_FAILED = "DiscoveryIgnitionFetchFailed"
    IGNITION_INVALID = "DiscoveryIgnitionInvalid"
    NODEPOOL_SELECTOR_INVALID = "NodePoolSelectorInvalid"
    # Retryable: the cluster-provisioning flow creates NodePools after the cluster reference.
    NODEPOOL_NOT_FOUND = "NodePoolNotFound"
    CLUSTER_REFERENCE_TIMEOUT = "ClusterReferenceTimeout"
    AGENT_NOT_FOUND = "AgentNotFound"
    AGENT_OWNED_ELSEWHERE = "AgentOwnedElsewhere"
    # The values below equal contracts.worker.FailureReason values on purpose.
    HOST_LOST = "HostLost"
    AMBIGUOUS_AGENT_MATCH = "AmbiguousAgentMatch"
    AGENT_REGISTRATION_TIMEOUT = "AgentRegistrationTimeout"
    AGENT_INSTALL_FAILED = "AgentInstallFailed"
    AGENT_UNBINDING_TIMEOUT = "AgentUnbindingTimeout"
    IGNITION_TOO_LARGE = "DiscoveryIgnitionTooLarge"
    INFRAENV_MISSING = "InfraEnvMissing"


# Why an order's pull secret was not written: the two reasons InfraEnvReady gives for it.
PullSecretRefusal = Literal[HubErrorType.PULL_SECRET_INVALID, HubErrorType.PULL_SECRET_MISSING]


NON_RETRYABLE_HUB_ERRORS: frozenset[HubErrorType] = frozenset(
    {
        HubErrorType.NOT_FOUND,
        HubErrorType.INVALID,
        HubErrorType.BAD_REQUEST,
        HubErrorType.UNAUTHORIZED,
        HubErrorType.FORBIDDEN,
        HubErrorType.ORDER_NOT_FOUND,
        HubErrorType.PULL_SECRET_MISSING,
        HubErrorType.PULL_SECRET_INVALID,
        HubErrorType.IGNITION_INVALID,
        HubErrorType.NODEPOOL_SELECTOR_INVALID,
        HubErrorType.CLUSTER_REFERENCE_TIMEOUT,
        HubErrorType.AGENT_NOT_FOUND,
        HubErrorType.AGENT_OWNED_ELSEWHERE,
        HubErrorType.HOST_LOST,
        HubErrorType.AMBIGUOUS_AGENT_MATCH,
        HubErrorType.AGENT_REGISTRATION_TIMEOUT,
        HubErrorType.AGENT_INSTALL_FAILED,
        HubErrorType.AGENT_UNBINDING_TIMEOUT,
        HubErrorType.IGNITION_TOO_LARGE,
        HubErrorType.INFRAENV_MISSING,
    }
)


# ---------------------------------------------------------------------------------------------
# Helpers shared by workflows and activities

# The hardware addresses a server's NICs report: Ethernet's 6 bytes, and IP-over-InfiniBand's 20
# (GPU hosts' fabrics), which BMaaS and the Agent's inventory list beside the Ethernet ones.
_MAC_HEX = re.compile(r"(?:[0-9a-f]{12}|[0-9a-f]{40})")
_MAC_SEPARATORS = re.compile(r"[\s:.\-]")


@functools.lru_cache(maxsize=8192)  # every waiting worker normalises the Agents' MACs on each look
def normalize_mac(value: str) -> str:
    """Lowercase colon form of a NIC's hardware address (6 or 20 bytes): accepts `AA:BB:..`,
    `aa-bb-..`, `aabb.ccdd.eeff` and bare hex. The one rule for BMIs' NICs and Agents' interfaces
    alike, so the two sides of a match always agree."""
    digits = _MAC_SEPARATORS.sub("", value.strip().lower())
    if not _MAC_HEX.fullmatch(digits):
        raise ValueError(f"not a MAC address: {value!r}")
    return ":".join(digits[i : i + 2] for i in range(0, len(digits), 2))


def normalize_macs(values: Iterable[str]) -> list[str]:
    """A list of MACs as inputs carry them: each normalised (`normalize_mac`), once, sorted."""
    return sorted({normalize_mac(mac) for mac in values})


def _aware(value: datetime) -> datetime:
    """Deadlines are absolute instants; a naive one is taken as UTC rather than local time."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


# ---------------------------------------------------------------------------------------------
# References


class InfraEnvRef(BaseModel):
    """An order's InfraEnv and the Secret holding its pull secret (by name only)."""

    model_config = ConfigDict(frozen=True)

    order: OrderRef
    namespace: str = Field(pattern=DNS_LABEL)
    name: str = Field(min_length=1, max_length=253)
    pull_secret_name: str = Field(min_length=1, max_length=253)

    @classmethod
    def for_order(cls, order: OrderRef) -> InfraEnvRef:
        return cls(
            order=order,
            namespace=order.namespace,
            name=order.infraenv_name,
            pull_secret_name=pull_secret_name(order.name),
        )


class AgentRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    namespace: str = Field(pattern=DNS_LABEL)
    name: str = Field(min_length=1, max_length=253)


class AgentMatch(AgentRef):
    """wait_agent_for_macs' answer: the Agent, and its MACs that are none of the BMI's NICs (an
    extra interface such as a BMC's USB NIC, or another host's NIC: the workflow asks BMaaS which).
    A subclass with a default, so results recorded as a plain AgentRef still decode."""

    unmatched_macs: list[str] = Field(default_factory=list)


class NodePoolRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    namespace: str = Field(pattern=DNS_LABEL)
    name: str = Field(min_length=1, max_length=253)
    # Where the Agents it selects live (the InfraEnv's namespace); None = every namespace.
    agent_namespace: str | None = Field(default=None, pattern=DNS_LABEL)


# ---------------------------------------------------------------------------------------------
# ClusterOrder facts and status


class BareMetalNodeRequest(BaseModel):
    """One bare-metal entry of `spec.nodeRequests`; its name is its instance type."""

    model_config = ConfigDict(frozen=True)

    name: str
    instance_type: str
    count: int = Field(ge=0)
    # Its index in `spec.nodeRequests`, so a refusal names the field the tenant wrote.
    index: int | None = None


class OrderFacts(BaseModel):
    """The non-secret parts of a ClusterOrder (never the pull secret)."""

    order: OrderRef
    uid: str
    generation: int | None = None
    release_image: str | None = None
    ssh_public_key_set: bool = False
    pull_secret_set: bool = False
    network_attachment: NetworkAttachmentRef | None = None
    node_sets: list[BareMetalNodeRequest] = Field(default_factory=list)
    # Bare-metal node requests that break the conventions (duplicate or malformed instance type),
    # described without tenant data; such entries are left out of node_sets.
    invalid_node_requests: list[str] = Field(default_factory=list)
    # The same for `networkAttachment` (empty security group names, left out of it).
    invalid_network_attachment: list[str] = Field(default_factory=list)
    cluster_reference: ClusterReference | None = None
    deleting: bool = False
    management_state: ManagementState = ManagementState.MANAGED

    @property
    def unmanaged(self) -> bool:
        return self.management_state == ManagementState.UNMANAGED


class NodePoolNames(BaseModel):
    """list_nodepools: the NodePools of the hosted cluster's namespace (none being deleted)."""

    names: list[str] = Field(default_factory=list)


class ClusterReleaseInput(BaseModel):
    """Which hosted cluster's release to read, for an order that names no `releaseImage`."""

    model_config = ConfigDict(frozen=True)

    order: OrderRef
    cluster: ClusterReference


class ClusterRelease(BaseModel):
    """The release the hosted cluster's NodePools run (an order without `releaseImage` gets its
    template's default, which only the NodePools show): the one most of them name, None if none does."""

    release_image: str | None = None
    # Every NodePool of the cluster that names a release: its name -> `spec.release.image`.
    nodepools: dict[str, str] = Field(default_factory=dict)


class WaitClusterReferenceInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    order: OrderRef
    # None: wait until the activity's own timeout or cancellation.
    deadline: datetime | None = None

    @field_validator("deadline")
    @classmethod
    def _aware_deadline(cls, value: datetime | None) -> datetime | None:
        return _aware(value) if value is not None else None


class Condition(BaseModel):
    """A metav1.Condition as the workflows state it; the activity sets lastTransitionTime."""

    model_config = ConfigDict(frozen=True)

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    )
    status: ConditionStatus
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field(default="", max_length=32768)


class EventInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    order: OrderRef
    reason: EventReason
    message: str = Field(max_length=1024)
    type: EventType = EventType.NORMAL
    # Makes the Event idempotent: the same key for the same order and reason writes one Event,
    # however often the activity is retried. None: every call writes a new Event.
    key: str | None = Field(default=None, max_length=253)


class PublishStatusInput(BaseModel):
    order: OrderRef
    workers: list[WorkerStatus]
    desired: int = Field(ge=0)
    current: int = Field(ge=0)
    ready: int = Field(ge=0)
    conditions: list[Condition] = Field(default_factory=list)
    # Queued by the status write for the worker process's Event recorder (keyed, so a retried write
    # makes each Event once).
    events: list[EventInput] = Field(default_factory=list)


class PublishStatusResult(BaseModel):
    # False when the ClusterOrder no longer exists (nothing to publish to).
    order_found: bool = True
    # False when the status already said exactly this (no write was made).
    changed: bool = False
    # How many optimistic-concurrency conflicts were retried inside the activity.
    conflicts_retried: int = 0
    # Events handed to the worker process's recorder, which writes them in the background.
    events_queued: int = 0
    # Events not queued: the recorder's queue was full (best effort, as Kubernetes' own recorders).
    events_dropped: int = 0


# ---------------------------------------------------------------------------------------------
# InfraEnv


class EnsureInfraEnvResult(BaseModel):
    infraenv: InfraEnvRef
    created: bool  # the InfraEnv was created by this call (emit InfraEnvCreated)
    secret_created: bool
    # An existing object was patched back to what the order asks for (drift, or adopted).
    updated: bool = False
    # Why the order's pull secret was not written (the Secret there is kept): field and reason only.
    pull_secret_refused: str | None = None
    # PullSecretInvalid (not a pull secret) or PullSecretMissing (none set, no default); results
    # recorded before the second existed mean the first.
    pull_secret_refused_reason: PullSecretRefusal = HubErrorType.PULL_SECRET_INVALID


class InfraEnvReady(BaseModel):
    infraenv: InfraEnvRef
    image_created: bool


class InfraEnvProgress(BaseModel):
    """Heartbeat details of wait_infraenv_ready: the ImageCreated condition's status and reason,
    never its message (it may quote the pull secret)."""

    infraenv: str
    found: bool
    ignition_url_set: bool = False
    image_created_status: ConditionStatus | None = None
    # The reason as the hub wrote it when it is a reason-shaped token (CamelCase), else None.
    image_created_reason: str | None = None
    # IMAGE_CREATED_TEXT of the reason (None for other reasons): fixed text, not the hub's.
    image_created_message: str | None = None
    observed_via: str = "watch"


# ---------------------------------------------------------------------------------------------
# Agents


class WaitAgentInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    infraenv: InfraEnvRef
    order: OrderRef
    macs: list[str] = Field(min_length=1)
    # Absolute, so a retried activity does not extend the registration timeout.
    deadline: datetime

    @field_validator("macs")
    @classmethod
    def _normalize_macs(cls, value: list[str]) -> list[str]:
        return normalize_macs(value)

    @field_validator("deadline")
    @classmethod
    def _aware_deadline(cls, value: datetime) -> datetime:
        return _aware(value)


class WatchAgentInput(WaitAgentInput, CarriesReport):
    """watch_agent_for_macs: the wait's terms, and which worker to tell about which BMI."""

    worker_workflow_id: str = Field(min_length=1)
    bmi_id: str = Field(min_length=1)


class AgentWatch(BaseModel):
    """The Agent when it is registered already; None: a watch runs and will signal the worker."""

    match: AgentMatch | None = None


class AgentMatchProgress(BaseModel):
    """Heartbeat details of wait_agent_for_macs."""

    infraenv: str
    agents_in_infraenv: int
    matching_agents: int
    observed_via: str = "watch"


# The worker slot's name; labelled as is when it fits a label value (63), else shortened with a
# hash suffix (the full name is kept in an annotation).
WORKER_NAME_PATTERN = r"^[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?$"


class HandOffTerms(BaseModel):
    """Where a hand-off puts an Agent: the NodePool, and the worker slot it is for."""

    nodepool: NodePoolRef
    worker: str = Field(min_length=1, max_length=253, pattern=WORKER_NAME_PATTERN)
    hostname: str | None = Field(default=None, max_length=253)


class HandAgentInput(HandOffTerms, CarriesReport):
    model_config = ConfigDict(frozen=True)

    agent: AgentRef
    # The BMI's NIC MACs: the hand-off's duplicate check looks for another Agent reporting one of
    # them (an extra NIC two hosts share, such as a BMC's USB NIC, says nothing about which host this
    # is). Empty, as from a workflow older than the field: every MAC of the Agent.
    macs: list[str] = Field(default_factory=list)

    @field_validator("macs")
    @classmethod
    def _normalize_macs(cls, value: list[str]) -> list[str]:
        return normalize_macs(value) if value else []


class WaitAndHandAgentInput(WaitAgentInput, HandOffTerms, CarriesReport):
    """wait_agent_and_hand: the wait's terms, and the hand-off that follows it at once."""

    # The BMI whose host the Agent must be: one deleted or failed meanwhile fails the wait (HostLost)
    # instead of handing over an Agent its host, wiped and given to another slot, registered for
    # that slot. None, as from a workflow older than the field: not checked.
    bmi_id: str | None = None


class ReplicaSync(BaseModel):
    nodepool: NodePoolRef
    # False when the NodePool is gone (e.g. the hosted cluster was torn down): nothing to scale.
    nodepool_found: bool = True
    replicas: int
    previous: int | None = None
    changed: bool = False
    # Agents counted (names only), for operators.
    agents: list[str] = Field(default_factory=list)
    # Agents leaving whose Machines go first (handed Agents without a Machine wait for them).
    waiting_for_removal: list[str] = Field(default_factory=list)
    conflicts_retried: int = 0


class HandAgentResult(BaseModel):
    agent: AgentRef
    # The labels the Agent carries for its NodePool and slot (non-secret, for operators).
    labels: dict[str, str]
    changed: bool
    # The NodePool's replicas, synced right after the hand-off (see sync_replicas).
    replicas: ReplicaSync | None = None


class AgentHandOff(BaseModel):
    """wait_agent_and_hand's answer: the Agent, and the hand-off when it was made (None when the
    Agent reports MACs of no NIC of the BMI: the workflow asks BMaaS whose they are first)."""

    match: AgentMatch
    handed: HandAgentResult | None = None


class WaitAgentInstalledInput(CarriesReport):
    model_config = ConfigDict(frozen=True)

    agent: AgentRef
    deadline: datetime
    # The NodePool the Agent was handed to, and the install's window. With both, an Agent still
    # waiting for its claim at the deadline only because a removal holds the NodePool's count back
    # (a drain that hangs) is not failed: its window starts again once the removal is done.
    nodepool: NodePoolRef | None = None
    timeout: timedelta | None = Field(default=None, gt=timedelta(0))
    # The BMI the Agent's host is: one deleted or failed meanwhile fails the wait (HostLost), before
    # the host, wiped and registered again for another slot, can be installed as this worker.
    bmi_id: str | None = None

    @field_validator("deadline")
    @classmethod
    def _aware_deadline(cls, value: datetime) -> datetime:
        return _aware(value)


class InstallHold(BaseModel):
    """Past its deadline, the removals that keep an Agent from its claim, and the deadline the
    install wait moved to because of them (kept in heartbeats, so a retried attempt keeps it)."""

    held_back_by: list[str] = Field(default_factory=list)
    deadline_moved_to: datetime | None = None


class AgentProgress(InstallHold):
    """Heartbeat details of the Agent waits: state and stage, nothing secret."""

    agent: str
    found: bool = True
    state: str | None = None
    stage: str | None = None
    claimed: bool = False
    bound: bool = False
    installed: bool = False
    observed_via: str = "watch"


class AgentInstalled(BaseModel):
    agent: AgentRef
    state: str | None = None
    machine_ref: str | None = None


class MarkRemovingResult(BaseModel):
    agent: AgentRef
    found: bool
    changed: bool


class WaitAgentUnboundInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    agent: AgentRef
    deadline: datetime
    # Given: its replicas are synced once the Agent is unbound (see sync_replicas).
    nodepool: NodePoolRef | None = None

    @field_validator("deadline")
    @classmethod
    def _aware_deadline(cls, value: datetime) -> datetime:
        return _aware(value)


class AgentUnbound(BaseModel):
    agent: AgentRef
    gone: bool = False
    was_claimed: bool = False
    state: str | None = None


class ReleaseStaleAgentsInput(BaseModel):
    """The host with these MACs is being released: its registrations in this InfraEnv are stale."""

    model_config = ConfigDict(frozen=True)

    infraenv: InfraEnvRef
    order: OrderRef
    macs: list[str] = Field(min_length=1)
    worker: str | None = None  # as in ReleaseAgentInput

    @field_validator("macs")
    @classmethod
    def _normalize_macs(cls, value: list[str]) -> list[str]:
        return normalize_macs(value)


class ReleaseWipedHostAgentsInput(ReleaseStaleAgentsInput):
    """The host with these MACs was wiped and, when the order's BMIs were listed (`listed_at`, the
    list's activity clock), was none of theirs: its unclaimed registrations in this InfraEnv from
    before then are stale. After then it may have been given to a BMI and registered for that one."""

    listed_at: datetime


class UnbindAgentInput(CarriesReport):
    """Take a worker's Agent out of its NodePool: Machine first, replicas down, wait until unbound,
    then delete it and the host's other unclaimed registrations (see ReleaseAgentInput)."""

    model_config = ConfigDict(frozen=True)

    agent: AgentRef
    nodepool: NodePoolRef
    deadline: datetime
    infraenv: InfraEnvRef
    order: OrderRef
    macs: list[str] = Field(default_factory=list)
    # The leaving worker slot: an Agent of that name handed to another slot by then (the host, lost,
    # wiped and given to that slot, registered again under the same name) is not this worker's any
    # more and is left alone. None, as from a workflow older than the field: not checked.
    worker: str | None = None


class ReleaseAgentInput(CarriesReport):
    """A worker gives its host back: delete its Agent (when it had one) and every unclaimed
    registration of the host's MACs (when known), so the wiped host leaves nothing behind.
    With `worker`, a named Agent handed to another slot or bound to a cluster without this slot's
    hand-off is never touched (returned in `kept`); without it (an unbind) it is deleted."""

    model_config = ConfigDict(frozen=True)

    agent: AgentRef | None = None
    infraenv: InfraEnvRef
    order: OrderRef
    macs: list[str] = Field(default_factory=list)
    # The releasing worker slot: an Agent handed to it is not deleted but returned in `handed`, to
    # be unbound first (a hand-off whose activity was cancelled before the workflow heard of it).
    worker: str | None = None
    # The worker's workflow was restarted and does not know its Agent or MACs: find the Agents
    # handed to `worker` by their hand-off label.
    find_handed: bool = False


class ReleasedAgents(BaseModel):
    deleted: list[str] = Field(default_factory=list)
    # Agents that are approved, bound or handed to another worker: never touched (the named one
    # too when it is another worker's).
    kept: list[str] = Field(default_factory=list)
    # Agents handed to the releasing worker (ReleaseAgentInput.worker): left for its unbind.
    handed: list[str] = Field(default_factory=list)


class DeleteResult(BaseModel):
    # True when the object was already gone (NotFound counts as success).
    already_gone: bool


class DeleteInfraEnvResult(BaseModel):
    infraenv_already_gone: bool
    secret_already_gone: bool
    # Whether the InfraEnv's Agents were swept first (False: the hub refused it for good); the
    # unclaimed ones this attempt deleted, and the approved, claimed or handed ones left (by name).
    agents_swept: bool = False
    agents_deleted: list[str] = Field(default_factory=list)
    agents_kept: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# NodePools and Machines


class MachineAnnotation(BaseModel):
    agent: AgentRef
    # None when no Machine runs on this Agent (nothing to do).
    machine: str | None = None
    machine_namespace: str | None = None
    changed: bool = False
