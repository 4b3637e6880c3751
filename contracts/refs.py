"""References to the objects an order is made of. Non-secret by construction."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
MAX_LABEL = 63  # a DNS label's length, and a label value's


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

    def long_name_problem(self, instance_type: str, highest_worker_index: int) -> str | None:
        """Why a name derived from this order cannot exist, or None. BMaaS names and hostnames are
        DNS labels, the InfraEnv's name is its Agents' label value, and HyperShift puts the
        NodePool's in labels too: each at most 63 characters."""
        derived = (
            ("NodePool", self.nodepool_name(instance_type)),
            ("InfraEnv", self.infraenv_name),
            ("workers (BMIs, hostnames)", self.worker_name(highest_worker_index)),
        )
        for what, name in derived:
            if len(name) > MAX_LABEL:
                return (
                    f"order.name: {self.name!r} is too long for the names made from it: its {what}"
                    f" would be named {name!r}, {len(name)} characters, over the {MAX_LABEL} of a DNS label"
                )
        return None


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
