"""The worker-node vocabulary: phases, failure reasons, the OSAC status item and the timing policy."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel


class WorkerPhase(StrEnum):
    """Exactly OSAC's `status.workers[].phase` values."""

    PROVISIONING = "Provisioning"
    WAITING_FOR_AGENT = "WaitingForAgent"
    BINDING = "Binding"
    READY = "Ready"
    FAILED = "Failed"
    UNBINDING = "Unbinding"
    DELETING = "Deleting"

    @property
    def before_ready(self) -> bool:
        return self in (WorkerPhase.PROVISIONING, WorkerPhase.WAITING_FOR_AGENT, WorkerPhase.BINDING)


class FailureReason(StrEnum):
    BMI_PROVISIONING_FAILED = "BMIProvisioningFailed"
    NO_HOSTS_AVAILABLE = "NoHostsAvailable"
    AGENT_REGISTRATION_TIMEOUT = "AgentRegistrationTimeout"
    AGENT_INSTALL_FAILED = "AgentInstallFailed"
    AMBIGUOUS_AGENT_MATCH = "AmbiguousAgentMatch"
    AGENT_UNBINDING_TIMEOUT = "AgentUnbindingTimeout"
    RHCOS_IMAGE_NOT_FOUND = "RHCOSImageNotFound"
    FULFILLMENT_SERVICE_UNAVAILABLE = "FulfillmentServiceUnavailable"
    DISCOVERY_IGNITION_TOO_LARGE = "DiscoveryIgnitionTooLarge"
    HOST_WIPE_STUCK = "HostWipeStuck"
    # A worker's BMI failed, is being deleted or is gone, not by us: a Ready worker is released and
    # replaced, one not Ready yet fails its attempt (released, tried again with a new host).
    HOST_LOST = "HostLost"
    # The order's InfraEnv was deleted behind our back: the cluster workflow creates it again.
    INFRAENV_MISSING = "InfraEnvMissing"
    INTERNAL_ERROR = "InternalError"


# Failures only a change outside the orchestrator can cure (capacity, an image, the order's
# configuration): they back off on the long no-hosts table instead of retrying every few seconds.
WAITING_ON_OUTSIDE_CHANGE = frozenset(
    {
        FailureReason.NO_HOSTS_AVAILABLE,
        FailureReason.RHCOS_IMAGE_NOT_FOUND,
        FailureReason.DISCOVERY_IGNITION_TOO_LARGE,
    }
)

# Tenant-facing text per reason: never host names, MACs, ids or backend error text.
TENANT_MESSAGES: dict[FailureReason, str] = {
    FailureReason.BMI_PROVISIONING_FAILED: "The bare-metal host could not be provisioned; retrying.",
    FailureReason.NO_HOSTS_AVAILABLE: "No bare-metal host of this type is available; waiting for capacity.",
    FailureReason.AGENT_REGISTRATION_TIMEOUT: "The host did not register for installation in time; retrying.",
    FailureReason.AGENT_INSTALL_FAILED: "Installing the node on the host failed; retrying with a new host.",
    FailureReason.AMBIGUOUS_AGENT_MATCH: "The host could not be identified unambiguously; retrying.",
    FailureReason.AGENT_UNBINDING_TIMEOUT: "Removing the node is taking longer than expected.",
    FailureReason.RHCOS_IMAGE_NOT_FOUND: "No boot image is available for this cluster version.",
    FailureReason.FULFILLMENT_SERVICE_UNAVAILABLE: "The bare-metal service is unavailable; retrying.",
    FailureReason.DISCOVERY_IGNITION_TOO_LARGE: (
        "The discovery configuration, which carries spec.pullSecret and spec.sshPublicKey, is too large"
        " for the host; waiting for a smaller one."
    ),
    FailureReason.HOST_WIPE_STUCK: "Releasing the host is taking longer than expected.",
    FailureReason.HOST_LOST: "The worker's bare-metal host stopped working; replacing it.",
    FailureReason.INFRAENV_MISSING: "The cluster's discovery configuration is being recreated; retrying.",
    FailureReason.INTERNAL_ERROR: "An internal error occurred; retrying.",
}


