"""Hub activities: the ClusterOrder (facts, cluster reference, status, Events), NodePool replicas and
the CAPI Machine a scale-down should remove.

Every write is declarative and idempotent: replicas are recomputed from the Agents on the hub (never
incremented), status writes are compare-and-swap on resourceVersion and retried on conflict inside
the activity, and Events can be keyed so retries do not duplicate them.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections import Counter
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeats import Heartbeat, tick_seconds
from activities.kube import (
    AGENT_MACHINES,
    AGENTS,
    CLUSTER_ORDERS,
    MACHINES,
    NODE_POOLS,
    HubAuthError,
    HubConflict,
    HubKube,
    HubNotFound,
    KubeObject,
    WaitTimedOut,
    condition_true,
    conflict_backoff,
    dig,
    labels_of,
    meta,
    now_rfc3339,
    refusals_retried,
)
from activities.order_events import OrderEventRecorder
from contracts.activities import HubActivity
from contracts.hub import (
    AGENT_MACHINE_NAMESPACE_ANNOTATION,
    AGENT_MACHINE_REF_LABEL,
    AGENT_PROVIDER_ID_PREFIX,
    DELETE_MACHINE_ANNOTATION,
    MANAGEMENT_STATE_ANNOTATION,
    REMOVING_LABEL,
    AgentRef,
    BareMetalNodeRequest,
    ClusterRelease,
    ClusterReleaseInput,
    Condition,
    HubErrorType,
    MachineAnnotation,
    ManagementState,
    NodePoolNames,
    NodePoolRef,
    OrderFacts,
    PublishStatusInput,
    PublishStatusResult,
    ReplicaSync,
    WaitClusterReferenceInput,
)
from contracts.refs import DNS_LABEL, ClusterReference, NetworkAttachmentRef, OrderRef

# Optimistic-concurrency retries inside one activity attempt before letting Temporal retry (with
# jittered backoff growing to 1 s, so a busy object still gets a window between other writers).
MAX_CONFLICT_RETRIES = 20
DEFAULT_HEARTBEAT_EVERY = 10.0


# ---------------------------------------------------------------------------------------------
# Helpers shared with activities.assisted


def error(message: str, type_: HubErrorType, *, non_retryable: bool, **details: Any) -> ApplicationError:
    """An activity error with non-secret details for operators (never tenant text)."""
    return ApplicationError(message, details or {}, type=type_.value, non_retryable=non_retryable)


def order_not_found(order: OrderRef) -> ApplicationError:
    return error(
        f"ClusterOrder {order.key} not found",
        HubErrorType.ORDER_NOT_FOUND,
        non_retryable=True,
        namespace=order.namespace,
        name=order.name,
    )


async def read_order_object(kube: HubKube, order: OrderRef) -> KubeObject:
    """A fresh read of the ClusterOrder (the caller must not let spec.pullSecret escape)."""
    try:
        return await kube.get(CLUSTER_ORDERS, order.namespace, order.name)
    except HubNotFound:
        raise order_not_found(order) from None


def still_conflicting(kind: str, namespace: str, name: str, what: str, conflicts: int) -> HubConflict:
    """The retryable error once a compare-and-swap loop has lost `conflicts` races in a row."""
    return HubConflict(
        f"{what}: still conflicting after {conflicts} retries",
        type=HubErrorType.CONFLICT,
        non_retryable=False,
        code=409,
        kind=kind,
        namespace=namespace,
        name=name,
    )


def order_involved_object(obj: KubeObject) -> dict[str, Any]:
    m = meta(obj)
    return {
        "apiVersion": CLUSTER_ORDERS.api_version,
        "kind": CLUSTER_ORDERS.kind,
        "name": m.get("name"),
        "namespace": m.get("namespace"),
        "uid": m.get("uid"),
    }


# ---------------------------------------------------------------------------------------------
# ClusterOrder parsing

_DNS_LABEL = re.compile(DNS_LABEL)


def order_facts(order: OrderRef, obj: KubeObject) -> OrderFacts:
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    node_sets: list[BareMetalNodeRequest] = []
    invalid: list[str] = []
    seen: set[str] = set()
    for index, request in enumerate(spec.get("nodeRequests") or []):
        bare_metal = request.get("bareMetal") if isinstance(request, dict) else None
        if not isinstance(bare_metal, dict):
            continue  # not a bare-metal request (VM workers are out of scope)
        instance_type = bare_metal.get("instanceType")
        count = request.get("numberOfNodes")
        if not isinstance(instance_type, str) or not _DNS_LABEL.fullmatch(instance_type):
            # fullmatch: `$` alone would let a trailing newline through (a YAML `|` block).
            invalid.append(f"nodeRequests[{index}]: instance type is not a DNS label")
        elif instance_type in seen:
            # Keep the first entry: dropping both would scale a live node set to zero.
            invalid.append(f"nodeRequests[{index}]: duplicate instance type {instance_type}")
        elif not isinstance(count, int) or isinstance(count, bool) or count < 0:
            invalid.append(f"nodeRequests[{index}]: numberOfNodes is not a non-negative integer")
        else:
            seen.add(instance_type)
            node_sets.append(
                BareMetalNodeRequest(
                    name=instance_type, instance_type=instance_type, count=count, index=index
                )
            )

    network, invalid_network = _network_attachment(spec.get("networkAttachment"))

    m = meta(obj)
    annotations = m.get("annotations") if isinstance(m.get("annotations"), dict) else {}
    assert isinstance(annotations, dict)
    state = (
        ManagementState.UNMANAGED
        if annotations.get(MANAGEMENT_STATE_ANNOTATION) == ManagementState.UNMANAGED.value
        else ManagementState.MANAGED
    )
    release_image = spec.get("releaseImage")
    return OrderFacts(
        order=order,
        uid=str(m.get("uid") or ""),
        generation=m.get("generation") if isinstance(m.get("generation"), int) else None,
        release_image=release_image if isinstance(release_image, str) and release_image else None,
        ssh_public_key_set=bool(spec.get("sshPublicKey")),
        pull_secret_set=bool(spec.get("pullSecret")),
        network_attachment=network,
        node_sets=node_sets,
        invalid_node_requests=invalid,
        invalid_network_attachment=invalid_network,
        cluster_reference=cluster_reference_of(obj),
        deleting=bool(m.get("deletionTimestamp")),
        management_state=state,
    )


def _network_attachment(attachment: object) -> tuple[NetworkAttachmentRef | None, list[str]]:
    """The attachment's references, and what is wrong with them: an empty security group name is a
    problem the tenant is told of, and is left out ("" names no group: BMaaS refuses every create
    and update with it). A repeated name is left out silently: it adds no group, the CRD allows
    it, and orders accepted with one must stay accepted."""
    if not isinstance(attachment, dict):
        return None, []
    problems: list[str] = []
    groups: list[str] = []
    refs = attachment.get("securityGroupRefs") or []
    for index, group in enumerate(refs if isinstance(refs, list) else []):
        where = f"networkAttachment.securityGroupRefs[{index}]"
        if not isinstance(group, str) or not group.strip():
            problems.append(f"{where}: not a security group name")
        elif group not in groups:
            groups.append(group)
    subnet = attachment.get("subnetRef")
    return NetworkAttachmentRef(
        subnet=subnet if isinstance(subnet, str) else None, security_groups=tuple(groups)
    ), problems


def cluster_reference_of(obj: KubeObject) -> ClusterReference | None:
    """The order's hosted cluster, once the provisioning flow wrote where it is. A reference that
    names no Kubernetes namespace and cluster (a hand edit: the CRD keeps the status open) counts
    as none yet: the worker workflows build their NodePool's reference from it, and one they could
    not build would stop them, holding their hosts."""
    ref = dig(obj, "status", "clusterReference")
    if not isinstance(ref, dict):
        return None
    namespace, name = ref.get("namespace"), ref.get("hostedClusterName")
    if not all(isinstance(part, str) and re.fullmatch(DNS_LABEL, part) for part in (namespace, name)):
        return None
    return ClusterReference(namespace=str(namespace), hosted_cluster_name=str(name))


def cluster_release(nodepools: list[KubeObject], cluster: ClusterReference) -> ClusterRelease:
    """The release most of the hosted cluster's NodePools name (ties: the greater image reference,
    so every reader picks the same one)."""
    releases: dict[str, str] = {}
    for pool in nodepools:
        image = dig(pool, "spec", "release", "image")
        ours = dig(pool, "spec", "clusterName") == cluster.hosted_cluster_name
        if ours and isinstance(image, str) and image:
            releases[str(meta(pool).get("name"))] = image
    if not releases:
        return ClusterRelease()
    counts = Counter(releases.values())
    chosen = max(counts, key=lambda image: (counts[image], image))
    return ClusterRelease(release_image=chosen, nodepools=releases)


def merge_conditions(
    existing: list[Any], wanted: list[Condition], now: str, generation: int | None
) -> list[dict[str, Any]]:
    """Merge by type; lastTransitionTime changes only when the status does; others untouched."""
    merged: list[dict[str, Any]] = [dict(c) for c in existing if isinstance(c, dict)]
    by_type = {c.get("type"): i for i, c in enumerate(merged)}
    for cond in wanted:
        item: dict[str, Any] = {
            "type": cond.type,
            "status": cond.status.value,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": now,
        }
        if generation is not None:
            item["observedGeneration"] = generation
        index = by_type.get(cond.type)
        if index is None:
            by_type[cond.type] = len(merged)
            merged.append(item)
            continue
        old = merged[index]
        if old.get("status") == item["status"] and old.get("lastTransitionTime"):
            item["lastTransitionTime"] = old["lastTransitionTime"]
        merged[index] = item
    return merged


def counts_toward(agent: KubeObject, selector: dict[str, str]) -> bool:
    """An Agent handed to a NodePool: approved, all selector labels, not removing, not deleting."""
    labels = labels_of(agent)
    return (
        dig(agent, "spec", "approved") is True
        and all(labels.get(k) == v for k, v in selector.items())
        and labels.get(REMOVING_LABEL) != "true"
        and not meta(agent).get("deletionTimestamp")
    )


def agent_claimed(agent: KubeObject) -> bool:
    """Claimed by the provider: labelled with its AgentMachine, or bound to a cluster."""
    return (
        AGENT_MACHINE_REF_LABEL in labels_of(agent)
        or bool(dig(agent, "spec", "clusterDeploymentName", "name"))
        or condition_true(agent, "Bound")
    )


def awaits_claim(agent: KubeObject, selector: dict[str, str]) -> bool:
    """Handed to the NodePool and fit for the provider's claim (osac-reference §5), not claimed yet."""
    return (
        counts_toward(agent, selector)
        and not agent_claimed(agent)
        and condition_true(agent, "Validated")
        and condition_true(agent, "Connected")
    )


