"""A stand-in for OSAC's cluster-provisioning job (the AAP playbook, osac-reference.md §3).

For every ClusterOrder (unless annotated `osac.openshift.io/management-state=unmanaged` or being
deleted), `timings.cluster_provisioning_s` after its creation:

1. the hosted cluster lives in the order's own namespace (ensured to exist). The HyperShift agent
   provider here claims Agents in its NodePools' namespace, so that namespace is also where the
   order's InfraEnv and its Agents live (a HostedCluster's `agentNamespace`);
2. one NodePool per `spec.nodeRequests[]` entry with `bareMetal`, named
   `nodepool-<order>-<instanceType>` (lowercased, other characters -> `-`), `replicas: 0`,
   `spec.clusterName = <order name>` (the hosted cluster is named after the order),
   `spec.release.image` = the order's `releaseImage`, or the template's default: the release the
   fulfillment twin seeds a ClusterVersion for, as a real template would name a supported one,
   `spec.platform.type: Agent` and `agentLabelSelector.matchLabels =
   {osac.openshift.io/clusterorder: <order>, osac.openshift.io/resource_class: <instanceType>}`;
3. `status.clusterReference {namespace, hostedClusterName, roleBindingName, serviceAccountName}`
   is merge-patched onto the order's status (all four are required by the CRD).

NodePools come before the reference so a reader of the reference finds them. Node sets added later
get their NodePool on the next pass; existing NodePools are never modified (replicas belong to the
workers controller) and workers (BMIs, Agents) are never touched. A removed node set's NodePool is
left in place, and nothing is torn down when the order is deleted.
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime
from typing import Any

from lab.fulfillment.seed import RELEASE_IMAGE
from lab.hub_controllers.constants import UNMANAGED, Annotation, EventType, Label
from lab.hub_controllers.events import EventRecorder
from lab.hub_controllers.informer import Informer
from lab.hub_controllers.kube import ApiError, KubeApi, Obj
from lab.hub_controllers.resources import CLUSTER_ORDERS, NAMESPACES, NODE_POOLS, ApiResource
from lab.hub_controllers.timings import AgentTimings
from lab.hub_controllers.workqueue import Controller

log = logging.getLogger(__name__)

_INVALID = re.compile(r"[^a-z0-9-]+")
# NodePools require a release; an order without `releaseImage` gets the template's default.
DEFAULT_RELEASE_IMAGE = RELEASE_IMAGE


def _dns_label(text: str, limit: int = 63) -> str:
    label = _INVALID.sub("-", text.lower()).strip("-") or "x"
    if len(label) <= limit:
        return label
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{label[: limit - 9].rstrip('-')}-{digest}"


def cluster_namespace(order: Obj) -> str:
    return str(order["metadata"]["namespace"])


def node_pool_name(order_name: str, instance_type: str) -> str:
    return _dns_label(f"nodepool-{order_name}-{instance_type}", limit=253)


def _created_at(order: Obj) -> float | None:
    raw = order["metadata"].get("creationTimestamp")
    if not raw:
        return None
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class ClusterOrderController(Controller):
    name = "cluster-provisioning"

    def __init__(
        self,
        api: KubeApi,
        orders: Informer,
        node_pools: Informer,
        *,
        timings: AgentTimings,
        events: EventRecorder,
    ) -> None:
        super().__init__()
        self._api, self._orders, self._node_pools = api, orders, node_pools
        self._timings, self._events = timings, events
        self._first_seen: dict[str, float] = {}
        self.watch(orders)
        self.needs(node_pools)

    async def reconcile(self, key: str) -> float | None:
        order = self._orders.get(key)
        if order is None:
            self._first_seen.pop(key, None)
            return None
        m = order["metadata"]
        if (
            m.get("deletionTimestamp")
            or (m.get("annotations") or {}).get(Annotation.MANAGEMENT_STATE) == UNMANAGED
        ):
            return None
        # Count from the order's creation so a restarted lab does not make old orders wait again.
        started = _created_at(order) or self._first_seen.setdefault(key, datetime.now(UTC).timestamp())
        remaining = started + self._timings.cluster_provisioning_s - datetime.now(UTC).timestamp()
        reference: dict[str, Any] = (order.get("status") or {}).get("clusterReference") or {}
        if remaining > 0 and not reference:
            return remaining

        namespace = reference.get("namespace") or cluster_namespace(order)
        hosted_cluster = reference.get("hostedClusterName") or _dns_label(m["name"])
        if not reference:
            await self._ensure(
                NAMESPACES,
                {"metadata": {"name": namespace, "labels": {Label.CLUSTER_ORDER.value: m["name"]}}},
            )
        for request in order.get("spec", {}).get("nodeRequests") or []:
            instance_type = (request.get("bareMetal") or {}).get("instanceType")
            if instance_type:
                await self._ensure_node_pool(order, namespace, hosted_cluster, str(instance_type))
        if not reference:
            reference = {
                "namespace": namespace,
                "hostedClusterName": hosted_cluster,
                "roleBindingName": f"{hosted_cluster}-admin",
                "serviceAccountName": f"{hosted_cluster}-admin",
            }
            await self._api.patch(
                CLUSTER_ORDERS,
                m["namespace"],
                m["name"],
                {"status": {"clusterReference": reference}},
                subresource="status",
            )
            await self._events.emit(
                order,
                EventType.NORMAL,
                "HostedClusterProvisioned",
                f"Hosted cluster {hosted_cluster} is in {namespace}",
            )
        return None

    async def _ensure_node_pool(self, order: Obj, namespace: str, cluster: str, instance_type: str) -> None:
        order_name = order["metadata"]["name"]
        name = node_pool_name(order_name, instance_type)
        if self._node_pools.get(f"{namespace}/{name}") is not None:
            return
        spec: dict[str, Any] = {
            "clusterName": cluster,
            "replicas": 0,
            "management": {"upgradeType": "InPlace"},
            "platform": {
                "type": "Agent",
                "agent": {
                    "agentLabelSelector": {
                        "matchLabels": {
                            Label.CLUSTER_ORDER.value: order_name,
                            Label.RESOURCE_CLASS.value: instance_type,
                        }
                    }
                },
            },
        }
        spec["release"] = {"image": order.get("spec", {}).get("releaseImage") or DEFAULT_RELEASE_IMAGE}
        body = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {Label.CLUSTER_ORDER.value: order_name},
            },
            "spec": spec,
        }
        await self._ensure(NODE_POOLS, body)

    async def _ensure(self, res: ApiResource, body: Obj) -> None:
        try:
            await self._api.create(res, body)
        except ApiError as exc:
            if not exc.is_already_exists:
                raise
