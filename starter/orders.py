"""ClusterOrders on the hub, as callers (controller, CLI, demo) read and change them.

Through `HubKube`, the project's one wrapper of the hub's Kubernetes API. Every object handed out
has `spec.pullSecret` stripped (the informer's own transform), so the pull secret never leaves the
hub. Every write is a compare-and-swap on `resourceVersion`, retried from a fresh read on conflict,
so concurrent writers (another controller, the workflow's status writes, a tenant) never lose an
update: finalizers and `nodeRequests` are lists that a merge patch replaces whole.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from activities.hub import merge_conditions
from activities.kube import (
    CLUSTER_ORDERS,
    HubAlreadyExists,
    HubConflict,
    HubKube,
    HubNotFound,
    KubeObject,
    Resource,
    condition,
    dig,
    meta,
    now_rfc3339,
)
from contracts.hub import Condition, ConditionStatus
from contracts.refs import OrderRef
from contracts.workflows import CONFIRM_SCALE_DOWN_ANNOTATION

NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
FINALIZER = "osac.openshift.io/baremetal-workers"
MAX_CAS_ATTEMPTS = 10


class ControllerCondition(StrEnum):
    """Conditions the controller owns on a ClusterOrder (the workflow owns the others)."""

    NODE_REQUESTS_VALID = "NodeRequestsValid"
    WORKERS_WORKFLOW_STOPPED = "WorkersWorkflowStopped"


class ConditionReason(StrEnum):
    ACCEPTED = "NodeRequestsAccepted"
    INVALID = "InvalidNodeRequests"
    RUNNING = "WorkflowRunning"
    # `WorkersWorkflowStopped`: no workflow runs for a deleting order, yet BMaaS lists BMIs of it.
    HOSTS_STILL_ALLOCATED = "HostsStillAllocated"


class OrderChangeError(Exception):
    """A ClusterOrder change that cannot be made as asked (the message says why)."""


def order_ref(obj: KubeObject) -> OrderRef:
    m = meta(obj)
    return OrderRef(namespace=str(m.get("namespace")), name=str(m.get("name")))


def finalizers(obj: KubeObject) -> list[str]:
    value = meta(obj).get("finalizers")
    return [str(f) for f in value] if isinstance(value, list) else []


def generation(obj: KubeObject) -> int | None:
    value = meta(obj).get("generation")
    return value if isinstance(value, int) else None


def confirmed(obj: KubeObject) -> bool:
    """The order carries the confirmation a mass scale-down needs (the workflow's guard)."""
    annotations = meta(obj).get("annotations")
    return isinstance(annotations, dict) and annotations.get(CONFIRM_SCALE_DOWN_ANNOTATION) == "true"


def condition_of(obj: KubeObject, kind: ControllerCondition) -> dict[str, Any] | None:
    return condition(obj, kind.value)


class HubOrders:
    """Reads and compare-and-swap writes of ClusterOrders."""

    def __init__(self, kube: HubKube) -> None:
        self.kube = kube

    def _clean(self, obj: KubeObject) -> KubeObject:
        return self.kube.informer(CLUSTER_ORDERS).transform(obj)

    async def get(self, order: OrderRef) -> KubeObject | None:
        """A fresh read (not the informer cache), without the pull secret."""
        obj = await self.kube.get_optional(CLUSTER_ORDERS, order.namespace, order.name)
        return self._clean(obj) if obj is not None else None

    async def _cas(
        self, order: OrderRef, change: Callable[[KubeObject], Awaitable[bool]], obj: KubeObject | None = None
    ) -> KubeObject | None:
        """Run `change(obj)` (which patches with obj's resourceVersion and says whether it wrote)
        until it does not conflict; None when the order is gone."""
        for attempt in range(MAX_CAS_ATTEMPTS):
            if obj is None:
                obj = await self.get(order)
                if obj is None:
                    return None
            try:
                await change(obj)
                return obj
            except HubConflict:
                obj = None
                await asyncio.sleep(min(1.0, 0.02 * 2**attempt) * (0.5 + random.random()))
            except HubNotFound:
                return None
        raise OrderChangeError(f"ClusterOrder {order.key}: still conflicting after {MAX_CAS_ATTEMPTS} tries")

    async def _patch(self, obj: KubeObject, patch: dict[str, Any], *, status: bool = False) -> None:
        m = meta(obj)
        patch = {
            **patch,
            "metadata": {**patch.get("metadata", {}), "resourceVersion": m.get("resourceVersion")},
        }
        await self.kube.patch(
            CLUSTER_ORDERS,
            str(m["namespace"]),
            str(m["name"]),
            patch,
            subresource="status" if status else None,
        )

    # -- finalizer ----------------------------------------------------------------------------

    async def add_finalizer(self, order: OrderRef, obj: KubeObject | None = None) -> bool:
        """Ensure our finalizer; False when the order is gone or already being deleted."""
        added = False

        async def change(current: KubeObject) -> bool:
            nonlocal added
            if meta(current).get("deletionTimestamp"):
                return False  # a deleting object accepts no new finalizers
            present = finalizers(current)
            if FINALIZER in present:
                added = True
                return False
            await self._patch(current, {"metadata": {"finalizers": [*present, FINALIZER]}})
            added = True
            return True

        await self._cas(order, change, obj)
        return added

    async def remove_finalizer(self, order: OrderRef, obj: KubeObject | None = None) -> None:
        async def change(current: KubeObject) -> bool:
            present = finalizers(current)
            if FINALIZER not in present:
                return False
            await self._patch(current, {"metadata": {"finalizers": [f for f in present if f != FINALIZER]}})
            return True

        await self._cas(order, change, obj)

    # -- conditions ---------------------------------------------------------------------------

    async def set_condition(
        self,
        order: OrderRef,
        kind: ControllerCondition,
        status: ConditionStatus,
        reason: str,
        message: str,
        obj: KubeObject | None = None,
        *,
        observed_generation: int | None = None,
    ) -> None:
        """Set one condition; no write if it says so already. observedGeneration is the generation
        the decision was made on (`observed_generation`), else the order's as read for the write: an
        edit that came in between must not be stamped as seen."""
        wanted = Condition(type=kind.value, status=status, reason=reason, message=message)

        async def change(current: KubeObject) -> bool:
            existing = condition(current, kind.value)
            gen = observed_generation if observed_generation is not None else generation(current)
            if (
                existing is not None
                and existing.get("status") == status.value
                and existing.get("reason") == reason
                and existing.get("message") == message
                and existing.get("observedGeneration") == gen
            ):
                return False
            conditions = merge_conditions(
                list(dig(current, "status", "conditions") or []), [wanted], now_rfc3339(), gen
            )
            await self._patch(current, {"status": {"conditions": conditions}}, status=True)
            return True

        await self._cas(order, change, obj)

    async def clear_condition(self, order: OrderRef, kind: ControllerCondition) -> None:
        async def change(current: KubeObject) -> bool:
            existing = list(dig(current, "status", "conditions") or [])
            kept = [c for c in existing if not (isinstance(c, dict) and c.get("type") == kind.value)]
            if len(kept) == len(existing):
                return False
            await self._patch(current, {"status": {"conditions": kept}}, status=True)
            return True

        await self._cas(order, change)

    # -- node requests ------------------------------------------------------------------------

    async def set_node_count(
        self,
        order: OrderRef,
        node_set: str,
        count: int | Callable[[int], int],
        *,
        annotations: dict[str, str] | None = None,
    ) -> KubeObject:
        """Set `numberOfNodes` of the bare-metal node request whose instance type is `node_set`
        (and `annotations`, in the same write). `count` may be a function of the order's current
        count, applied inside the compare-and-swap, so a concurrent edit is never overwritten.

        Returns the order as written (its new generation tells when the workflow has caught up)."""
        written: KubeObject | None = None

        async def change(current: KubeObject) -> bool:
            nonlocal written
            requests = [
                dict(r) if isinstance(r, dict) else r for r in dig(current, "spec", "nodeRequests") or []
            ]
            matches = [
                i
                for i, r in enumerate(requests)
                if isinstance(r, dict) and dig(r, "bareMetal", "instanceType") == node_set
            ]
            if not matches:
                known = sorted(
                    str(dig(r, "bareMetal", "instanceType"))
                    for r in requests
                    if isinstance(r, dict) and dig(r, "bareMetal", "instanceType")
                )
                raise OrderChangeError(
                    f"node_set: ClusterOrder {order.key} has no bare-metal node request {node_set!r}"
                    f" (known: {', '.join(known) or 'none'})"
                )
            present = meta(current).get("annotations") or {}
            now = requests[matches[0]].get("numberOfNodes")
            wanted = count(now if isinstance(now, int) else 0) if callable(count) else count
            if now == wanted and all(present.get(k) == v for k, v in (annotations or {}).items()):
                written = current
                return False
            requests[matches[0]]["numberOfNodes"] = wanted
            metadata: dict[str, Any] = {"resourceVersion": meta(current).get("resourceVersion")}
            if annotations:
                metadata["annotations"] = annotations
            written = await self.kube.patch(
                CLUSTER_ORDERS,
                order.namespace,
                order.name,
                {"metadata": metadata, "spec": {"nodeRequests": requests}},
            )
            return True

        if await self._cas(order, change) is None or written is None:
            raise OrderChangeError(f"ClusterOrder {order.key} not found on the hub")
        return self._clean(written)

    async def remove_confirmation(self, order: OrderRef, confirmed_generation: int | None) -> None:
        """Remove the confirm-scale-down annotation the change of `confirmed_generation` used; kept
        when the order has changed since (it may be the confirmation of the next change)."""

        async def change(current: KubeObject) -> bool:
            annotations = meta(current).get("annotations") or {}
            if (
                CONFIRM_SCALE_DOWN_ANNOTATION not in annotations
                or generation(current) != confirmed_generation
            ):
                return False
            await self._patch(current, {"metadata": {"annotations": {CONFIRM_SCALE_DOWN_ANNOTATION: None}}})
            return True

        await self._cas(order, change)

    async def remove_annotation(self, order: OrderRef, key: str) -> None:
        """A merge patch that deletes one key: safe without compare-and-swap."""
        try:
            await self.kube.patch(
                CLUSTER_ORDERS, order.namespace, order.name, {"metadata": {"annotations": {key: None}}}
            )
        except HubNotFound:
            pass

    # -- whole objects (the demo and tests act as a tenant would) ------------------------------

    async def ensure_namespace(self, name: str) -> None:
        if await self.kube.get_optional(NAMESPACES, None, name) is None:
            try:
                await self.kube.create(NAMESPACES, None, {"metadata": {"name": name}})
            except HubAlreadyExists:
                pass  # created meanwhile

    async def create(self, body: KubeObject) -> KubeObject:
        m = meta(body)
        created = await self.kube.create(CLUSTER_ORDERS, str(m["namespace"]), body)
        return self._clean(created)

    async def delete(self, order: OrderRef) -> bool:
        return await self.kube.delete(CLUSTER_ORDERS, order.namespace, order.name)