def removal_pending(agent: KubeObject, selector: dict[str, str]) -> bool:
    """An Agent of this NodePool marked for removal whose Machine the provider still holds."""
    labels = labels_of(agent)
    return (
        labels.get(REMOVING_LABEL) == "true"
        and all(labels.get(k) == v for k, v in selector.items())
        and agent_claimed(agent)
    )


def label_query(selector: dict[str, str]) -> str:
    """A matchLabels selector as a list's `labelSelector`."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def nodepool_selector(nodepool: KubeObject) -> dict[str, str]:
    selector = dig(nodepool, "spec", "platform", "agent", "agentLabelSelector", "matchLabels")
    if not isinstance(selector, dict) or not selector:
        m = meta(nodepool)
        raise error(
            f"NodePool {m.get('namespace')}/{m.get('name')} has no agentLabelSelector.matchLabels",
            HubErrorType.NODEPOOL_SELECTOR_INVALID,
            non_retryable=True,
            namespace=m.get("namespace"),
            name=m.get("name"),
        )
    return {str(k): str(v) for k, v in selector.items()}


class _NodePoolSyncs:
    """The replica syncs of one NodePool in this process: one at a time, callers joining the next.

    A burst of hand-offs to one NodePool made every worker sync on its own: all but one of each
    round lost the compare-and-swap and read again, which grew quadratically (the hub's busiest
    requests at 500 workers). A sync that starts after a caller's change counts it, so every caller
    waiting while one runs shares the single sync that starts next."""

    def __init__(self) -> None:
        self.running = asyncio.Lock()
        self.next: asyncio.Future[ReplicaSync] | None = None


_syncs: weakref.WeakKeyDictionary[HubKube, dict[tuple[str, str], _NodePoolSyncs]] = (
    weakref.WeakKeyDictionary()
)


async def sync_replicas(kube: HubKube, nodepool: NodePoolRef) -> ReplicaSync:
    """`sync_replicas_now`, coalesced per NodePool within the process (see _NodePoolSyncs)."""
    per_pool = _syncs.setdefault(kube, {})
    syncs = per_pool.setdefault((nodepool.namespace, nodepool.name), _NodePoolSyncs())
    if syncs.next is None:
        syncs.next = asyncio.ensure_future(_sync_after_the_running_one(syncs, kube, nodepool))
        # Every joiner may have been cancelled: the error is still theirs to retry, not to log here.
        syncs.next.add_done_callback(lambda done: done.cancelled() or done.exception())
    # Shielded: a caller cancelled (its activity) leaves the sync to the others who joined it.
    result = await asyncio.shield(syncs.next)
    return result.model_copy(deep=True)


async def _sync_after_the_running_one(
    syncs: _NodePoolSyncs, kube: HubKube, nodepool: NodePoolRef
) -> ReplicaSync:
    async with syncs.running:
        syncs.next = None  # callers from now on may have changed Agents after this list: next one
        return await sync_replicas_now(kube, nodepool)


async def sync_replicas_now(kube: HubKube, nodepool: NodePoolRef) -> ReplicaSync:
    """Level-based: replicas = the Agents handed to the NodePool now, from a fresh list
    (`HubKube.list_current`: fresh metadata, the objects from the cache where it is up to date).

    Removal first: while an Agent marked for removal still holds its Machine, only the handed
    Agents that hold one count, so CAPI (which deletes only when Machines exceed replicas) removes
    the annotated Machine instead of the two cancelling out when one worker leaves as another
    arrives. Whoever sees the removal finish syncs again, which brings the newcomer in.

    The NodePool is read before the Agents are listed and written with its resourceVersion, so
    of two concurrent syncs the later writer always counted every hand-off the earlier saw."""
    conflicts = 0
    for attempt in range(MAX_CONFLICT_RETRIES):
        obj = await kube.get_optional(NODE_POOLS, nodepool.namespace, nodepool.name)
        if obj is None:
            return ReplicaSync(
                nodepool=nodepool, replicas=0, nodepool_found=False, conflicts_retried=conflicts
            )
        selector = nodepool_selector(obj)
        resource_version = meta(obj).get("resourceVersion")
        listing = await kube.list_current(
            AGENTS, nodepool.agent_namespace, label_selector=label_query(selector)
        )
        handed = [a for a in listing.items if counts_toward(a, selector)]
        leaving = sorted(str(meta(a).get("name")) for a in listing.items if removal_pending(a, selector))
        if leaving:
            handed = [a for a in handed if agent_claimed(a)]
        counted = sorted(str(meta(a).get("name")) for a in handed)
        previous = dig(obj, "spec", "replicas")
        previous = previous if isinstance(previous, int) else None
        desired = len(counted)
        if previous == desired:
            return ReplicaSync(
                nodepool=nodepool,
                replicas=desired,
                previous=previous,
                agents=counted,
                waiting_for_removal=leaving,
                conflicts_retried=conflicts,
            )
        patch = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": desired}}
        try:
            await kube.patch(NODE_POOLS, nodepool.namespace, nodepool.name, patch)
        except HubConflict:
            conflicts += 1
            await asyncio.sleep(conflict_backoff(attempt))
            continue
        except HubNotFound:
            return ReplicaSync(
                nodepool=nodepool, replicas=0, nodepool_found=False, conflicts_retried=conflicts
            )
        activity.logger.info(
            "NodePool %s/%s replicas %s -> %s", nodepool.namespace, nodepool.name, previous, desired
        )
        return ReplicaSync(
            nodepool=nodepool,
            replicas=desired,
            previous=previous,
            changed=True,
            agents=counted,
            waiting_for_removal=leaving,
            conflicts_retried=conflicts,
        )
    raise still_conflicting(
        NODE_POOLS.kind,
        nodepool.namespace,
        nodepool.name,
        f"NodePool {nodepool.namespace}/{nodepool.name}",
        conflicts,
    )


async def _machines_on(
    kube: HubKube, agent: AgentRef, agent_object: KubeObject | None, nodepool: NodePoolRef | None
) -> list[KubeObject]:
    """The Machines running this Agent, or installing it.

    The provider labels the Agent it claims with its AgentMachine's uid (agentMachineRef) and that
    AgentMachine's namespace (annotation agentMachineRefNamespace); its Machine owns the
    AgentMachine. The Machine itself gets the providerID only once the Agent is installed (CAPI
    copies it from a ready AgentMachine): an Agent still installing is found through its
    AgentMachine; one whose references are gone, by the Machines' providerID, in the namespaces
    where the worker's NodePool keeps them."""
    provider_id = f"{AGENT_PROVIDER_ID_PREFIX}{agent.name}"
    uid = dig(agent_object or {}, "metadata", "labels", AGENT_MACHINE_REF_LABEL)
    namespace = dig(agent_object or {}, "metadata", "annotations", AGENT_MACHINE_NAMESPACE_ANNOTATION)
    if uid and namespace:
        machine = await _machine_of_agent_machine(kube, str(namespace), str(uid))
        if machine is not None:
            return [machine]
    found: list[KubeObject] = []
    for where in [str(namespace)] if namespace else await _machine_namespaces(kube, agent, nodepool):
        listing = await kube.list(MACHINES, where)
        found += [m for m in listing.items if dig(m, "spec", "providerID") == provider_id]
    return found


