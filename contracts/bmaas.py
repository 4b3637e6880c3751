"""Inputs, outputs and error types of the BMaaS (fulfillment-service) activities.

Non-secret by construction: no model here carries a token, user data or the discovery ignition.
The activity that creates a BMI fetches the ignition itself, by InfraEnv reference.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.hub import normalize_macs
from contracts.refs import DNS_LABEL, NetworkAttachmentRef, OrderRef
from contracts.worker import CarriesReport

# Labels and annotations that mark a BMI as created for a ClusterOrder (osac-reference.md §3).
ORDER_LABEL = "osac.openshift.io/cluster-order"
OWNER_ANNOTATION = "osac.openshift.io/owner-reference"
# BMaaS knows an order by its name only. Two ClusterOrders of one name in two namespaces would share
# it, so a BMI also names its order's namespace, and no order takes another's BMI (older BMIs
# without the label are taken as their order's).
ORDER_NAMESPACE_LABEL = "osac.openshift.io/cluster-order-namespace"
SYSTEM_TENANT = "system"
CAAS_CATALOG_ITEM = "caas-system-bmi"


class BmiState(StrEnum):
    """`status.state` of a BareMetalInstance, with the wire values."""

    UNSPECIFIED = "BARE_METAL_INSTANCE_STATE_UNSPECIFIED"
    PROVISIONING = "BARE_METAL_INSTANCE_STATE_PROVISIONING"
    RUNNING = "BARE_METAL_INSTANCE_STATE_RUNNING"
    FAILED = "BARE_METAL_INSTANCE_STATE_FAILED"
    DELETING = "BARE_METAL_INSTANCE_STATE_DELETING"
    STARTING = "BARE_METAL_INSTANCE_STATE_STARTING"
    STOPPING = "BARE_METAL_INSTANCE_STATE_STOPPING"
    STOPPED = "BARE_METAL_INSTANCE_STATE_STOPPED"

    @classmethod
    def parse(cls, value: object) -> BmiState:
        """Unknown or missing values read as UNSPECIFIED rather than failing a whole list."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNSPECIFIED

    @property
    def short(self) -> str:
        return self.value.removeprefix("BARE_METAL_INSTANCE_STATE_")


class BmaasErrorType(StrEnum):
    """`ApplicationError.type` values raised by the BMaaS activities.

    Non-retryable ones are listed in NON_RETRYABLE_ERRORS; the rest (5xx, timeouts, connection errors,
    409 version conflicts, a slot whose old BMI is still being deleted, an unreadable token file) retry.
    """

    INVALID_ARGUMENT = "BmaasInvalidArgument"
    FAILED_PRECONDITION = "BmaasFailedPrecondition"
    UNAUTHENTICATED = "BmaasUnauthenticated"
    UNIMPLEMENTED = "BmaasUnimplemented"
    TOKEN_UNAVAILABLE = "BmaasTokenUnavailable"
    PERMISSION_DENIED = "BmaasPermissionDenied"
    NOT_FOUND = "BmaasNotFound"
    ALREADY_EXISTS = "BmaasAlreadyExists"
    CONFLICT = "BmaasConflict"
    UNAVAILABLE = "BmaasUnavailable"
    TRANSPORT = "BmaasTransportError"
    PROTOCOL = "BmaasProtocolError"
    # A BMI of this slot is still being deleted: wait until it is gone, then create again.
    INSTANCE_DELETING = "BMIDeleting"
    # The values below equal contracts.worker.FailureReason values on purpose.
    PROVISIONING_FAILED = "BMIProvisioningFailed"
    NO_HOSTS_AVAILABLE = "NoHostsAvailable"
    RHCOS_IMAGE_NOT_FOUND = "RHCOSImageNotFound"
    IGNITION_TOO_LARGE = "DiscoveryIgnitionTooLarge"