class WorkerStatus(BaseModel):
    """One item of the OSAC ClusterOrder `status.workers[]` contract (camelCase on the wire)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    node_set: str
    name: str
    kind: str = "BareMetalInstance"
    resource_id: str | None = Field(default=None, alias="resourceID")
    phase: WorkerPhase = WorkerPhase.PROVISIONING
    attempt_count: int = 1
    last_failure_reason: FailureReason | None = None
    last_failure_message: str | None = None
    last_failure_time: datetime | None = None
    next_retry_time: datetime | None = None

    def osac_item(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class FailingRequests(BaseModel):
    """A backend request retried for a while without an answer: shown on the order until answered
    (the errors themselves are for ops: the worker's log and its activity's failures)."""

    since: datetime


class WorkerReport(BaseModel):
    """A worker's status change for its cluster workflow: signalled by the worker workflow, or
    delivered by the activity that starts (or ends) the phase, which keeps the signal out of the
    worker's history."""

    status: WorkerStatus
    deleted: bool = False
    # Reports come from the workflow and from its activities, so they can arrive out of order (a
    # retried activity's zombie attempt, say); the cluster workflow keeps the highest. 0: unnumbered,
    # from a worker started before reports were numbered, always taken.
    sequence: int = Field(default=0, ge=0)
    # A BMaaS request of the worker's that keeps failing (None: none, or a worker from before).
    bmaas_failing: FailingRequests | None = None
    # The uid of the ClusterOrder the worker was started for. A late copy from a worker of an
    # earlier order of the same name (deleted and created again) reaches the new order's workflow,
    # whose slots have the same names: it is not taken. None: a worker from before, always taken.
    order_uid: str | None = None


class WorkerReports(BaseModel):
    """Signal `worker_reports`: the reports a worker process delivered to one cluster workflow at once."""

    reports: list[WorkerReport] = Field(min_length=1)
    _unreadable: int = PrivateAttr(default=0)

    @model_validator(mode="wrap")
    @classmethod
    def _readable_reports_only(
        cls, data: Any, handler: ModelWrapValidatorHandler[WorkerReports]
    ) -> WorkerReports:
        """A report this code cannot read (a newer worker's, during a rolling deploy: a failure
        reason added since) is left out alone. Whole, the batch was dropped as undecodable, and the
        other workers' reports in it (a `deleted` among them) with it."""
        try:
            return handler(data)  # every report readable: the batch as sent, checked once
        except ValidationError:
            if not isinstance(data, dict) or not isinstance(data.get("reports"), list):
                raise
        readable: list[WorkerReport] = []
        for item in data["reports"]:
            try:
                readable.append(WorkerReport.model_validate(item))
            except ValidationError:
                continue
        batch = handler({**data, "reports": readable})
        batch._unreadable = len(data["reports"]) - len(readable)
        return batch

    @property
    def unreadable(self) -> int:
        """How many reports of the batch as sent were left out."""
        return self._unreadable


class ReportDelivery(BaseModel):
    """What an activity tells the cluster workflow for its worker: on start (the phase it begins) and
    once it succeeded (the phase it ends in). The activity succeeds only after delivering."""

    model_config = ConfigDict(frozen=True)

    parent_workflow_id: str = Field(min_length=1)
    on_start: WorkerReport | None = None
    on_success: WorkerReport | None = None


class CarriesReport(BaseModel):
    """Base of the inputs of the worker's activities that can deliver its reports."""

    report: ReportDelivery | None = None


def _seconds(*values: float) -> list[timedelta]:
    return [timedelta(seconds=v) for v in values]


def _steps(policy: BaseModel, name: str) -> list[tuple[str, timedelta]]:
    """A duration field's values, each with where it is (`name`, or `name.index` in a list)."""
    value = getattr(policy, name)
    if isinstance(value, list):
        return [(f"{name}.{i}", step) for i, step in enumerate(value)]
    return [(name, value)] if isinstance(value, timedelta) else []


_POSITIVE = (
    "agent_registration_timeout",
    "agent_install_timeout",
    "agent_unbinding_timeout",
    "bmi_running_timeout",
    "agent_watch_renewal",
    "wipe_stuck_after",
    "prerequisite_recheck",
    "ready_host_check",
    "call_timeout",
    "wait_heartbeat_timeout",
    "bmaas_failing_shown_after",
)
_NOT_NEGATIVE = (
    "transient_backoff",
    "transient_backoff_cap",
    "no_hosts_backoff",
    "no_hosts_backoff_cap",
    "registration_timeout_backoff",
    "registration_timeout_backoff_cap",
    "attempt_reset_after_ready",
    "status_coalesce",
)


# The longest value a policy may hold: now + this, a backoff step doubled 16 times, and a protobuf
# Duration must all stay within what datetime, timedelta and Temporal can hold.
LONGEST_POLICY_DURATION = timedelta(days=3650)