async def _machine_namespaces(kube: HubKube, agent: AgentRef, nodepool: NodePoolRef | None) -> list[str]:
    """Where a worker's Machines are when its Agent no longer says: its NodePool's namespace and
    its hosted control plane's (`<namespace>-<clusterName>`, where HyperShift puts them). Never the
    whole hub: an Agent is named after its host in every order's namespace, so a host wiped and
    installed in another cluster meanwhile has a Machine of that providerID there.
    Without a NodePool (`annotate_machine_for_deletion`, which no workflow of this release calls):
    the Agent's namespace only, so on a real hub such an Agent's Machine is not marked."""
    if nodepool is None:
        return [agent.namespace]
    pool = await kube.get_optional(NODE_POOLS, nodepool.namespace, nodepool.name)
    cluster = dig(pool or {}, "spec", "clusterName")
    # A NodePool's clusterName is a DNS label (no dots): HyperShift's name is the two joined.
    hosted = [f"{nodepool.namespace}-{cluster}"] if isinstance(cluster, str) and cluster else []
    return [nodepool.namespace, *hosted]


async def _machine_of_agent_machine(kube: HubKube, namespace: str, uid: str) -> KubeObject | None:
    """The Machine owning the AgentMachine that claimed the Agent (`uid`, from its label)."""
    try:
        # Metadata only: a scale-down of every worker must not carry every AgentMachine each time.
        listing = await kube.list_metadata(AGENT_MACHINES, namespace)
    except HubAuthError as err:
        # A role without AgentMachines (a deployment older than this read): an installed worker's
        # Machine is still found by its providerID; one installing is left to CAPI's choice.
        activity.logger.warning("cannot list AgentMachines in %s (%s): grant list on them", namespace, err)
        return None
    for agent_machine in listing.items:
        m = meta(agent_machine)
        if m.get("uid") != uid:
            continue
        machine_name = next(
            (
                str(owner.get("name"))
                for owner in m.get("ownerReferences") or []
                if isinstance(owner, dict)
                and owner.get("kind") == MACHINES.kind
                and str(owner.get("apiVersion", "")).startswith(f"{MACHINES.group}/")
            ),
            str(m.get("name")),  # CAPI names an AgentMachine after its Machine
        )
        return await kube.get_optional(MACHINES, namespace, machine_name)
    return None


