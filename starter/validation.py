"""The workflow's node-set rules, checked before a command is sent, and the instance-type catalog.

`node_set_problem` states exactly the rules (and messages) of `ClusterWorkersWorkflow`'s
`set_node_sets` validator, so the controller can refuse an order without starting a workflow and
the CLI can refuse a count before touching the ClusterOrder. A test keeps the two in step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from activities.bmaas.client import INSTANCE_TYPES, BmaasClient
from contracts.hub import OrderFacts
from contracts.workflows import NodeSetRequest, ScaleDownGuard


def node_set_problem(
    node_sets: Sequence[NodeSetRequest],
    instance_types: Sequence[str],
    max_workers_per_order: int,
    *,
    current_total: int = 0,
    confirm_scale_down: bool = False,
    guard: ScaleDownGuard | None = None,
) -> str | None:
    """The validator's message (naming the field) for the first broken rule, or None.

    `current_total`: the workers the workflow holds now (0 before it exists), for the guard
    against mass scale-downs (`guard`: the workflow's, default `ScaleDownGuard()`)."""
    names = [n.name for n in node_sets]
    for name in sorted({n for n in names if names.count(n) > 1}):
        return f"node_sets[].name: duplicate node set {name!r}"
    known = set(instance_types)
    for i, node_set in enumerate(node_sets):
        if node_set.count < 0:
            return f"node_sets[{i}].count: must not be negative (got {node_set.count})"
        if known and node_set.instance_type not in known:
            return (
                f"node_sets[{i}].instance_type: unknown instance type {node_set.instance_type!r}"
                f" (known: {', '.join(sorted(known))})"
            )
    total = sum(n.count for n in node_sets)
    if not confirm_scale_down:
        refusal = (guard or ScaleDownGuard()).refusal(current_total, total)
        if refusal:
            return refusal
    if total > max_workers_per_order:
        return f"node_sets[].count: {total} workers exceed the maximum of {max_workers_per_order} per order"
    return None


def desired_node_sets(facts: OrderFacts) -> list[NodeSetRequest]:
    """The order's bare-metal node requests as workflow node sets (name = instance type)."""
    return [
        NodeSetRequest(name=n.name, instance_type=n.instance_type, count=n.count) for n in facts.node_sets
    ]


def order_problem(facts: OrderFacts) -> str | None:
    """Node requests the order parser already refused (malformed or duplicate instance types)."""
    if not facts.invalid_node_requests:
        return None
    return "spec." + "; spec.".join(facts.invalid_node_requests)


def same_node_sets(a: Sequence[NodeSetRequest], b: Sequence[NodeSetRequest]) -> bool:
    def key(sets: Sequence[NodeSetRequest]) -> dict[str, tuple[str, int]]:
        return {n.name: (n.instance_type, n.count) for n in sets}

    return key(a) == key(b)


class InstanceTypeCatalog:
    """The BMaaS instance-type names, cached briefly (they change rarely; every apply needs them)."""

    def __init__(self, client: BmaasClient, ttl_seconds: float = 60.0) -> None:
        self._client = client
        self._ttl = ttl_seconds
        self._names: list[str] | None = None
        self._fetched = 0.0
        self._lock = asyncio.Lock()

    async def names(self) -> list[str]:
        async with self._lock:
            if self._names is None or time.monotonic() - self._fetched > self._ttl:
                items = await self._client.list_all(INSTANCE_TYPES)
                names = {str((item.get("metadata") or {}).get("name") or "") for item in items}
                self._names = sorted(n for n in names if n)
                self._fetched = time.monotonic()
            return list(self._names)
