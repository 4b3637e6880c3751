"""What a fresh twin holds, so `make demo` and the tests work out of the box.

- BareMetalInstanceTypes `bm-standard` (selector `osac.openshift.io/host-class=standard`) and `bm-gpu`
  (`osac.openshift.io/host-class=gpu`), each with a management port `mgmt-0` and a fabric port `data-0`.
- Hosts: of N hosts, `N // 4` are GPU hosts (unless `gpu_hosts` says otherwise) and the rest standard,
  so `--hosts 8` gives 6 standard and 2 GPU hosts. Every host has NICs `mgmt-0` and `data-0`.
- DiskImage `rhcos-4.18`; ClusterVersion `4.18.0` with `spec.image`
  `quay.io/openshift-release-dev/ocp-release:4.18.0-x86_64` and `spec.disk_image` = the DiskImage id.
- Catalog items: `caas-system-bmi` (tenant `system`: the pass-through item CaaS creates BMIs with) and
  `bm-general` (global, published: what tenants use on the public API).
- Subnets `subnet-a`, `subnet-1` and SecurityGroups `sg-1`, `sg-2`, `sg-3`, `sg-open`, `sg-tight` of
  virtual network `lab-vnet`: what orders' network attachments name (`POST /subnets`,
  `/security_groups` add more).
Seeded ids are stable across restarts (UUIDv5 of kind and name).
"""

from __future__ import annotations

import uuid
from typing import Any

from lab.fulfillment.catalog import Catalogs, CatalogStore
from lab.fulfillment.inventory import FABRIC_PORT, MANAGEMENT_PORT, NewHost
from lab.fulfillment.models import (
    SYSTEM_TENANT,
    AcceleratorSpec,
    BareMetalInstanceCatalogItem,
    BareMetalInstanceType,
    BareMetalInstanceTypeSpec,
    CatalogItemSpec,
    ClusterVersion,
    ClusterVersionSpec,
    ClusterVersionState,
    CpuSpec,
    DiskImage,
    DiskImageLifecycle,
    DiskImageSourceType,
    DiskImageSpec,
    DiskSpec,
    HardwareSpec,
    LabelSelector,
    MemorySpec,
    Metadata,
    NetworkObjectSpec,
    NetworkPortSpec,
    PortRole,
    SecurityGroup,
    Subnet,
    utcnow,
)

HOST_CLASS_LABEL = "osac.openshift.io/host-class"
ZONE_LABEL = "topology.kubernetes.io/zone"
STANDARD_TYPE = "bm-standard"
GPU_TYPE = "bm-gpu"
DISK_IMAGE_NAME = "rhcos-4.18"
CLUSTER_VERSION_NAME = "4.18.0"
RELEASE_IMAGE = "quay.io/openshift-release-dev/ocp-release:4.18.0-x86_64"
RHCOS_IMAGE_REF = "quay.io/openshift-release-dev/ocp-v4.0-art-dev:rhcos-4.18-x86_64"
CAAS_CATALOG_ITEM = "caas-system-bmi"
TENANT_CATALOG_ITEM = "bm-general"
VIRTUAL_NETWORK = "lab-vnet"
SUBNETS = ("subnet-a", "subnet-1")
SECURITY_GROUPS = ("sg-1", "sg-2", "sg-3", "sg-open", "sg-tight")

_NAMESPACE = uuid.UUID("6f1c3c52-6c1e-4c55-9b55-0b6a6c1f7a10")


