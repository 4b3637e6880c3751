"""Names and enum values of the real systems the hub twin's controllers play.

Values are exact copies of what assisted-service, the HyperShift agent CAPI provider and Cluster API
write (osac-reference.md §4-§5), so code under test cannot tell the twin from the real thing by a
spelling.
"""

from __future__ import annotations

from enum import StrEnum


class HostState(StrEnum):
    """`status.debugInfo.state` of an Agent (assisted-service host statuses)."""

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


UNBOUND_STATES: frozenset[HostState] = frozenset(
    {
        HostState.DISCOVERING_UNBOUND,
        HostState.KNOWN_UNBOUND,
        HostState.INSUFFICIENT_UNBOUND,
        HostState.DISCONNECTED_UNBOUND,
    }
)
# Once the disk may have been written, unbinding needs the host rebooted into discovery.
INSTALL_STARTED_STATES: frozenset[HostState] = frozenset(
    {
        HostState.INSTALLING,
        HostState.INSTALLING_IN_PROGRESS,
        HostState.INSTALLING_PENDING_USER_ACTION,
        HostState.ADDED_TO_EXISTING_CLUSTER,
        HostState.ERROR,
    }
)


class HostStage(StrEnum):
    """`status.progress.currentStage` of a day-2 worker install, in order."""

    STARTING_INSTALLATION = "Starting installation"
    INSTALLING = "Installing"
    WRITING_IMAGE_TO_DISK = "Writing image to disk"
    WAITING_FOR_CONTROL_PLANE = "Waiting for control plane"
    REBOOTING = "Rebooting"
    WAITING_FOR_IGNITION = "Waiting for ignition"
    CONFIGURING = "Configuring"
    JOINED = "Joined"
    DONE = "Done"


WORKER_STAGES: tuple[HostStage, ...] = tuple(HostStage)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class AgentConditionType(StrEnum):
    SPEC_SYNCED = "SpecSynced"
    CONNECTED = "Connected"
    REQUIREMENTS_MET = "RequirementsMet"
    VALIDATED = "Validated"
    INSTALLED = "Installed"
    BOUND = "Bound"


class AgentReason(StrEnum):
    """Condition reasons of the Agent CR (assisted-service api/v1beta1/agent_types.go)."""

    SYNC_OK = "SyncOK"
    INPUT_ERROR = "InputError"
    AGENT_CONNECTED = "AgentIsConnected"
    AGENT_DISCONNECTED = "AgentIsDisconnected"
    AGENT_READY = "AgentIsReady"
    AGENT_NOT_READY = "AgentNotReady"
    AGENT_ALREADY_INSTALLING = "AgentAlreadyInstalling"
    AGENT_NOT_APPROVED = "AgentIsNotApproved"
    AGENT_INSTALLATION_STOPPED = "AgentInstallationStopped"
    VALIDATIONS_PASSING = "ValidationsPassing"
    VALIDATIONS_UNKNOWN = "ValidationsUnknown"
    VALIDATIONS_FAILING = "ValidationsFailing"
    INSTALLED = "InstallationCompleted"
    INSTALLATION_FAILED = "InstallationFailed"
    INSTALLATION_NOT_STARTED = "InstallationNotStarted"
    INSTALLATION_IN_PROGRESS = "InstallationInProgress"
    UNKNOWN_STATUS = "UnknownStatus"
    BOUND = "Bound"
    UNBOUND = "Unbound"
    BINDING = "Binding"
    UNBINDING = "Unbinding"
    UNBINDING_PENDING_USER_ACTION = "UnbindingPendingUserAction"


class InfraEnvConditionType(StrEnum):
    IMAGE_CREATED = "ImageCreated"


class InfraEnvReason(StrEnum):
    IMAGE_CREATED = "ImageCreated"
    IMAGE_CREATION_ERROR = "ImageCreationError"


class HostRole(StrEnum):
    # The real service creates Agents with an empty spec.role (Go zero value, still present, so the
    # CRD's `required` holds); status.role shows the effective role.
    UNSET = ""
    AUTO_ASSIGN = "auto-assign"
    WORKER = "worker"


class HostKind(StrEnum):
    HOST = "Host"
    ADD_TO_EXISTING_CLUSTER = "AddToExistingClusterHost"


class NodePoolConditionType(StrEnum):
    READY = "Ready"
    ALL_MACHINES_READY = "AllMachinesReady"


class MachinePhase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    PROVISIONED = "Provisioned"
    RUNNING = "Running"
    DELETING = "Deleting"


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class Label(StrEnum):
    INFRAENV = "infraenvs.agent-install.openshift.io"
    AGENT_MACHINE_REF = "agentMachineRef"
    NODEPOOL = "hypershift.openshift.io/nodePool"
    CAPI_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
    CLUSTER_ORDER = "osac.openshift.io/clusterorder"
    RESOURCE_CLASS = "osac.openshift.io/resource_class"


class Annotation(StrEnum):
    DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
    MANAGEMENT_STATE = "osac.openshift.io/management-state"
    # The agent CAPI provider's companion of the agentMachineRef label: the AgentMachine's namespace.
    AGENT_MACHINE_REF_NAMESPACE = "agentMachineRefNamespace"


UNMANAGED = "unmanaged"

# The real agent authenticates with this header in assisted-service's "local" auth mode.
AGENT_AUTH_HEADER = "X-Secret-Key"
ASSISTED_API_PREFIX = "/api/assisted-install/v2"
IGNITION_FILE_NAME = "discovery.ign"