NON_RETRYABLE_ERRORS: frozenset[BmaasErrorType] = frozenset(
    {
        BmaasErrorType.INVALID_ARGUMENT,
        BmaasErrorType.FAILED_PRECONDITION,
        BmaasErrorType.UNAUTHENTICATED,
        BmaasErrorType.UNIMPLEMENTED,
        BmaasErrorType.PERMISSION_DENIED,
        BmaasErrorType.NOT_FOUND,
        BmaasErrorType.ALREADY_EXISTS,
        BmaasErrorType.PROVISIONING_FAILED,
        BmaasErrorType.NO_HOSTS_AVAILABLE,
        BmaasErrorType.RHCOS_IMAGE_NOT_FOUND,
        BmaasErrorType.IGNITION_TOO_LARGE,
    }
)
# Retried errors that say BMaaS is not serving the worker (down, unreachable, answering garbage,
# refusing or lacking its token): kept up, they are shown on the order. The other retried ones are
# waits (a BMI still being deleted) or contention (a version conflict).
NOT_SERVING_ERRORS: frozenset[BmaasErrorType] = frozenset(
    {
        BmaasErrorType.UNAVAILABLE,
        BmaasErrorType.TRANSPORT,
        BmaasErrorType.PROTOCOL,
        BmaasErrorType.TOKEN_UNAVAILABLE,
        BmaasErrorType.UNAUTHENTICATED,
        BmaasErrorType.PERMISSION_DENIED,
    }
)


# ---------------------------------------------------------------------------------------------
# create_worker_instance


def create_margin(attempt: timedelta) -> timedelta:
    """How long before the end of its attempt a create's POST must have ended, and how long after a
    create ended unanswered the release waits before it looks for the slot's BMI: a tenth of the
    attempt, at least a second. Together they cover clocks that differ and a service still handling
    a request its client gave up."""
    return max(attempt / 10, timedelta(seconds=1))


class CreateWorkerInstanceInput(CarriesReport):
    """One worker slot of an order. The BMI name is derived, so a retry can only find the same BMI."""

    model_config = ConfigDict(frozen=True)

    order: OrderRef
    slot_index: int = Field(ge=0)
    instance_type: str = Field(min_length=1)
    # The boot image: given, or resolved from the release image when the BMI is created.
    disk_image_id: str | None = Field(default=None, min_length=1)
    release_image: str | None = Field(default=None, min_length=1)
    network_attachment: NetworkAttachmentRef | None = None
    # The InfraEnv whose discovery ignition becomes the BMI's user data; defaults to the order's.
    infraenv_name: str | None = Field(default=None, pattern=DNS_LABEL)
    infraenv_namespace: str | None = Field(default=None, pattern=DNS_LABEL)

    @model_validator(mode="after")
    def _names_a_boot_image(self) -> CreateWorkerInstanceInput:
        if not self.disk_image_id and not self.release_image:
            raise ValueError("disk_image_id or release_image: one of them is required")
        return self

    @property
    def bmi_name(self) -> str:
        return self.order.worker_name(self.slot_index)

    @property
    def ignition_ref(self) -> tuple[str, str]:
        """(namespace, name) of the InfraEnv to fetch the ignition from."""
        namespace = self.infraenv_namespace or self.order.namespace
        return (namespace, self.infraenv_name or self.order.infraenv_name)


class WorkerInstance(BaseModel):
    """A BMI as the workflows see it: identity and state, nothing secret."""

    id: str
    name: str
    state: BmiState
    instance_type: str | None = None
    order_name: str | None = None
    created_at: datetime | None = None
    deleting_since: datetime | None = None
    # Its NICs' MACs (normalised), which its host's Agent registrations report.
    macs: list[str] = []


class CreateWorkerInstanceResult(BaseModel):
    instance: WorkerInstance
    # False when an existing BMI of this slot was adopted (a retry, or a concurrent create).
    created: bool
    # Size of the user data sent, so the workflow can raise DiscoveryIgnitionSizeWarning.
    user_data_bytes: int | None = None
    user_data_size_warning: bool = False


# ---------------------------------------------------------------------------------------------
# waits and deletion


class InstanceRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    bmi_id: str = Field(min_length=1)


class WaitInstanceRunningInput(InstanceRef):
    """A BMI to wait for, until `deadline` (absolute, so a retried wait keeps the policy's limit;
    None: no limit, as waits scheduled before it existed)."""

    deadline: datetime | None = None


class InstanceRunning(BaseModel):
    bmi_id: str
    name: str
    # Every NIC's MAC, lowercase colon form, sorted (bonds may report any of them).
    macs: list[str]


class DeleteInstanceResult(BaseModel):
    bmi_id: str
    # True when the BMI was already gone (NotFound counts as success).
    already_gone: bool