def seeded_id(kind: str, name: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{kind}/{name}"))


def _metadata(name: str, tenant: str = "") -> Metadata:
    return Metadata(name=name, tenant=tenant, version=1, creation_timestamp=utcnow(), creator="lab-seed")


def _ports(fabric_speed: str) -> list[NetworkPortSpec]:
    return [
        NetworkPortSpec(name=MANAGEMENT_PORT, role=PortRole.MANAGEMENT, type="Ethernet", speed="1Gbps"),
        NetworkPortSpec(name=FABRIC_PORT, role=PortRole.FABRIC, type="Ethernet", speed=fabric_speed),
    ]


def host_labels(host_class: str) -> dict[str, str]:
    return {HOST_CLASS_LABEL: host_class, ZONE_LABEL: "lab-zone-a"}


def seed_hosts(count: int, gpu_hosts: int | None) -> list[NewHost]:
    gpu = count // 4 if gpu_hosts is None else min(gpu_hosts, count)
    return [NewHost(labels=host_labels("standard")) for _ in range(count - gpu)] + [
        NewHost(labels=host_labels("gpu")) for _ in range(gpu)
    ]


def seed_catalogs(catalogs: Catalogs) -> None:
    catalogs.types.insert(
        BareMetalInstanceType(
            id=seeded_id("bare_metal_instance_type", STANDARD_TYPE),
            metadata=_metadata(STANDARD_TYPE),
            spec=BareMetalInstanceTypeSpec(
                description="General purpose bare-metal worker",
                host_label_selector=LabelSelector(match_labels={HOST_CLASS_LABEL: "standard"}),
                hardware=HardwareSpec(
                    cpu=CpuSpec(cores=32, architecture="x86_64", model="Xeon Gold 6338", threads_per_core=2),
                    memory=MemorySpec(total_gb=256, type="DDR4"),
                    disks=[DiskSpec(type="NVMe", capacity_gb=960, interface="NVMe")],
                    network_ports=_ports("25Gbps"),
                ),
            ),
        )
    )
    catalogs.types.insert(
        BareMetalInstanceType(
            id=seeded_id("bare_metal_instance_type", GPU_TYPE),
            metadata=_metadata(GPU_TYPE),
            spec=BareMetalInstanceTypeSpec(
                description="GPU bare-metal worker",
                host_label_selector=LabelSelector(match_labels={HOST_CLASS_LABEL: "gpu"}),
                hardware=HardwareSpec(
                    cpu=CpuSpec(cores=64, architecture="x86_64", model="EPYC 9454", threads_per_core=2),
                    memory=MemorySpec(total_gb=1024, type="DDR5"),
                    disks=[DiskSpec(type="NVMe", capacity_gb=3840, interface="NVMe")],
                    accelerators=[AcceleratorSpec(type="GPU", model="H100", vendor="NVIDIA", memory_gb=80)],
                    network_ports=_ports("100Gbps"),
                    capabilities={"gpu-count": "4"},
                ),
            ),
        )
    )
    image = catalogs.images.insert(
        DiskImage(
            id=seeded_id("disk_image", DISK_IMAGE_NAME),
            metadata=_metadata(DISK_IMAGE_NAME),
            spec=DiskImageSpec(
                source_type=DiskImageSourceType.REGISTRY,
                source_ref=RHCOS_IMAGE_REF,
                guest_os_family="rhcos",
                architecture=["x86_64"],
                lifecycle=DiskImageLifecycle.AVAILABLE,
            ),
        )
    )
    catalogs.versions.insert(
        ClusterVersion(
            id=seeded_id("cluster_version", CLUSTER_VERSION_NAME),
            metadata=_metadata(CLUSTER_VERSION_NAME),
            spec=ClusterVersionSpec(
                image=RELEASE_IMAGE,
                version=CLUSTER_VERSION_NAME,
                disk_image=image.id,
                enabled=True,
                is_default=True,
                state=ClusterVersionState.ACTIVE,
            ),
        )
    )
    catalogs.items.insert(
        BareMetalInstanceCatalogItem(
            id=seeded_id("bare_metal_instance_catalog_item", CAAS_CATALOG_ITEM),
            metadata=_metadata(CAAS_CATALOG_ITEM, SYSTEM_TENANT),
            spec=CatalogItemSpec(
                title="CaaS system pass-through",
                description="System-owned item the cluster service creates worker BMIs through.",
                published=False,
            ),
        )
    )
    catalogs.items.insert(
        BareMetalInstanceCatalogItem(
            id=seeded_id("bare_metal_instance_catalog_item", TENANT_CATALOG_ITEM),
            metadata=_metadata(TENANT_CATALOG_ITEM),
            spec=CatalogItemSpec(
                title="Bare-metal server", description="A whole bare-metal host.", published=True
            ),
        )
    )
    networks: list[tuple[CatalogStore[Any], type[Subnet] | type[SecurityGroup], tuple[str, ...]]] = [
        (catalogs.subnets, Subnet, SUBNETS),
        (catalogs.security_groups, SecurityGroup, SECURITY_GROUPS),
    ]
    for store, model, names in networks:
        for name in names:
            spec = NetworkObjectSpec(virtual_network=VIRTUAL_NETWORK)
            store.insert(model(id=seeded_id(store.kind, name), metadata=_metadata(name), spec=spec))
