"""What the starter checks of an order before it sends a command (the node-set rules themselves
are `contracts.workflows.node_set_problem`, the workflow validator's own), and the instance-type
catalog."""

from __future__ import annotations

import asyncio
import time

from activities.bmaas.client import INSTANCE_TYPES, BmaasClient
from contracts.hub import OrderFacts
from contracts.workflows import NodeSetFields, NodeSetRequest


def desired_node_sets(facts: OrderFacts) -> list[NodeSetRequest]:
    """The order's bare-metal node requests as workflow node sets (name = instance type)."""
    return [
        NodeSetRequest(name=n.name, instance_type=n.instance_type, count=n.count) for n in facts.node_sets
    ]


MAX_PROBLEMS_SHOWN = 10


class OrderFields(NodeSetFields):
    """A refusal of an order's node requests names the ClusterOrder's fields, the ones its tenant
    wrote (`desired_node_sets` keeps the order of `facts.node_sets`)."""

    counts = "spec.nodeRequests[].numberOfNodes"

    def __init__(self, facts: OrderFacts) -> None:
        self._indexes = [n.index for n in facts.node_sets]

    def _request(self, index: int) -> str:
        request = self._indexes[index] if index < len(self._indexes) else None
        return f"spec.nodeRequests[{'' if request is None else request}]"

    def instance_type(self, index: int) -> str:
        return f"{self._request(index)}.bareMetal.instanceType"

    def count(self, index: int) -> str:
        return f"{self._request(index)}.numberOfNodes"


def order_problem(facts: OrderFacts) -> str | None:
    """What the order parser already refused: malformed or duplicate instance types, empty
    security group names."""
    found = [*facts.invalid_node_requests, *facts.invalid_network_attachment]
    if not found:
        return None
    # Bounded: a condition's message holds 32,768 characters, and the CRD bounds no list.
    shown = "spec." + "; spec.".join(found[:MAX_PROBLEMS_SHOWN])
    more = len(found) - MAX_PROBLEMS_SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


class InstanceTypeCatalog:
    """The BMaaS instance-type names, cached briefly (they change rarely; every apply needs them)."""

    def __init__(self, client: BmaasClient, ttl_seconds: float = 60.0) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._names: list[str] | None = None
        self._fetched = 0.0
        self._lock = asyncio.Lock()

    @property
    def client(self) -> BmaasClient:
        """The BMaaS client it reads through (the controller lists a deleting order's BMIs with it)."""
        return self._client

    async def names(self) -> list[str]:
        async with self._lock:
            if self._names is None or time.monotonic() - self._fetched > self._ttl:
                items = await self._client.list_all(INSTANCE_TYPES)
                names = {str((item.get("metadata") or {}).get("name") or "") for item in items}
                self._names = sorted(n for n in names if n)
                self._fetched = time.monotonic()
            return list(self._names)