class WaitInstanceGoneInput(CarriesReport):
    model_config = ConfigDict(frozen=True)

    bmi_id: str = Field(min_length=1)
    # A BMI DELETING longer than this is reported stuck (in heartbeats); the wait goes on regardless.
    stuck_after_seconds: float = Field(default=1800.0, gt=0)
    # Ask BMaaS to release the BMI first (idempotent), so one activity releases and waits.
    delete_first: bool = False


class InstanceGone(BaseModel):
    bmi_id: str
    # Whether the wipe was seen stuck at some point during the wait (it finished in the end).
    was_stuck: bool = False


class WaitProgress(BaseModel):
    """Heartbeat details of the waiting activities: non-secret facts only."""

    bmi_id: str
    state: BmiState | None = None
    # How the state is being observed: "watch" (the shared stream) or "polling" (stream down).
    observed_via: str = "watch"
    stuck: bool = False
    stuck_reason: str | None = None
    deleting_since: datetime | None = None


# ---------------------------------------------------------------------------------------------
# boot image and listing


class ResolveBootImageInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    release_image: str = Field(min_length=1)


class BootImage(BaseModel):
    disk_image_id: str
    disk_image_name: str | None = None
    cluster_version: str  # the ClusterVersion's id
    cluster_version_name: str | None = None


class ListOrderInstancesInput(CarriesReport):
    model_config = ConfigDict(frozen=True)

    order: OrderRef
    # Only the BMIs of this name (a slot's): the result stays small in a large order's histories.
    name: str | None = None
    # Only the BMIs whose NICs carry one of these MACs (whose host it is).
    macs: list[str] | None = Field(default=None, min_length=1)
    # A 401/403 fails the call at once instead of being retried: for a best-effort caller.
    give_up_on_refusal: bool = False

    @field_validator("macs")
    @classmethod
    def _normalize_macs(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else normalize_macs(value)


class OrderInstances(BaseModel):
    instances: list[WorkerInstance]
    # When the list was asked for (the activity's clock): what it shows held from then until its
    # answer. None from activity workers older than this field.
    listed_at: datetime | None = None


class FindInstancesWithMacsInput(CarriesReport):
    """MACs an Agent reports beyond its BMI's NICs: does another BMI's host own one of them?"""

    model_config = ConfigDict(frozen=True)

    macs: list[str] = Field(min_length=1)
    # The worker's own BMI, which is never an "other" host.
    exclude_bmi_id: str | None = None

    @field_validator("macs")
    @classmethod
    def _normalize_macs(cls, value: list[str]) -> list[str]:
        return normalize_macs(value)


class FindLostInstancesInput(BaseModel):
    """The BMIs of an order's Ready workers: which of them lost their host?"""

    model_config = ConfigDict(frozen=True)

    order: OrderRef
    bmi_ids: list[str] = Field(min_length=1)


class ApplySecurityGroupsInput(BaseModel):
    """The order's security groups now (its `networkAttachment.securityGroupRefs`), for every BMI
    of the order that runs or boots a worker."""

    model_config = ConfigDict(frozen=True)

    order: OrderRef
    security_groups: tuple[str, ...] = ()


class SecurityGroupsApplied(BaseModel):
    # The BMIs whose network attachment was changed, sorted; the others already had the groups.
    bmi_ids: list[str] = Field(default_factory=list)


# A Ready worker's BMI in one of these states no longer runs its node (and was not made so by us:
# the worker releases its BMI only after leaving Ready).
LOST_STATES = frozenset({BmiState.FAILED, BmiState.DELETING})


class LostInstance(BaseModel):
    """A Ready worker's BMI that failed or is being deleted (`state`), or is gone (`state` None).
    Also the payload of the worker workflow's `host_lost` signal."""

    model_config = ConfigDict(frozen=True)

    bmi_id: str
    state: BmiState | None = None

    def describe(self) -> str:
        return f"BMI {self.bmi_id} " + (f"is {self.state.value}" if self.state else "is gone")


class LostInstances(BaseModel):
    lost: list[LostInstance] = Field(default_factory=list)


class InstancesWithMacs(BaseModel):
    # CaaS BMIs (DELETING included: the host still holds its NICs) reporting one of the MACs, sorted.
    bmi_ids: list[str] = Field(default_factory=list)