async def annotate_machine(
    kube: HubKube, agent: AgentRef, agent_object: KubeObject | None, nodepool: NodePoolRef | None = None
) -> MachineAnnotation:
    """Mark the Machine running on this Agent (as last read: `agent_object`, None if gone) so CAPI
    removes it first on scale-down. `nodepool`: the worker's, where its Machines are looked for when
    the Agent no longer names them."""
    machines = await _machines_on(kube, agent, agent_object, nodepool)
    if not machines:
        return MachineAnnotation(agent=agent)
    result = MachineAnnotation(agent=agent)
    for machine in sorted(machines, key=lambda m: str(meta(m).get("name"))):
        m = meta(machine)
        namespace, name = str(m.get("namespace") or ""), str(m.get("name"))
        annotations = m.get("annotations") if isinstance(m.get("annotations"), dict) else {}
        assert isinstance(annotations, dict)
        changed = False
        if annotations.get(DELETE_MACHINE_ANNOTATION) != "true":
            try:
                await kube.patch(
                    MACHINES,
                    namespace,
                    name,
                    {"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: "true"}}},
                )
                changed = True
            except HubNotFound:
                continue
        result = MachineAnnotation(agent=agent, machine=name, machine_namespace=namespace, changed=changed)
    return result


# ---------------------------------------------------------------------------------------------
# Activities


class HubActivities:
    """ClusterOrder, NodePool and Machine activities. Constructed once per worker process."""

    def __init__(self, kube: HubKube, *, heartbeat_every: float = DEFAULT_HEARTBEAT_EVERY) -> None:
        self._kube = kube
        self._heartbeat_every = heartbeat_every
        self.events = OrderEventRecorder(kube)

    def all(self) -> list[Any]:
        """Every activity of this class, bound, for `Worker(activities=...)`."""
        return [
            self.read_order,
            self.wait_cluster_reference,
            self.read_cluster_release,
            self.list_nodepools,
            self.sync_nodepool_replicas,
            self.annotate_machine_for_deletion,
            self.publish_order_status,
        ]

    @activity.defn(name=HubActivity.READ_ORDER.value)
    async def read_order(self, order: OrderRef) -> OrderFacts:
        """The non-secret facts of a ClusterOrder. NotFound: non-retryable OrderNotFound."""
        obj = await read_order_object(self._kube, order)
        return order_facts(order, obj)

    @activity.defn(name=HubActivity.WAIT_CLUSTER_REFERENCE.value)
    async def wait_cluster_reference(self, input: WaitClusterReferenceInput) -> ClusterReference:
        """Heartbeats until `status.clusterReference` is set (watched, not polled)."""
        order = input.order
        informer = self._kube.informer(CLUSTER_ORDERS)

        def evaluate(obj: KubeObject | None) -> ClusterReference | None:
            if obj is None:  # confirmed by a fresh read
                raise order_not_found(order)
            return cluster_reference_of(obj)

        every = tick_seconds(self._heartbeat_every)
        beat = Heartbeat(every)

        def on_tick(obj: KubeObject | None) -> None:
            # Set, but naming no namespace and cluster: said, or the wait would look like a missing one.
            invalid = obj is not None and isinstance(dig(obj, "status", "clusterReference"), dict)
            beat(
                lambda: {
                    "order": order.key,
                    "found": obj is not None,
                    "cluster_reference_set": False,
                    "cluster_reference_invalid": invalid,
                    "observed_via": informer.observed_via,
                }
            )

        try:
            return await self._kube.wait_object(
                CLUSTER_ORDERS,
                order.namespace,
                order.name,
                evaluate,
                deadline=input.deadline,
                on_tick=on_tick,
                tick_seconds=every,
            )
        except WaitTimedOut:
            raise error(
                f"ClusterOrder {order.key} has no cluster reference yet (or one whose namespace or"
                " hostedClusterName is no DNS label)",
                HubErrorType.CLUSTER_REFERENCE_TIMEOUT,
                non_retryable=True,
                namespace=order.namespace,
                name=order.name,
            ) from None

    @activity.defn(name=HubActivity.READ_CLUSTER_RELEASE.value)
    async def read_cluster_release(self, input: ClusterReleaseInput) -> ClusterRelease:
        """For an order that names no `releaseImage`: the release its hosted cluster's NodePools run
        (the template's default, which the cluster-provisioning flow wrote there)."""
        pools = await self._kube.list(NODE_POOLS, input.cluster.namespace)
        return cluster_release(pools.items, input.cluster)

    @activity.defn(name=HubActivity.LIST_NODEPOOLS.value)
    async def list_nodepools(self, input: ClusterReleaseInput) -> NodePoolNames:
        """The NodePools the cluster-provisioning flow made in the hosted cluster's namespace, so
        that no host is allocated for a node set whose NodePool is not there (its Agent could not
        be handed to anything)."""
        pools = await self._kube.list(NODE_POOLS, input.cluster.namespace)
        live = [p for p in pools.items if not meta(p).get("deletionTimestamp")]
        return NodePoolNames(names=sorted(str(meta(p).get("name")) for p in live))

    @activity.defn(name=HubActivity.SYNC_NODEPOOL_REPLICAS.value)
    @refusals_retried
    async def sync_nodepool_replicas(self, nodepool: NodePoolRef) -> ReplicaSync:
        return await sync_replicas(self._kube, nodepool)

    @activity.defn(name=HubActivity.ANNOTATE_MACHINE_FOR_DELETION.value)
    @refusals_retried
    async def annotate_machine_for_deletion(self, agent: AgentRef) -> MachineAnnotation:
        current = await self._kube.get_optional(AGENTS, agent.namespace, agent.name)
        return await annotate_machine(self._kube, agent, current)

    @activity.defn(name=HubActivity.PUBLISH_ORDER_STATUS.value)
    async def publish_order_status(self, input: PublishStatusInput) -> PublishStatusResult:
        """Write workers[], the aggregates and our conditions; leave every other status field alone;
        then queue the Events that came with it for the process's recorder, which writes them in the
        background: a burst of Events never holds this write, or the next one, back.

        Compare-and-swap on resourceVersion through the status subresource; conflicts are retried
        here (a concurrent writer's fields survive because the conditions are re-merged)."""
        result, obj = await self._write_status(input)
        if obj is not None and input.events:
            result.events_queued = self.events.record(order_involved_object(obj), input.events)
            result.events_dropped = len(input.events) - result.events_queued
        return result

    async def _write_status(self, input: PublishStatusInput) -> tuple[PublishStatusResult, KubeObject | None]:
        """The result, and the ClusterOrder as last read (None when it is gone)."""
        order = input.order
        workers = [w.osac_item() for w in input.workers]
        conflicts = 0
        for attempt in range(MAX_CONFLICT_RETRIES):
            obj = await self._kube.get_optional(CLUSTER_ORDERS, order.namespace, order.name)
            if obj is None:
                return PublishStatusResult(order_found=False, conflicts_retried=conflicts), None
            status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
            assert isinstance(status, dict)
            wanted: dict[str, Any] = {
                "workers": workers,
                "desiredWorkers": input.desired,
                "currentWorkers": input.current,
                "readyWorkers": input.ready,
            }
            if input.conditions:  # none given: the conditions are left exactly as they are
                generation = meta(obj).get("generation")
                wanted["conditions"] = merge_conditions(
                    list(status.get("conditions") or []),
                    input.conditions,
                    now_rfc3339(),
                    generation if isinstance(generation, int) else None,
                )
            if all(status.get(k) == v for k, v in wanted.items()):
                return PublishStatusResult(changed=False, conflicts_retried=conflicts), obj
            patch = {"metadata": {"resourceVersion": meta(obj).get("resourceVersion")}, "status": wanted}
            try:
                await self._kube.patch(
                    CLUSTER_ORDERS, order.namespace, order.name, patch, subresource="status"
                )
            except HubConflict:
                conflicts += 1
                await asyncio.sleep(conflict_backoff(attempt))
                continue
            except HubNotFound:
                return PublishStatusResult(order_found=False, conflicts_retried=conflicts), None
            return PublishStatusResult(changed=True, conflicts_retried=conflicts), obj
        raise still_conflicting(
            CLUSTER_ORDERS.kind, order.namespace, order.name, f"ClusterOrder {order.key} status", conflicts
        )