class TimingPolicy(BaseModel):
    """OSAC's defaults; every value overridable per order so tests can run in seconds.

    `problems()` says which values a workflow cannot live with; callers check it before they start
    one (`starter`). Not checked when a workflow's input is decoded: a workflow started by older
    code with such a value must still run, if only to be decommissioned."""

    agent_registration_timeout: timedelta = timedelta(minutes=30)
    agent_install_timeout: timedelta = timedelta(minutes=60)
    # OSAC's reconciler waits 30 min for an unbinding Agent before it says AgentUnbindingTimeout.
    agent_unbinding_timeout: timedelta = timedelta(minutes=30)
    # A BMI not running by then (stuck provisioning, starting or stopped) fails its attempt
    # (BMIProvisioningFailed): its host is released, wiped and another one tried.
    bmi_running_timeout: timedelta = Field(default=timedelta(minutes=60), gt=timedelta(0))
    # Workers of WorkerRevision 2 and earlier: while one waits for its Agent, how often it renews the
    # watch that will signal it (the watch lives in one worker process: a restart costs this delay).
    agent_watch_renewal: timedelta = Field(default=timedelta(minutes=5), gt=timedelta(0))
    transient_backoff: list[timedelta] = Field(default_factory=lambda: _seconds(30, 60, 120))
    transient_backoff_cap: timedelta = timedelta(minutes=5)
    no_hosts_backoff: list[timedelta] = Field(default_factory=lambda: _seconds(300, 900, 1800))
    no_hosts_backoff_cap: timedelta = timedelta(minutes=30)
    registration_timeout_backoff: list[timedelta] = Field(default_factory=lambda: _seconds(300, 900, 1800))
    registration_timeout_backoff_cap: timedelta = timedelta(minutes=30)
    attempt_reset_after_ready: timedelta = timedelta(hours=1)
    # A wipe still running after this is shown as HostWipeStuck (the release keeps waiting).
    wipe_stuck_after: timedelta = timedelta(minutes=30)
    # How long the cluster workflow gathers status changes before one write to the ClusterOrder.
    # 0: each change is written at once, and the changes that arrive while a write is in flight go
    # in the next (worker processes already send an order's reports together). A window is a
    # Temporal timer, and servers fire timers shorter than `history.timerProcessorMaxTimeShift`
    # (1 s by default) only after it: a 0.5 s window held every write about a second.
    status_coalesce: timedelta = Field(default=timedelta(0), ge=timedelta(0))
    # How often a cluster with a missing boot image or cluster reference looks again.
    prerequisite_recheck: timedelta = timedelta(minutes=1)
    # How often the cluster workflow asks BMaaS whether its Ready workers' hosts still run (one list
    # per order): a host that failed or was deleted behind our back is then released and replaced.
    # Also the pace at which leaving workers that report nothing are looked at and told again (a
    # stopped one restarts): at the 1st, 2nd, 4th and 8th quiet look in a row, then every 12th.
    ready_host_check: timedelta = Field(default=timedelta(minutes=5), gt=timedelta(0))
    # A backend call still running after this is retried: how late a call lost with its worker
    # (killed, partitioned) is made again by another.
    call_timeout: timedelta = Field(default=timedelta(seconds=60), gt=timedelta(0))
    # A wait that has not heartbeated for this long is handed to another worker: how soon the waits
    # of a worker that died move on. The waits heartbeat every third of it (activities.heartbeats).
    wait_heartbeat_timeout: timedelta = Field(default=timedelta(seconds=30), gt=timedelta(0))
    # A BMaaS request still failing once its retries' backoffs add up to this (an outage, a hung
    # gateway) is shown on the order (FulfillmentServiceUnavailable) while it is retried.
    bmaas_failing_shown_after: timedelta = Field(default=timedelta(minutes=2), gt=timedelta(0))

    def problems(self) -> list[str]:
        """Values a started workflow could not live with, one line each naming the field: a zero
        or negative timeout or recheck (a wait timed out at once, a loop without pause; some fail
        the workflow task for good while it holds a host), a negative backoff step or cap, a value
        over LONGEST_POLICY_DURATION (a deadline past what datetime holds fails the workflow task
        for good, with a host allocated)."""
        found: list[str] = []
        for name in _POSITIVE:
            if getattr(self, name) <= timedelta(0):
                found.append(f"{name}: must be greater than 0")
        for name in _NOT_NEGATIVE:
            for where, step in _steps(self, name):
                if step < timedelta(0):
                    found.append(f"{where}: must not be negative")
        for name in type(self).model_fields:
            for where, step in _steps(self, name):
                if step > LONGEST_POLICY_DURATION:
                    found.append(f"{where}: must be at most {LONGEST_POLICY_DURATION.days} days")
        return found

    def backoff(self, reason: FailureReason, failures_in_a_row: int) -> timedelta:
        """Backoff before the next attempt after `failures_in_a_row` (>= 1) failures."""
        if reason in WAITING_ON_OUTSIDE_CHANGE:
            table, cap = self.no_hosts_backoff, self.no_hosts_backoff_cap
        elif reason == FailureReason.AGENT_REGISTRATION_TIMEOUT:
            table, cap = self.registration_timeout_backoff, self.registration_timeout_backoff_cap
        else:
            table, cap = self.transient_backoff, self.transient_backoff_cap
        if not table:
            return timedelta(0)
        if failures_in_a_row <= len(table):
            step = table[failures_in_a_row - 1]
        else:  # past the table, keep doubling the last step up to the cap
            step = table[-1] * 2 ** min(failures_in_a_row - len(table), 16)
        return min(step, cap)
