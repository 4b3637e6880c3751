"""The fulfillment-service resources as the REST gateway writes them (osac-reference.md §2).

Proto field names (snake_case), enums as their proto names, int64 as JSON strings (int32 such as
`metadata.version` stay numbers), timestamps RFC 3339. Every resource is `{id, metadata, spec, status}`.
Unknown fields are rejected (the gateway does the same), so a client typo fails loudly here instead of
silently in production. Answers are rendered with `render()` (None fields left out).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

# int64 fields travel as strings in proto3 JSON; lax validation still accepts numbers on input.
Int64 = Annotated[int, PlainSerializer(lambda v: str(v), return_type=str, when_used="json")]

# RFC 1035 label, as `metadata.name` of a BareMetalInstance must be.
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# Catalog objects (types, images, versions) carry release-style names such as `rhcos-4.18`.
CATALOG_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")

USER_DATA_MAX_BYTES = 65_536
SYSTEM_TENANT = "system"


def utcnow() -> datetime:
    return datetime.now(UTC)


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


def render(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


# ---------------------------------------------------------------------------------------------- enums


class BmiState(StrEnum):
    UNSPECIFIED = "BARE_METAL_INSTANCE_STATE_UNSPECIFIED"
    PROVISIONING = "BARE_METAL_INSTANCE_STATE_PROVISIONING"
    RUNNING = "BARE_METAL_INSTANCE_STATE_RUNNING"
    FAILED = "BARE_METAL_INSTANCE_STATE_FAILED"
    DELETING = "BARE_METAL_INSTANCE_STATE_DELETING"
    STARTING = "BARE_METAL_INSTANCE_STATE_STARTING"
    STOPPING = "BARE_METAL_INSTANCE_STATE_STOPPING"
    STOPPED = "BARE_METAL_INSTANCE_STATE_STOPPED"


class BmiConditionType(StrEnum):
    PROVISIONED = "BARE_METAL_INSTANCE_CONDITION_TYPE_PROVISIONED"
    CONFIGURATION_APPLIED = "BARE_METAL_INSTANCE_CONDITION_TYPE_CONFIGURATION_APPLIED"
    READY = "BARE_METAL_INSTANCE_CONDITION_TYPE_READY"
    RESTART_IN_PROGRESS = "BARE_METAL_INSTANCE_CONDITION_TYPE_RESTART_IN_PROGRESS"
    RESTART_FAILED = "BARE_METAL_INSTANCE_CONDITION_TYPE_RESTART_FAILED"
    RESTART_REQUIRED = "BARE_METAL_INSTANCE_CONDITION_TYPE_RESTART_REQUIRED"


class ConditionStatus(StrEnum):
    UNSPECIFIED = "CONDITION_STATUS_UNSPECIFIED"
    TRUE = "CONDITION_STATUS_TRUE"
    FALSE = "CONDITION_STATUS_FALSE"


class RunStrategy(StrEnum):
    UNSPECIFIED = "BARE_METAL_INSTANCE_RUN_STRATEGY_UNSPECIFIED"
    ALWAYS = "BARE_METAL_INSTANCE_RUN_STRATEGY_ALWAYS"
    HALTED = "BARE_METAL_INSTANCE_RUN_STRATEGY_HALTED"


class EventType(StrEnum):
    CREATED = "EVENT_TYPE_OBJECT_CREATED"
    UPDATED = "EVENT_TYPE_OBJECT_UPDATED"
    DELETED = "EVENT_TYPE_OBJECT_DELETED"
    SIGNALED = "EVENT_TYPE_OBJECT_SIGNALED"


class PortRole(StrEnum):
    FABRIC = "fabric"
    MANAGEMENT = "management"
    STORAGE = "storage"
    LIFECYCLE = "lifecycle"


class DiskImageSourceType(StrEnum):
    UNSPECIFIED = "SOURCE_TYPE_UNSPECIFIED"
    REGISTRY = "SOURCE_TYPE_REGISTRY"


class DiskImageLifecycle(StrEnum):
    AVAILABLE = "AVAILABLE"
    DEPRECATED = "DEPRECATED"
    OBSOLETE = "OBSOLETE"


class ClusterVersionState(StrEnum):
    UNSPECIFIED = "CLUSTER_VERSION_STATE_UNSPECIFIED"
    ACTIVE = "CLUSTER_VERSION_STATE_ACTIVE"
    DEPRECATED = "CLUSTER_VERSION_STATE_DEPRECATED"
    OBSOLETE = "CLUSTER_VERSION_STATE_OBSOLETE"


# The BMI `spec.image.source_type` OSAC-2135 uses: `source_ref` is then a DiskImage id.
IMAGE_SOURCE_DISK_IMAGE = "disk_image"


# ------------------------------------------------------------------------------------------- metadata


class Metadata(ApiModel):
    name: str = ""
    tenant: str = ""
    project: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    version: int = 0  # int32 in the proto: a JSON number
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    finalizers: list[str] = Field(default_factory=list)
    creator: str = ""


def _reference_from_string(value: Any) -> Any:
    # The older proto has a plain string here; treat it as "id or name".
    return {"id": value} if isinstance(value, str) else value


class ObjectReference(ApiModel):
    id: str | None = None
    name: str | None = None
    project: str | None = None
    shared: bool | None = None


class Resource(ApiModel):
    """`{id, metadata, spec, status}`: subclasses add `spec` and `status` after these two."""

    id: str = ""
    metadata: Metadata = Field(default_factory=Metadata)


class NamedReference(ApiModel):
    id: str | None = None
    name: str | None = None


# ------------------------------------------------------------------------------- BareMetalInstance


class ImageSource(ApiModel):
    source_type: str = ""
    source_ref: str = ""


class NetworkAttachment(ApiModel):
    subnet: NamedReference | None = None
    security_groups: list[NamedReference] = Field(default_factory=list)
    interface: str = ""
    primary: bool = False


class BareMetalInstanceSpec(ApiModel):
    catalog_item: Annotated[ObjectReference | None, BeforeValidator(_reference_from_string)] = None
    instance_type: str | None = None
    image: ImageSource | None = None
    disk_image: str | None = None
    user_data: str | None = None
    ssh_public_key: str | None = None
    run_strategy: RunStrategy | None = None
    restart_trigger: Int64 | None = None
    template_parameters: dict[str, Any] = Field(default_factory=dict)
    network_attachments: list[NetworkAttachment] = Field(default_factory=list)
    auto_external_ip_attachment: Any = None


class BmiCondition(ApiModel):
    type: BmiConditionType
    status: ConditionStatus
    last_transition_time: datetime | None = None
    reason: str | None = None
    message: str | None = None


class Nic(ApiModel):
    mac: str


class BmiHardwareStatus(ApiModel):
    nics: list[Nic] = Field(default_factory=list)


class BareMetalInstanceStatus(ApiModel):
    state: BmiState = BmiState.UNSPECIFIED
    conditions: list[BmiCondition] = Field(default_factory=list)
    hardware: BmiHardwareStatus | None = None
    network_attachment_statuses: list[dict[str, Any]] = Field(default_factory=list)
    restart_trigger: Int64 | None = None
    hub: str | None = None  # private API only


class BareMetalInstance(Resource):
    spec: BareMetalInstanceSpec = Field(default_factory=BareMetalInstanceSpec)
    status: BareMetalInstanceStatus = Field(default_factory=BareMetalInstanceStatus)


# ---------------------------------------------------------------------------- BareMetalInstanceType


class CpuSpec(ApiModel):
    cores: int = 0
    architecture: str = ""
    model: str = ""
    threads_per_core: int = 0


class MemorySpec(ApiModel):
    total_gb: Int64 = 0
    type: str = ""


class DiskSpec(ApiModel):
    type: str = ""
    capacity_gb: Int64 = 0
    interface: str = ""


class AcceleratorSpec(ApiModel):
    type: str = ""
    model: str = ""
    vendor: str | None = None
    memory_gb: int | None = None


class NetworkPortSpec(ApiModel):
    name: str
    role: PortRole
    type: str = ""
    speed: str = ""


class HardwareSpec(ApiModel):
    cpu: CpuSpec | None = None
    memory: MemorySpec | None = None
    disks: list[DiskSpec] = Field(default_factory=list)
    accelerators: list[AcceleratorSpec] = Field(default_factory=list)
    network_ports: list[NetworkPortSpec] = Field(default_factory=list)
    capabilities: dict[str, str] = Field(default_factory=dict)


class LabelSelector(ApiModel):
    match_labels: dict[str, str] = Field(default_factory=dict)


class BareMetalInstanceTypeSpec(ApiModel):
    hardware: HardwareSpec | None = None
    host_label_selector: LabelSelector | None = None  # private API only
    description: str = ""


class EmptyStatus(ApiModel):
    # Output only and empty in the proto; whatever a client sends back is ignored before validation.
    pass


class BareMetalInstanceType(Resource):
    spec: BareMetalInstanceTypeSpec = Field(default_factory=BareMetalInstanceTypeSpec)
    status: EmptyStatus = Field(default_factory=EmptyStatus)


# ------------------------------------------------------------------------------------------ DiskImage


class DiskImageSpec(ApiModel):
    source_type: DiskImageSourceType = DiskImageSourceType.UNSPECIFIED
    source_ref: str = ""
    guest_os_family: str = ""
    architecture: list[str] = Field(default_factory=list)
    lifecycle: DiskImageLifecycle = DiskImageLifecycle.AVAILABLE


class DiskImage(Resource):
    spec: DiskImageSpec = Field(default_factory=DiskImageSpec)
    status: EmptyStatus = Field(default_factory=EmptyStatus)


# ------------------------------------------------------------------------------------- ClusterVersion


def _id_from_reference(value: Any) -> Any:
    # Accept a `{id, name}` reference too; the lab stores and answers the plain DiskImage id.
    if isinstance(value, dict):
        return value.get("id") or value.get("name")
    return value


class ClusterVersionSpec(ApiModel):
    image: str = ""
    version: str = ""
    disk_image: Annotated[str | None, BeforeValidator(_id_from_reference)] = None
    enabled: bool | None = None
    is_default: bool | None = None
    state: ClusterVersionState = ClusterVersionState.ACTIVE
    allowed_upgrades: dict[str, Any] | None = None


class ClusterVersion(Resource):
    spec: ClusterVersionSpec = Field(default_factory=ClusterVersionSpec)
    status: EmptyStatus = Field(default_factory=EmptyStatus)


# ------------------------------------------------------------------------------------ catalog items


class CatalogItemSpec(ApiModel):
    title: str = ""
    description: str = ""
    template: str = ""
    published: bool = False


class BareMetalInstanceCatalogItem(Resource):
    spec: CatalogItemSpec = Field(default_factory=CatalogItemSpec)
    status: EmptyStatus = Field(default_factory=EmptyStatus)


# ------------------------------------------------------------------------- Subnet, SecurityGroup


class NetworkObjectSpec(ApiModel):
    virtual_network: str = ""


class Subnet(Resource):
    """Only what a BMI's network attachment resolves: its id and name (the ClusterOrder's
    `subnetRef` is the Subnet CR's name, which is the object's name here)."""

    spec: NetworkObjectSpec = Field(default_factory=NetworkObjectSpec)
    status: EmptyStatus = Field(default_factory=EmptyStatus)


class SecurityGroup(Resource):
    spec: NetworkObjectSpec = Field(default_factory=NetworkObjectSpec)
    status: EmptyStatus = Field(default_factory=EmptyStatus)
