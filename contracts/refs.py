"""References to the objects an order is made of. Non-secret by construction."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class OrderRef(BaseModel):
    """A ClusterOrder on the hub. Its name is the OSAC order id."""

    model_config = ConfigDict(frozen=True)

    namespace: str = Field(pattern=DNS_LABEL)
    name: str = Field(pattern=DNS_LABEL)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def infraenv_name(self) -> str:
        return f"{self.name}-infraenv"

    def worker_name(self, index: int) -> str:
        return f"{self.name}-worker-{index}"

    def nodepool_name(self, instance_type: str) -> str:
        return f"nodepool-{self.name}-{instance_type}"


class NetworkAttachmentRef(BaseModel):
    """The order's `spec.networkAttachment`: references only, resolved by BMaaS."""

    model_config = ConfigDict(frozen=True)

    subnet: str | None = None
    security_groups: tuple[str, ...] = ()


class ClusterReference(BaseModel):
    """Where the hosted cluster lives: the order's `status.clusterReference`."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    hosted_cluster_name: str
