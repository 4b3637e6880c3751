"""Assisted Installer activities: the order's InfraEnv and pull-secret Secret, the discovery
ignition (the BMaaS activities' `IgnitionSource`), and the Agent's path from registration through
MAC correlation, hand-off to its NodePool, install, unbinding and deletion.

Binding goes through the HyperShift agent provider: an Agent is approved and labelled the way its
NodePool selects, the NodePool's replicas are raised (activities.hub), and the provider claims it.
Nothing here ever sets `spec.clusterDeploymentName`: an Agent bound that way is never claimed.

Secrets by reference: the pull secret is read from the ClusterOrder inside `ensure_infraenv`, the
ignition (and its URL, which carries a token) inside `discovery_ignition`; neither appears in an
input, result, heartbeat, log line or error.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agent_watch import AgentWatches
from activities.bmaas.watcher import BmiWatcher, Gone, Observed
from activities.heartbeats import Heartbeat, tick_seconds
from activities.hub import (
    MAX_CONFLICT_RETRIES,
    agent_claimed,
    annotate_machine,
    awaits_claim,
    error,
    label_query,
    nodepool_selector,
    read_order_object,
    removal_pending,
    still_conflicting,
    sync_replicas,
)
from activities.inflight import InFlight
from activities.kube import (
    AGENTS,
    CLUSTER_ORDERS,
    INFRA_ENVS,
    NODE_POOLS,
    SECRETS,
    HubAlreadyExists,
    HubApiError,
    HubConflict,
    HubKube,
    HubNotFound,
    Informer,
    KubeObject,
    Resource,
    WaitTimedOut,
    condition,
    condition_true,
    conflict_backoff,
    dig,
    labels_of,
    meta,
    refusals_retried,
)
from activities.order_events import write_order_event
from activities.reporting import delivers_reports
from activities.timestamps import parse_time
from contracts.activities import HubActivity
from contracts.bmaas import LostInstance
from contracts.hub import (
    AGENT_INSTALL_FAILED_STATES,
    AGENT_MACHINE_REF_LABEL,
    DEFAULT_PULL_SECRET,
    IGNITION_LIMIT_BYTES,
    IGNITION_WARN_BYTES,
    IMAGE_CREATED_CONDITION,
    IMAGE_CREATED_TEXT,
    INFRAENV_LABEL,
    NO_PULL_SECRET,
    ORDER_LABEL,
    OSAC_WORKER_NAME_LABEL,
    PULL_SECRET_FIELD,
    PULL_SECRET_KEY,
    REMOVING_LABEL,
    WORKER_LABEL,
    AgentHandOff,
    AgentInstalled,
    AgentMatch,
    AgentMatchProgress,
    AgentProgress,
    AgentRef,
    AgentState,
    AgentUnbound,
    AgentWatch,
    ConditionStatus,
    DeleteInfraEnvResult,
    DeleteResult,
    EnsureInfraEnvResult,
    EventReason,
    EventType,
    HandAgentInput,
    HandAgentResult,
    HubErrorType,
    ImageCreatedReason,
    InfraEnvProgress,
    InfraEnvReady,
    InfraEnvRef,
    InstallHold,
    MarkRemovingResult,
    NodePoolRef,
    PullSecretRefusal,
    ReleaseAgentInput,
    ReleasedAgents,
    ReleaseStaleAgentsInput,
    ReleaseWipedHostAgentsInput,
    UnbindAgentInput,
    WaitAgentInput,
    WaitAgentInstalledInput,
    WaitAgentUnboundInput,
    WaitAndHandAgentInput,
    WatchAgentInput,
    normalize_mac,
)
from contracts.refs import OrderRef

T = TypeVar("T")

DOCKERCONFIG_SECRET_TYPE = "kubernetes.io/dockerconfigjson"
WORKER_ANNOTATION = "osac.openshift.io/worker"
MAX_ADOPT_ATTEMPTS = 5
INVENTORY_GRACE = timedelta(minutes=2)
# How long a match waits for the inventory of an Agent registered after the match was first seen.
NEWCOMER_GRACE_S = 10.0
# How long a hand-off waits for BMaaS to say whether the worker's BMI still holds its host, when the
# process's watcher knows nothing of it: past that, the Agent is handed all the same.
HOST_CHECK_TIMEOUT_S = 5.0


# A condition reason as Kubernetes shapes them (metav1.Condition): a CamelCase token, bounded.
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]{0,62}[A-Za-z0-9_])?")


def condition_status(cond: KubeObject | None) -> ConditionStatus | None:
    status = (cond or {}).get("status")
    return ConditionStatus(status) if isinstance(status, str) and status in set(ConditionStatus) else None


def condition_reason(cond: KubeObject | None) -> str | None:
    """The condition's reason if it is reason-shaped. Only the reason: a hub condition's message is
    free text, and assisted-service quotes the tenant's pull secret in ImageCreated's."""
    reason = (cond or {}).get("reason")
    return reason if isinstance(reason, str) and _REASON.fullmatch(reason) else None


def image_created_text(reason: str | None) -> str | None:
    """The fixed text wait_infraenv_ready shows for an ImageCreated reason (never the hub's)."""
    return IMAGE_CREATED_TEXT.get(ImageCreatedReason(reason)) if reason in set(ImageCreatedReason) else None


def label_value(value: str) -> str:
    """A label value (at most 63 characters); longer slot names keep a stable hashed suffix."""
    if len(value) <= 63:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{value[:54].rstrip('-_.')}-{digest}"


def agent_macs(agent: KubeObject) -> set[str]:
    """Every interface's MAC, normalised (a bond may report any NIC's MAC)."""
    macs: set[str] = set()
    for interface in dig(agent, "status", "inventory", "interfaces") or []:
        mac = interface.get("macAddress") if isinstance(interface, dict) else None
        if isinstance(mac, str):
            try:
                macs.add(normalize_mac(mac))
            except ValueError:
                continue
    return macs


# Agent index keys (Informer.add_index): a MAC waiter reads, and is woken by, only the Agents that
# report one of its MACs or no inventory yet, not every Agent of the InfraEnv's namespace.
NO_INVENTORY_KEY = "inventory=none"


def mac_key(mac: str) -> str:
    return f"mac={mac}"


def agent_index_keys(agent: KubeObject) -> list[str]:
    macs = agent_macs(agent)
    return [mac_key(mac) for mac in macs] if macs else [NO_INVENTORY_KEY]


def _hand_off_marks(agent: KubeObject) -> tuple[str | None, str | None]:
    """The hand-off's slot label (possibly a hashed short form) and full-name annotation."""
    annotations = meta(agent).get("annotations") or {}
    return labels_of(agent).get(WORKER_LABEL), annotations.get(WORKER_ANNOTATION)


def handed_elsewhere(agent: KubeObject, worker: str) -> bool:
    """Whether the Agent carries another worker slot's hand-off (its label or its annotation)."""
    label, annotation = _hand_off_marks(agent)
    return label not in (None, label_value(worker)) or annotation not in (None, worker)


def handed_to(agent: KubeObject, worker: str) -> bool:
    """Whether the Agent carries this worker slot's hand-off (label, or the full-name annotation)
    and no other slot's."""
    return any(_hand_off_marks(agent)) and not handed_elsewhere(agent, worker)


def created_at(obj: KubeObject) -> datetime | None:
    """The hub's `creationTimestamp`."""
    return parse_time(meta(obj).get("creationTimestamp"))


def last_changed_at(agent: KubeObject) -> datetime | None:
    """When the Agent was created or a condition of it last changed (whole seconds), whichever is
    later: a host registering again into an existing Agent keeps its creation time, not its
    conditions. None when it has no creation time."""
    created = created_at(agent)
    if created is None:
        return None
    conditions = dig(agent, "status", "conditions") or []
    stamps = [parse_time(c.get("lastTransitionTime")) for c in conditions if isinstance(c, dict)]
    return max([created, *(at for at in stamps if at is not None)])


def awaiting_inventory(agent: KubeObject, now: datetime | None = None) -> bool:
    """Registered moments ago and not reporting its interfaces yet (assisted-service writes the
    inventory right after creating the Agent). Older inventory-less Agents are not waited for."""
    at = created_at(agent)
    return at is not None and (now or datetime.now(UTC)) - at < INVENTORY_GRACE


def agent_state(agent: KubeObject) -> str | None:
    state = dig(agent, "status", "debugInfo", "state")
    return str(state) if state else None


def agent_progress(
    ref: AgentRef,
    agent: KubeObject | None,
    informer: Informer | None = None,
    hold: InstallHold | None = None,
) -> AgentProgress:
    via = informer.observed_via if informer is not None else "read"
    if agent is None:
        return AgentProgress(agent=ref.name, found=False, observed_via=via)
    return AgentProgress(
        agent=ref.name,
        state=agent_state(agent),
        stage=dig(agent, "status", "progress", "currentStage"),
        claimed=AGENT_MACHINE_REF_LABEL in labels_of(agent),
        bound=condition_true(agent, "Bound"),
        installed=condition_true(agent, "Installed"),
        observed_via=via,
        **(hold.model_dump() if hold is not None else {}),
    )


def _previous_hold() -> InstallHold:
    """What an earlier attempt of wait_agent_installed last saw holding its Agent back, and the
    deadline it moved (from its heartbeats): a retry keeps both."""
    for detail in reversed(activity.info().heartbeat_details or ()):
        try:
            return InstallHold.model_validate(detail)
        except (ValueError, TypeError):
            continue
    return InstallHold()


def owner_reference(order: KubeObject, *, controller: bool = True) -> dict[str, Any]:
    m = meta(order)
    return {
        "apiVersion": CLUSTER_ORDERS.api_version,
        "kind": CLUSTER_ORDERS.kind,
        "name": m.get("name"),
        "uid": m.get("uid"),
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def _owner_refs_with(existing: KubeObject, order: KubeObject) -> list[dict[str, Any]] | None:
    """The object's ownerReferences with this order as controller; None if already so.

    References to an earlier ClusterOrder of the same name (another uid) are replaced: adopting."""
    refs = [r for r in meta(existing).get("ownerReferences") or [] if isinstance(r, dict)]
    uid = meta(order).get("uid")
    ours = [r for r in refs if r.get("uid") == uid]
    others = [r for r in refs if r.get("uid") != uid and r.get("kind") != CLUSTER_ORDERS.kind]
    other_controller = any(r.get("controller") for r in others)
    wanted = owner_reference(order, controller=not other_controller)
    if (
        len(ours) == 1
        and len(others) == len(refs) - 1
        and all(ours[0].get(k) == v for k, v in wanted.items())
    ):
        return None
    return [*others, wanted]


def _candidates(input: WaitAgentInput, agents: list[KubeObject]) -> list[KubeObject]:
    """The live Agents of the worker's InfraEnv that are not another order's."""
    found = []
    for agent in agents:
        labels = labels_of(agent)
        if labels.get(INFRAENV_LABEL) != input.infraenv.name or meta(agent).get("deletionTimestamp"):
            continue
        if labels.get(ORDER_LABEL, input.order.name) != input.order.name:
            continue  # an Agent of another order must never be taken
        found.append(agent)
    return found


class InventoryGuard:
    """Which Agents without an inventory yet hold a match back (each could turn out to report the
    same MAC): every one the hub listed when the match was first seen on a fresh list, until its
    inventory is there; those registered after that, only until `newcomer_grace` seconds after
    that first sight (any finite guard misses an Agent registered late enough; this one is bounded).
    Waiting for every newcomer held each match of a scale-up until the whole burst of registrations
    had settled (bench/README.md, round 27); an inventory normally follows its Agent within seconds."""

    def __init__(self, newcomer_grace: float = NEWCOMER_GRACE_S) -> None:
        self._awaited: frozenset[str] | None = None
        self._newcomer_grace = newcomer_grace
        self._first_seen = 0.0

    def holds(self, candidates: list[KubeObject], *, fresh: bool) -> bool:
        young = {str(meta(a).get("name")) for a in candidates if not agent_macs(a) and awaiting_inventory(a)}
        if self._awaited is None:
            if not fresh:
                return False  # a cache may lag the hub: the fresh list this calls for decides
            self._awaited = frozenset(young)
            self._first_seen = time.monotonic()
        if young & self._awaited:
            return True
        return bool(young) and time.monotonic() - self._first_seen < self._newcomer_grace


def raise_if_host_lost(bmi_id: str, observed: Observed, agent: str | None = None) -> None:
    """HostLost (non-retryable: the attempt fails and is released) once the BMI is not running its
    host any more."""
    lost = LostInstance(bmi_id=bmi_id) if isinstance(observed, Gone) else observed.lost()
    if lost is None:
        return
    seen = f" (Agent {agent})" if agent else ""
    raise error(
        f"{lost.describe()}: its host is not this worker's any more{seen}",
        HubErrorType.HOST_LOST,
        non_retryable=True,
        bmi_id=bmi_id,
        **({"name": agent} if agent else {}),
    )


def _held_elsewhere(input: WaitAgentInput, agents: list[KubeObject]) -> KubeObject | None:
    """The Agent reporting one of the BMI's MACs that still carries another slot's hand-off, for the
    waits that hand the Agent over (they know their slot); None if there is none."""
    worker = getattr(input, "worker", None)
    if worker is None:
        return None
    wanted = set(input.macs)
    return next(
        (a for a in _candidates(input, agents) if agent_macs(a) & wanted and handed_elsewhere(a, worker)),
        None,
    )


def _match_agent(
    input: WaitAgentInput,
    agents: list[KubeObject],
    guard: InventoryGuard | None = None,
    *,
    fresh: bool = True,
) -> AgentMatch | None:
    """The one Agent reporting one of the BMI's MACs; None while there is none, while it still
    carries another slot's hand-off, or while an Agent whose MACs are not known yet could turn out
    to be a duplicate (`guard`: which ones; without it, every recent one). Two: AmbiguousAgentMatch."""
    namespace, infraenv = input.infraenv.namespace, input.infraenv.name
    wanted = set(input.macs)
    candidates = _candidates(input, agents)
    matching = sorted(
        (a for a in candidates if agent_macs(a) & wanted), key=lambda a: str(meta(a).get("name"))
    )
    if len(matching) > 1:
        raise error(
            f"{len(matching)} Agents of InfraEnv {namespace}/{infraenv} match the host's MACs",
            HubErrorType.AMBIGUOUS_AGENT_MATCH,
            non_retryable=True,
            namespace=namespace,
            infraenv=infraenv,
            agents=[str(meta(a).get("name")) for a in matching],
        )
    if not matching:
        return None
    if _held_elsewhere(input, matching) is not None:
        # The host was another slot's, wiped and given to this one while that slot still releases
        # it (a host deleted behind our back): its release deletes the Agent and the host registers
        # again. Until then the Agent is that slot's, never taken.
        return None
    if (guard or InventoryGuard()).holds(candidates, fresh=fresh):
        return None
    return AgentMatch(
        namespace=namespace,
        name=str(meta(matching[0]).get("name")),
        unmatched_macs=sorted(agent_macs(matching[0]) - wanted),
    )


class AssistedActivities:
    """InfraEnv and Agent activities, and the discovery-ignition source for the BMaaS activities.

    `http` fetches the discovery ignition from assisted-service's image service (its TLS settings
    are the worker's business). `default_pull_secret` names a Secret (namespace, name) whose
    `.dockerconfigjson` is used when an order has no `spec.pullSecret`.
    """

    def __init__(
        self,
        kube: HubKube,
        http: httpx.AsyncClient,
        *,
        heartbeat_every: float = 10.0,
        default_pull_secret: tuple[str, str] | None = None,
        ignition_warn_bytes: int = IGNITION_WARN_BYTES,
        ignition_limit_bytes: int = IGNITION_LIMIT_BYTES,
        ignition_timeout: float = 30.0,
        newcomer_grace: float = NEWCOMER_GRACE_S,
        hosts: BmiWatcher | None = None,
    ) -> None:
        self._kube = kube
        self._newcomer_grace = newcomer_grace
        self._hosts = hosts  # the process's BMI watcher: is a worker's host still its BMI's?
        kube.informer(AGENTS).add_index(agent_index_keys)
        self._http = http
        self._ignitions: InFlight[tuple[str, str], str] = InFlight()
        self._heartbeat_every = heartbeat_every
        self._default_pull_secret = default_pull_secret
        self._warn_bytes = ignition_warn_bytes
        self._limit_bytes = ignition_limit_bytes
        self._ignition_timeout = ignition_timeout
        self._agent_watches = AgentWatches()

    async def aclose(self) -> None:
        """Stop the Agent watches of this process (their workers renew them elsewhere)."""
        await self._agent_watches.aclose()

    def all(self) -> list[Any]:
        """Every activity of this class, bound, for `Worker(activities=...)`."""
        return [
            self.ensure_infraenv,
            self.wait_infraenv_ready,
            self.delete_infraenv,
            self.watch_agent_for_macs,
            self.wait_agent_for_macs,
            self.hand_agent_to_nodepool,
            self.wait_agent_and_hand,
            self.wait_agent_installed,
            self.mark_agent_removing,
            self.wait_agent_unbound,
            self.release_stale_agents,
            self.release_wiped_host_agents,
            self.delete_agent,
            self.unbind_agent,
            self.release_agent,
        ]

    # -- InfraEnv ---------------------------------------------------------------------------

    @activity.defn(name=HubActivity.ENSURE_INFRAENV.value)
    async def ensure_infraenv(self, order: OrderRef) -> EnsureInfraEnvResult:
        """Ensure the pull-secret Secret and the late-binding InfraEnv, owned by the order."""
        obj = await read_order_object(self._kube, order)
        ref = InfraEnvRef.for_order(order)
        pull_secret = dig(obj, "spec", "pullSecret")
        source = PULL_SECRET_FIELD
        if not isinstance(pull_secret, str) or not pull_secret:
            pull_secret = await self._read_default_pull_secret()
            source = DEFAULT_PULL_SECRET
        secret_created = secret_updated = False
        refused: str | None = None
        refused_reason: PullSecretRefusal = HubErrorType.PULL_SECRET_INVALID
        problem: str | None
        if not pull_secret and self._default_pull_secret is not None:
            # Configured, but gone or unreadable: the operator's to fix (the log names the Secret);
            # the tenant is told that much.
            namespace, name = self._default_pull_secret
            activity.logger.warning(
                "the default pull secret %s/%s has no readable %s", namespace, name, PULL_SECRET_KEY
            )
            refused = "spec.pullSecret is not set and the provider's default pull secret cannot be read"
            refused_reason, problem = HubErrorType.PULL_SECRET_MISSING, "unreadable"
        elif not pull_secret:
            refused, refused_reason = NO_PULL_SECRET, HubErrorType.PULL_SECRET_MISSING
            source, problem = PULL_SECRET_FIELD, "not set"
        else:
            problem = pull_secret_problem(pull_secret)
            if problem is None:
                secret_data = base64.b64encode(pull_secret.encode()).decode()
                secret_created, secret_updated = await self._ensure_secret(ref, obj, secret_data)
            else:
                refused = f"{source} is not a pull secret: {problem}"
        del pull_secret
        if refused is not None:
            # Never written: the hosts keep booting with the Secret they have (a pull secret the
            # tenant removed, or one that is none). Without one there is nothing to keep, and no
            # image could be built.
            if await self._kube.get_optional(SECRETS, ref.namespace, ref.pull_secret_name) is None:
                raise error(  # the message is the tenant's text: the field and why, never the value
                    refused,
                    refused_reason,
                    non_retryable=True,
                    namespace=order.namespace,
                    name=order.name,
                    field=source,
                    problem=problem,
                )
            activity.logger.warning("ClusterOrder %s: %s; its Secret is kept", order.key, refused)
        ssh_key = dig(obj, "spec", "sshPublicKey")
        created, updated = await self._ensure_infraenv(
            ref, obj, ssh_key if isinstance(ssh_key, str) else None
        )
        if created:
            activity.logger.info("created InfraEnv %s/%s", ref.namespace, ref.name)
        return EnsureInfraEnvResult(
            infraenv=ref,
            created=created,
            secret_created=secret_created,
            updated=updated or secret_updated,
            pull_secret_refused=refused,
            pull_secret_refused_reason=refused_reason,
        )

    async def _read_default_pull_secret(self) -> str | None:
        if self._default_pull_secret is None:
            return None
        namespace, name = self._default_pull_secret
        secret = await self._kube.get_optional(SECRETS, namespace, name)
        encoded = dig(secret or {}, "data", PULL_SECRET_KEY)
        if not isinstance(encoded, str):
            return None
        try:
            return base64.b64decode(encoded).decode()
        except ValueError:
            return None

    async def _ensure_secret(self, ref: InfraEnvRef, order: KubeObject, data: str) -> tuple[bool, bool]:
        """(created, updated). Secret bodies never reach a log or an error (HubKube omits them)."""

        def drift(existing: KubeObject) -> dict[str, Any] | None:
            if existing.get("type") != DOCKERCONFIG_SECRET_TYPE:
                return None  # the type is immutable: replace the object
            return {"data": {PULL_SECRET_KEY: data}} if dig(existing, "data", PULL_SECRET_KEY) != data else {}

        return await self._create_or_adopt(
            SECRETS,
            "Secret",
            ref.namespace,
            ref.pull_secret_name,
            order,
            ref.order.name,
            {"type": DOCKERCONFIG_SECRET_TYPE, "data": {PULL_SECRET_KEY: data}},
            drift,
        )

    async def _ensure_infraenv(
        self, ref: InfraEnvRef, order: KubeObject, ssh_key: str | None
    ) -> tuple[bool, bool]:
        spec: dict[str, Any] = {
            "pullSecretRef": {"name": ref.pull_secret_name},
            "agentLabels": {ORDER_LABEL: ref.order.name},
        }
        if ssh_key:
            spec["sshAuthorizedKey"] = ssh_key

        def drift(existing: KubeObject) -> dict[str, Any]:
            current = existing.get("spec") if isinstance(existing.get("spec"), dict) else {}
            assert isinstance(current, dict)
            spec_patch: dict[str, Any] = {}
            if dig(current, "pullSecretRef", "name") != ref.pull_secret_name:
                spec_patch["pullSecretRef"] = spec["pullSecretRef"]
            agent_labels = current.get("agentLabels") if isinstance(current.get("agentLabels"), dict) else {}
            assert isinstance(agent_labels, dict)
            if agent_labels.get(ORDER_LABEL) != ref.order.name:
                spec_patch["agentLabels"] = {ORDER_LABEL: ref.order.name}
            if (current.get("sshAuthorizedKey") or None) != (ssh_key or None):
                spec_patch["sshAuthorizedKey"] = ssh_key
            if current.get("clusterRef"):
                spec_patch["clusterRef"] = None  # late binding: the InfraEnv serves no one cluster
            return {"spec": spec_patch} if spec_patch else {}

        return await self._create_or_adopt(
            INFRA_ENVS, "InfraEnv", ref.namespace, ref.name, order, ref.order.name, {"spec": spec}, drift
        )

    async def _create_or_adopt(
        self,
        resource: Resource,
        kind: str,
        namespace: str,
        name: str,
        order: KubeObject,
        order_name: str,
        content: dict[str, Any],
        drift: Callable[[KubeObject], dict[str, Any] | None],
    ) -> tuple[bool, bool]:
        """Create the order's object with `content` (labelled with `order_name`, owned by `order`),
        or adopt the one already there: `drift` gives the patch that brings it back to the order's
        settings ({} if none), or None if it must be replaced. (created, updated)."""
        labels = {ORDER_LABEL: order_name}
        for _ in range(MAX_ADOPT_ATTEMPTS):
            body = {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels,
                    "ownerReferences": [owner_reference(order)],
                },
                **content,
            }
            try:
                await self._kube.create(resource, namespace, body)
                return True, False
            except HubAlreadyExists:
                pass
            existing = await self._kube.get_optional(resource, namespace, name)
            if existing is None:
                continue  # deleted in between: create again
            self._refuse_deleting(existing, kind, namespace, name)
            patch = drift(existing)
            if patch is None:
                # Conditionally on its uid: never a newer object someone created meanwhile.
                await self._kube.delete(resource, namespace, name, uid=meta(existing).get("uid"))
                continue
            repaired = await self._repair(resource, existing, order, labels, patch)
            if repaired:
                activity.logger.info("%s %s/%s patched back to the order's settings", kind, namespace, name)
            if repaired is not None:
                return False, repaired
        raise self._adopt_conflict(kind, namespace, name)

    async def _repair(
        self,
        resource: Resource,
        existing: KubeObject,
        order: KubeObject,
        labels: dict[str, str],
        patch: dict[str, Any],
    ) -> bool | None:
        """Patch an adopted object back to the order's settings (`patch` plus metadata drift), guarded
        by its resourceVersion. False: nothing drifted; True: patched; None: it changed or vanished
        meanwhile, so the caller starts over."""
        metadata = self._metadata_drift(existing, order, labels)
        if metadata:
            patch["metadata"] = metadata
        if not patch:
            return False
        patch.setdefault("metadata", {})["resourceVersion"] = meta(existing).get("resourceVersion")
        m = meta(existing)
        try:
            await self._kube.patch(resource, str(m.get("namespace")), str(m.get("name")), patch)
        except (HubConflict, HubNotFound):
            return None
        return True

    @staticmethod
    def _metadata_drift(existing: KubeObject, order: KubeObject, labels: dict[str, str]) -> dict[str, Any]:
        patch: dict[str, Any] = {}
        current = labels_of(existing)
        if any(current.get(k) != v for k, v in labels.items()):
            patch["labels"] = labels
        owners = _owner_refs_with(existing, order)
        if owners is not None:
            patch["ownerReferences"] = owners
        return patch

    @staticmethod
    def _refuse_deleting(existing: KubeObject, kind: str, namespace: str, name: str) -> None:
        if meta(existing).get("deletionTimestamp"):
            # Retryable: once the old object is gone, a retry creates a fresh one.
            raise error(
                f"{kind} {namespace}/{name} is being deleted",
                HubErrorType.OBJECT_DELETING,
                non_retryable=False,
                kind=kind,
                namespace=namespace,
                name=name,
            )

    @staticmethod
    def _adopt_conflict(kind: str, namespace: str, name: str) -> ApplicationError:
        return error(
            f"{kind} {namespace}/{name} kept changing while being adopted",
            HubErrorType.CONFLICT,
            non_retryable=False,
            kind=kind,
            namespace=namespace,
            name=name,
        )

    @activity.defn(name=HubActivity.WAIT_INFRAENV_READY.value)
    async def wait_infraenv_ready(self, ref: InfraEnvRef) -> InfraEnvReady:
        """Heartbeats until the discovery ignition URL is published (ImageCreated visible meanwhile)."""
        informer = self._kube.informer(INFRA_ENVS)

        def evaluate(obj: KubeObject | None) -> InfraEnvReady | None:
            if obj is None or not dig(obj, "status", "bootArtifacts", "discoveryIgnitionURL"):
                return None
            return InfraEnvReady(infraenv=ref, image_created=condition_true(obj, IMAGE_CREATED_CONDITION))

        every = tick_seconds(self._heartbeat_every)
        beat = Heartbeat(every)

        def progress(obj: KubeObject | None) -> InfraEnvProgress:
            image = condition(obj, IMAGE_CREATED_CONDITION) if obj is not None else None
            reason = condition_reason(image)
            return InfraEnvProgress(
                infraenv=ref.name,
                found=obj is not None,
                ignition_url_set=bool(obj and dig(obj, "status", "bootArtifacts", "discoveryIgnitionURL")),
                image_created_status=condition_status(image),
                image_created_reason=reason,
                image_created_message=image_created_text(reason),
                observed_via=informer.observed_via,
            )

        return await self._kube.wait_object(
            INFRA_ENVS,
            ref.namespace,
            ref.name,
            evaluate,
            on_tick=lambda obj: beat(lambda: progress(obj)),
            tick_seconds=every,
        )

    @activity.defn(name=HubActivity.DELETE_INFRAENV.value)
    async def delete_infraenv(self, ref: InfraEnvRef) -> DeleteInfraEnvResult:
        """Delete the InfraEnv and its pull-secret Secret; NotFound counts as success. Called once
        every host of the order is released and wiped: the InfraEnv's unclaimed Agents go first (a
        registration that arrived after its worker's release, which no worker looks for any more),
        so no record of a wiped host stays on the hub. An approved, claimed or handed one is left,
        and logged. The sweep is best effort: refused for good, it is logged and the InfraEnv is
        deleted all the same, as before the sweep existed."""
        try:
            agents: ReleasedAgents | None = await self._release_unclaimed(
                ref, order=ref.order, macs=None, worker=None
            )
        except HubApiError as err:
            if not err.non_retryable:
                raise
            activity.logger.warning(
                "InfraEnv %s/%s: its Agents could not be swept (%s); deleting it all the same",
                ref.namespace,
                ref.name,
                err.message,
            )
            agents = None
        if agents is not None and agents.kept:
            activity.logger.warning(
                "InfraEnv %s/%s: Agent(s) %s still approved, claimed or handed, left on the hub",
                ref.namespace,
                ref.name,
                ", ".join(agents.kept),
            )
        infraenv_deleted = await self._kube.delete(INFRA_ENVS, ref.namespace, ref.name)
        secret_deleted = await self._kube.delete(SECRETS, ref.namespace, ref.pull_secret_name)
        return DeleteInfraEnvResult(
            infraenv_already_gone=not infraenv_deleted,
            secret_already_gone=not secret_deleted,
            agents_swept=agents is not None,
            agents_deleted=agents.deleted if agents is not None else [],
            agents_kept=agents.kept if agents is not None else [],
        )

    # -- the IgnitionSource of the BMaaS activities -----------------------------------------

    async def discovery_ignition(self, namespace: str, infraenv_name: str) -> str:
        """The InfraEnv's discovery ignition, fetched from its (tokened) URL. Never logged.

        Above the warning size a DiscoveryIgnitionSizeWarning Event goes to the ClusterOrder;
        above the limit (the BMI user_data maximum) non-retryable DiscoveryIgnitionTooLarge.
        The workers of a scale-up ask at once: they share one fetch (see `InFlight`)."""
        return await self._ignitions.run(
            (namespace, infraenv_name), lambda: self._discovery_ignition(namespace, infraenv_name)
        )

    async def _discovery_ignition(self, namespace: str, infraenv_name: str) -> str:
        try:
            infraenv = await self._kube.get(INFRA_ENVS, namespace, infraenv_name)
        except HubNotFound:
            # Deleted behind our back (the order's workflow ensured it before any worker started):
            # the worker fails its attempt and the order's workflow creates it again.
            raise error(
                f"InfraEnv {namespace}/{infraenv_name} not found",
                HubErrorType.INFRAENV_MISSING,
                non_retryable=True,
                namespace=namespace,
                name=infraenv_name,
            ) from None
        url = dig(infraenv, "status", "bootArtifacts", "discoveryIgnitionURL")
        if not isinstance(url, str) or not url:
            raise error(
                f"InfraEnv {namespace}/{infraenv_name} has no discovery ignition yet",
                HubErrorType.INFRAENV_NOT_READY,
                non_retryable=False,
                namespace=namespace,
                name=infraenv_name,
            )
        content, size, complete = await self._fetch_ignition(url, namespace, infraenv_name)
        del url
        if size > self._warn_bytes:
            await self._size_warning(infraenv, size, complete)
        if size > self._limit_bytes:
            shown = f"{size}" if complete else f"more than {self._limit_bytes}"
            raise error(
                f"discovery ignition of InfraEnv {namespace}/{infraenv_name} is {shown} bytes, "
                f"above the {self._limit_bytes}-byte user data limit",
                HubErrorType.IGNITION_TOO_LARGE,
                non_retryable=True,
                namespace=namespace,
                name=infraenv_name,
                size_bytes=size,
                size_exact=complete,
                limit_bytes=self._limit_bytes,
            )
        try:
            text = content.decode("utf-8")
            document = json.loads(text)
        except ValueError:
            document = None
        if not isinstance(document, dict) or not isinstance(document.get("ignition"), dict):
            raise error(
                f"discovery ignition of InfraEnv {namespace}/{infraenv_name} is not an Ignition document",
                HubErrorType.IGNITION_INVALID,
                non_retryable=True,
                namespace=namespace,
                name=infraenv_name,
                size_bytes=size,
            )
        return text

    async def _fetch_ignition(self, url: str, namespace: str, name: str) -> tuple[bytes, int, bool]:
        """(content up to the limit + 1, size, whether the size is exact). Errors carry no URL."""
        cap = self._limit_bytes + 1
        try:
            async with self._http.stream("GET", url, timeout=self._ignition_timeout) as response:
                if response.status_code != 200:
                    raise error(
                        f"fetching the discovery ignition of InfraEnv {namespace}/{name}: "
                        f"HTTP {response.status_code}",
                        HubErrorType.IGNITION_FETCH_FAILED,
                        non_retryable=False,
                        namespace=namespace,
                        name=name,
                        code=response.status_code,
                    )
                declared = response.headers.get("content-length")
                buffer = bytearray()
                async for chunk in response.aiter_bytes():
                    buffer.extend(chunk)
                    if len(buffer) >= cap:
                        break  # enough to refuse; do not pull an unbounded body into memory
        except httpx.HTTPError as exc:
            raise error(
                f"fetching the discovery ignition of InfraEnv {namespace}/{name}: {type(exc).__name__}",
                HubErrorType.IGNITION_FETCH_FAILED,
                non_retryable=False,
                namespace=namespace,
                name=name,
            ) from None
        if len(buffer) < cap:
            return bytes(buffer), len(buffer), True
        if declared and declared.isdigit():
            return bytes(buffer), int(declared), True
        return bytes(buffer), len(buffer), False

    async def _size_warning(self, infraenv: KubeObject, size: int, exact: bool) -> None:
        """Best effort: a failed Event write must not fail the BMI creation."""
        m = meta(infraenv)
        namespace = str(m.get("namespace"))
        owner = next(
            (
                r
                for r in m.get("ownerReferences") or []
                if isinstance(r, dict) and r.get("kind") == CLUSTER_ORDERS.kind
            ),
            None,
        )
        order_name = (owner or {}).get("name") or labels_of(infraenv).get(ORDER_LABEL)
        if not order_name:
            return
        involved = {
            "apiVersion": CLUSTER_ORDERS.api_version,
            "kind": CLUSTER_ORDERS.kind,
            "name": order_name,
            "namespace": namespace,
            "uid": (owner or {}).get("uid"),
        }
        shown = f"{size} bytes" if exact else f"more than {self._limit_bytes} bytes"
        message = (
            f"The discovery ignition is {shown}, above the {self._warn_bytes}-byte warning threshold "
            f"(bare-metal user data is limited to {self._limit_bytes} bytes)."
        )
        try:
            await write_order_event(
                self._kube,
                involved,
                EventReason.DISCOVERY_IGNITION_SIZE_WARNING,
                message,
                EventType.WARNING,
                key=f"{m.get('name')}/{m.get('uid')}/{size}",
            )
        except Exception as exc:
            activity.logger.warning("could not write the ignition size warning Event: %s", type(exc).__name__)

    # -- Agents -----------------------------------------------------------------------------

    @activity.defn(name=HubActivity.WATCH_AGENT_FOR_MACS.value)
    @refusals_retried
    @delivers_reports
    async def watch_agent_for_macs(self, input: WatchAgentInput) -> AgentWatch:
        """The worker's Agent if it is registered already; otherwise start (or keep) a watch in this
        process that signals `agent_registered` to the worker once it is, and return at once.

        The worker waits on a durable timer meanwhile, holding no activity slot and no heartbeat,
        and renews the watch now and then (a restarted process has lost it). Two matching Agents
        now: non-retryable AmbiguousAgentMatch, as in wait_agent_for_macs."""
        match, _ = await self._fresh_match(input)
        if match is not None:
            return AgentWatch(match=match)
        self._agent_watches.watch(input, activity.client(), lambda: self._await_match(input))
        return AgentWatch()

    @activity.defn(name=HubActivity.WAIT_AGENT_FOR_MACS.value)
    @refusals_retried
    async def wait_agent_for_macs(self, input: WaitAgentInput) -> AgentMatch:
        """The one Agent of the InfraEnv reporting one of the BMI's MACs on any interface, with its
        other MACs (`unmatched_macs`) so the workflow can check no other BMI's host owns one.

        Two or more: non-retryable AmbiguousAgentMatch (never bound; names in the error details).
        Past the deadline: non-retryable AgentRegistrationTimeout."""
        every = tick_seconds(self._heartbeat_every)
        match, _ = await self._await_agent(input, self._match_progress(input, every), every)
        return match

    def _match_progress(self, input: WaitAgentInput, every: float) -> Callable[[], None]:
        """Heartbeats of the wait's progress: the InfraEnv's Agents and those with the host's MACs
        (from the MAC index: hundreds of hosts waiting at once must not each read every inventory;
        and counted only when a heartbeat is due, not on every change the wait sees)."""
        informer = self._kube.informer(AGENTS)
        namespace, keys = input.infraenv.namespace, [mac_key(mac) for mac in sorted(set(input.macs))]
        beat = Heartbeat(every)

        def progress() -> AgentMatchProgress:
            return AgentMatchProgress(
                infraenv=input.infraenv.name,
                agents_in_infraenv=len(_candidates(input, informer.items(namespace))),
                matching_agents=len(_candidates(input, informer.indexed(namespace, keys))),
                observed_via=informer.observed_via,
            )

        return lambda: beat(progress)

    @activity.defn(name=HubActivity.WAIT_AGENT_AND_HAND.value)
    @refusals_retried
    @delivers_reports
    async def wait_agent_and_hand(self, input: WaitAndHandAgentInput) -> AgentHandOff:
        """wait_agent_for_macs, then at once hand_agent_to_nodepool: the host is approved as soon as
        its Agent registers, with no workflow task between, and the wait costs the workflow the same
        events however long it takes. An Agent that also reports MACs of none of the BMI's NICs is
        returned unhanded: the workflow asks BMaaS whose they are first.

        Once the Agent is matched the hand-off runs to its end even if the activity is cancelled
        meanwhile, so the release that follows a cancellation finds it handed (and unbinds it), not
        half-written by a request still in flight. One deleted between its match and its hand-off
        is waited for again: the host registers again."""
        every = tick_seconds(self._heartbeat_every)
        while True:
            match, peers = await self._await_agent(input, self._match_progress(input, every), every)
            await self._check_host(input.bmi_id, match.name)
            if match.unmatched_macs:
                return AgentHandOff(match=match)
            request = HandAgentInput(
                agent=AgentRef(namespace=match.namespace, name=match.name),
                nodepool=input.nodepool,
                worker=input.worker,
                hostname=input.hostname,
                macs=input.macs,
            )
            # The list the match was decided on, moments ago, is the hand-off's duplicate check.
            hand = asyncio.ensure_future(self._hand_and_sync(request, peers))
            try:
                handed = await asyncio.shield(hand)
            except asyncio.CancelledError:
                await asyncio.wait([hand])
                if not hand.cancelled() and hand.exception() is not None:
                    activity.logger.warning(
                        "hand-off of Agent %s failed as the wait was cancelled", match.name
                    )
                raise
            except ApplicationError as err:
                if err.type != HubErrorType.AGENT_NOT_FOUND.value:
                    raise
                # Deleted between the match and the hand-off (the host's previous slot swept its
                # registrations as it released it): the host registers again, wait for that.
                activity.logger.info("Agent %s vanished before its hand-off: waiting again", match.name)
                continue
            return AgentHandOff(match=match, handed=handed)

    def _host_check(self, bmi_id: str | None, agent: str | None = None) -> bool:
        """HostLost when the BMI is deleting, failed or gone: its host is wiped, and may already be
        another slot's BMI's, registering for that slot with the same MACs and Agent name. Decided on
        the process's BMI watcher, whose stream sees the deletion long before the host, wiped,
        reallocated and booted, registers again. False when the watcher knows nothing of the BMI."""
        if bmi_id is None or self._hosts is None:
            return True
        observed = self._hosts.observed(bmi_id)
        if observed is None:
            return False
        raise_if_host_lost(bmi_id, observed, agent)
        return True

    async def _check_host(self, bmi_id: str | None, agent: str) -> None:
        """`_host_check` before an Agent is handed over, with one GET when the watcher knows nothing
        of the BMI (its process restarted). A BMaaS that does not answer at once holds nothing back:
        the hand-off never waits on it."""
        if self._host_check(bmi_id, agent) or self._hosts is None or not self._hosts.streaming:
            return
        assert bmi_id is not None
        try:
            async with asyncio.timeout(HOST_CHECK_TIMEOUT_S):
                observed = await self._hosts.refresh(bmi_id)
        except Exception as err:  # slow, refused, unreadable: the Agent is handed all the same
            activity.logger.info("BMI %s not checked before Agent %s is handed: %r", bmi_id, agent, err)
            return
        raise_if_host_lost(bmi_id, observed, agent)

    async def _await_match(self, input: WaitAgentInput) -> AgentMatch:
        match, _ = await self._await_agent(input)
        return match

    async def _await_agent(
        self, input: WaitAgentInput, on_tick: Callable[[], None] | None = None, tick: float = 10.0
    ) -> tuple[AgentMatch, list[KubeObject]]:
        """Wait on the shared Agent informer until exactly one Agent matches (see _match_agent);
        the match, and the fresh list of the InfraEnv's Agents it was decided on."""
        namespace, infraenv = input.infraenv.namespace, input.infraenv.name
        informer = self._kube.informer(AGENTS)
        # Every Agent _match_agent needs: the ones with the host's MACs and the inventory-less ones.
        keys = [mac_key(mac) for mac in sorted(set(input.macs))] + [NO_INVENTORY_KEY]
        # The cache view a fresh list last disagreed with, and when: decided again only once the
        # cache changed or a tick passed, not in a loop of lists that never heartbeats.
        overruled: tuple[frozenset[tuple[str, str]], float] | None = None
        guard = InventoryGuard(self._newcomer_grace)

        def view(agents: list[KubeObject]) -> frozenset[tuple[str, str]]:
            return frozenset((str(meta(a).get("name")), str(meta(a).get("resourceVersion"))) for a in agents)

        def cached_decision() -> bool | None:
            # At every change and tick: a waiting worker whose host is lost stops waiting for it.
            self._host_check(getattr(input, "bmi_id", None))
            agents = informer.indexed(namespace, keys)
            if (
                overruled is not None
                and view(agents) == overruled[0]
                and time.monotonic() - overruled[1] < tick
            ):
                return None
            try:
                return True if _match_agent(input, agents, guard, fresh=False) is not None else None
            except ApplicationError as err:
                # An ambiguity is final (the host is given up): the cache alone may show an Agent
                # the hub deleted, so the fresh list decides it too.
                if err.type != HubErrorType.AMBIGUOUS_AGENT_MATCH:
                    raise
                return True

        while True:
            try:
                await informer.wait(
                    cached_decision,
                    namespace=namespace,
                    keys=keys,
                    deadline=input.deadline,
                    on_tick=on_tick,
                    tick_seconds=tick,
                )
            except WaitTimedOut:
                # Decided on the hub's own list: the cache may be blind while it counts as synced.
                agent, listed = await self._fresh_match(input, guard)
                if agent is not None:
                    return agent, listed
                held = _held_elsewhere(input, listed)
                if held is not None:
                    # Registered, but another slot never let its Agent go (its release hangs, or
                    # BMaaS gave one host to two BMIs): said as such, not as a missing registration.
                    owner = _hand_off_marks(held)
                    raise error(
                        f"Agent {namespace}/{meta(held).get('name')} of the host is still handed to"
                        " another worker slot at the deadline",
                        HubErrorType.AGENT_OWNED_ELSEWHERE,
                        non_retryable=True,
                        namespace=namespace,
                        name=str(meta(held).get("name")),
                        worker=owner[1] or owner[0],
                    ) from None
                raise error(
                    f"no Agent registered in InfraEnv {namespace}/{infraenv} for the host by the deadline",
                    HubErrorType.AGENT_REGISTRATION_TIMEOUT,
                    non_retryable=True,
                    namespace=namespace,
                    infraenv=infraenv,
                    deadline=input.deadline.isoformat(),
                    agents_in_infraenv=len(_candidates(input, listed)),
                ) from None
            # The cache may lag the hub: decide on a fresh list (one call per match, not per wait),
            # so an Agent registered just before is seen and an ambiguity is not missed.
            agent, listed = await self._fresh_match(input, guard)
            if agent is not None:
                return agent, listed
            overruled = (view(informer.indexed(namespace, keys)), time.monotonic())

    async def _fresh_match(
        self, input: WaitAgentInput, guard: InventoryGuard | None = None
    ) -> tuple[AgentMatch | None, list[KubeObject]]:
        """_match_agent on the InfraEnv's Agents as the hub holds them now (returned too): see
        `HubKube.list_current`; the cache alone may lag a registration or miss a look-alike."""
        ref = input.infraenv
        fresh = await self._kube.list_current(
            AGENTS, ref.namespace, label_selector=f"{INFRAENV_LABEL}={ref.name}"
        )
        agent = _match_agent(input, fresh.items, guard)
        if agent is not None:
            activity.logger.info("Agent %s/%s correlated by MAC", agent.namespace, agent.name)
        return agent, fresh.items

    @activity.defn(name=HubActivity.HAND_AGENT_TO_NODEPOOL.value)
    @refusals_retried
    @delivers_reports
    async def hand_agent_to_nodepool(self, input: HandAgentInput) -> HandAgentResult:
        """Approve the Agent, role worker, hostname, the NodePool's selector labels and the slot
        label, then bring the NodePool's replicas up to date (level-based, see sync_replicas). The
        provider then claims it (never clusterDeploymentName).

        A compare-and-swap on the Agent's resourceVersion: of two workers handing the same Agent at
        once, the later writer gets 409, re-reads, and finds the slot taken (AgentOwnedElsewhere)."""
        return await self._hand_and_sync(input)

    async def _hand_and_sync(
        self, input: HandAgentInput, peers: list[KubeObject] | None = None
    ) -> HandAgentResult:
        result = await self._hand(input, peers)
        result.replicas = await sync_replicas(self._kube, input.nodepool)
        return result

    async def _hand(self, input: HandAgentInput, peers: list[KubeObject] | None = None) -> HandAgentResult:
        """`peers`: a fresh list of the InfraEnv's Agents taken just before, for the duplicate
        check of the first try (a try after a conflict lists again). The Agent's copy in it is the
        first try's too: the write is a compare-and-swap on its version, so a copy changed since
        costs a conflict and a read, and the usual hand-off one read less."""
        selector = nodepool_selector(await self._read_nodepool(input.nodepool))
        ref = input.agent
        listed = next((a for a in peers or () if meta(a).get("name") == ref.name), None)
        slot_label = label_value(input.worker)
        wanted_labels = {**selector, WORKER_LABEL: slot_label, OSAC_WORKER_NAME_LABEL: slot_label}
        spec: dict[str, Any] = {"approved": True, "role": "worker"}
        if input.hostname:
            spec["hostname"] = input.hostname
        for attempt in range(MAX_CONFLICT_RETRIES):
            if attempt == 0 and listed is not None:
                agent = listed
            else:
                try:
                    agent = await self._kube.get(AGENTS, ref.namespace, ref.name)
                except HubNotFound:
                    raise self._agent_gone(ref) from None
            labels = labels_of(agent)
            # The slot label may be a hashed short form; the annotation carries the full slot name.
            owner, owner_name = _hand_off_marks(agent)
            if handed_elsewhere(agent, input.worker):
                raise error(
                    f"Agent {ref.namespace}/{ref.name} is already handed to another worker slot",
                    HubErrorType.AGENT_OWNED_ELSEWHERE,
                    non_retryable=True,
                    namespace=ref.namespace,
                    name=ref.name,
                    worker=owner_name or owner,
                )
            await self._refuse_shared_macs(agent, input.macs, peers if attempt == 0 else None)
            changed_labels = {k: v for k, v in wanted_labels.items() if labels.get(k) != v}
            changed_spec = {k: v for k, v in spec.items() if dig(agent, "spec", k) != v}
            needs_annotation = owner_name != input.worker
            if not changed_labels and not changed_spec and not needs_annotation:
                return HandAgentResult(agent=ref, labels=wanted_labels, changed=False)
            patch: dict[str, Any] = {
                "metadata": {
                    "labels": changed_labels,
                    "annotations": {WORKER_ANNOTATION: input.worker},
                    # Compare-and-swap: 409 if another writer changed the Agent since the read.
                    "resourceVersion": meta(agent).get("resourceVersion"),
                },
            }
            if changed_spec:
                patch["spec"] = changed_spec
            try:
                await self._kube.patch(AGENTS, ref.namespace, ref.name, patch)
            except HubNotFound:
                raise self._agent_gone(ref) from None
            except HubConflict:
                await asyncio.sleep(conflict_backoff(attempt))
                continue
            activity.logger.info(
                "Agent %s/%s handed to NodePool %s", ref.namespace, ref.name, input.nodepool.name
            )
            return HandAgentResult(agent=ref, labels=wanted_labels, changed=True)
        raise still_conflicting(
            AGENTS.kind, ref.namespace, ref.name, f"Agent {ref.namespace}/{ref.name}", MAX_CONFLICT_RETRIES
        )

    async def _refuse_shared_macs(
        self, agent: KubeObject, host_macs: list[str], peers: list[KubeObject] | None = None
    ) -> None:
        """Never hand over an Agent when another Agent of its InfraEnv also reports one of the host's
        NIC MACs (`host_macs`, the BMI's; empty: all the Agent's), a duplicate that registered after
        the correlation: AmbiguousAgentMatch, as at correlation."""
        m = meta(agent)
        namespace, name = str(m.get("namespace")), str(m.get("name"))
        infraenv = labels_of(agent).get(INFRAENV_LABEL)
        macs = agent_macs(agent) & set(host_macs) if host_macs else agent_macs(agent)
        if not infraenv or not macs:
            return
        if peers is None:
            listing = await self._kube.list_current(
                AGENTS, namespace, label_selector=f"{INFRAENV_LABEL}={infraenv}"
            )
            peers = listing.items
        sharing = sorted(
            str(meta(p).get("name"))
            for p in peers
            if meta(p).get("name") != name and not meta(p).get("deletionTimestamp") and agent_macs(p) & macs
        )
        if sharing:
            raise error(
                f"Agent {namespace}/{name} shares a MAC with {len(sharing)} other Agent(s) of its InfraEnv",
                HubErrorType.AMBIGUOUS_AGENT_MATCH,
                non_retryable=True,
                namespace=namespace,
                infraenv=infraenv,
                agents=sorted([name, *sharing]),
            )

    async def _read_nodepool(self, ref: NodePoolRef) -> KubeObject:
        try:
            return await self._kube.get(NODE_POOLS, ref.namespace, ref.name)
        except HubNotFound:
            raise error(
                f"NodePool {ref.namespace}/{ref.name} not found",
                HubErrorType.NODEPOOL_NOT_FOUND,
                non_retryable=False,
                namespace=ref.namespace,
                name=ref.name,
            ) from None

    @staticmethod
    def _agent_gone(ref: AgentRef) -> ApplicationError:
        return error(
            f"Agent {ref.namespace}/{ref.name} not found",
            HubErrorType.AGENT_NOT_FOUND,
            non_retryable=True,
            namespace=ref.namespace,
            name=ref.name,
        )

    async def _wait_agent(
        self,
        ref: AgentRef,
        evaluate: Callable[[KubeObject | None], T | None],
        *,
        deadline: datetime | None,
        hold: InstallHold | None = None,
        beat: Heartbeat | None = None,
        verdict_at_deadline: bool = True,
    ) -> T:
        """Wait on the shared Agent informer (fresh read first, see HubKube.wait_object),
        heartbeating the Agent's state and stage (and what holds it back, see wait_agent_installed).
        `beat`: the heartbeats of a wait made of several of these calls, so they keep their pace."""
        informer = self._kube.informer(AGENTS)
        every = tick_seconds(self._heartbeat_every)
        beat = beat or Heartbeat(every)
        return await self._kube.wait_object(
            AGENTS,
            ref.namespace,
            ref.name,
            evaluate,
            deadline=deadline,
            on_tick=lambda agent: beat(lambda: agent_progress(ref, agent, informer, hold)),
            tick_seconds=every,
            verdict_at_deadline=verdict_at_deadline,
        )

    @activity.defn(name=HubActivity.WAIT_AGENT_INSTALLED.value)
    @refusals_retried
    @delivers_reports
    async def wait_agent_installed(self, input: WaitAgentInstalledInput) -> AgentInstalled:
        """Until the provider claimed the Agent (agentMachineRef, Bound) and it is installed.
        `error` / `installing-pending-user-action` / gone / deadline: non-retryable AgentInstallFailed."""
        ref = input.agent
        last: dict[str, Any] = {}

        def evaluate(agent: KubeObject | None) -> AgentInstalled | None:
            self._host_check(input.bmi_id, ref.name)
            if agent is None:
                raise self._install_failed(ref, "the Agent was deleted", last)
            progress = agent_progress(ref, agent)
            last.update(state=progress.state, stage=progress.stage)
            if progress.state in AGENT_INSTALL_FAILED_STATES:
                raise self._install_failed(ref, f"the Agent is in state {progress.state}", last)
            installed = progress.installed or progress.state == AgentState.ADDED_TO_EXISTING_CLUSTER
            if progress.claimed and installed:
                return AgentInstalled(
                    agent=ref, state=progress.state, machine_ref=labels_of(agent).get(AGENT_MACHINE_REF_LABEL)
                )
            return None

        # With its NodePool and window, the wait looks every tenth of the window at whether a
        # removal holds the Agent back; each time it does, the deadline moves to a whole window
        # from then, so the Agent has one once the removal is done, however near its deadline.
        hold = _previous_hold()
        recheck = input.timeout / 10 if input.nodepool is not None and input.timeout is not None else None
        beat = Heartbeat(tick_seconds(self._heartbeat_every))
        while True:
            deadline = max(input.deadline, hold.deadline_moved_to or input.deadline)
            wake = deadline if recheck is None else min(deadline, datetime.now(UTC) + recheck)
            try:
                # A wake before the deadline only looks at what holds the Agent back; the next call
                # reads it afresh anyway.
                result = await self._wait_agent(
                    ref, evaluate, deadline=wake, hold=hold, beat=beat, verdict_at_deadline=wake >= deadline
                )
                break
            except WaitTimedOut:
                pass
            if recheck is not None and input.timeout is not None:
                holding = await self._removals_holding_back(input)
                if holding and holding != hold.held_back_by:
                    activity.logger.warning(
                        "Agent %s/%s waits for its claim: the removal of %s holds its NodePool back",
                        ref.namespace,
                        ref.name,
                        ", ".join(holding),
                    )
                hold.held_back_by = holding
                if holding:
                    moved = datetime.now(UTC) + input.timeout
                    hold.deadline_moved_to = max(moved, hold.deadline_moved_to or moved)
                    deadline = max(deadline, moved)
            if datetime.now(UTC) >= deadline:
                raise self._install_failed(
                    ref, "the install did not finish by the deadline", last, timeout=True
                ) from None
        activity.logger.info("Agent %s/%s installed", ref.namespace, ref.name)
        return result

    async def _removals_holding_back(self, input: WaitAgentInstalledInput) -> list[str]:
        """The Agents marked for removal whose Machines keep this Agent from its claim: while one
        holds its Machine, replica syncs count only claimed Agents (sync_replicas_now), so a newcomer
        fit for a claim waits for the removal (a drain with no timeout can hang it for ever), and
        failing it would only wipe its host and queue another behind the same removal. [] when the
        Agent is claimed, not fit for a claim, or nothing is being removed."""
        if input.nodepool is None:
            return []
        agent = await self._kube.get_optional(AGENTS, input.agent.namespace, input.agent.name)
        if agent is None or agent_claimed(agent):
            return []  # the usual answer, for one read: claimed, installing
        nodepool = await self._kube.get_optional(NODE_POOLS, input.nodepool.namespace, input.nodepool.name)
        if nodepool is None:
            return []  # a NodePool gone fails the Agent as it would have
        try:
            selector = nodepool_selector(nodepool)
        except ApplicationError:
            return []  # so does a NodePool without a selector
        if not awaits_claim(agent, selector):
            return []
        listing = await self._kube.list_current(
            AGENTS, input.nodepool.agent_namespace, label_selector=label_query(selector)
        )
        return sorted(str(meta(a).get("name")) for a in listing.items if removal_pending(a, selector))

    @staticmethod
    def _install_failed(
        ref: AgentRef, why: str, last: dict[str, Any], *, timeout: bool = False
    ) -> ApplicationError:
        return error(
            f"Agent {ref.namespace}/{ref.name}: {why}",
            HubErrorType.AGENT_INSTALL_FAILED,
            non_retryable=True,
            namespace=ref.namespace,
            name=ref.name,
            state=last.get("state"),
            stage=last.get("stage"),
            timeout=timeout,
        )

    @activity.defn(name=HubActivity.MARK_AGENT_REMOVING.value)
    @refusals_retried
    async def mark_agent_removing(self, agent: AgentRef) -> MarkRemovingResult:
        """Label the Agent as leaving, so it no longer counts towards its NodePool's replicas."""
        return await self._mark_removing(
            agent, await self._kube.get_optional(AGENTS, agent.namespace, agent.name)
        )

    async def _withdraw_unclaimed(self, ref: AgentRef, current: KubeObject | None) -> KubeObject | None:
        """An Agent handed to the NodePool but not claimed yet loses its approval before the replicas
        go down, by a compare-and-swap that finds it still unclaimed: the provider claims only
        approved Agents and knows nothing of our removal label, so a Machine CAPI keeps could claim
        it after the count went down, and the release would delete a claimed Agent or wait for an
        unbinding that never comes. Returns the Agent as it is now (None: gone)."""
        for attempt in range(MAX_CONFLICT_RETRIES):
            if current is None or agent_claimed(current) or dig(current, "spec", "approved") is not True:
                return current
            patch = {
                "metadata": {"resourceVersion": meta(current).get("resourceVersion")},
                "spec": {"approved": False},
            }
            try:
                return await self._kube.patch(AGENTS, ref.namespace, ref.name, patch)
            except HubNotFound:
                return None
            except HubConflict:
                await asyncio.sleep(conflict_backoff(attempt))
                current = await self._kube.get_optional(AGENTS, ref.namespace, ref.name)
        raise still_conflicting(
            AGENTS.kind, ref.namespace, ref.name, f"Agent {ref.namespace}/{ref.name}", MAX_CONFLICT_RETRIES
        )

    async def _mark_removing(self, agent: AgentRef, current: KubeObject | None) -> MarkRemovingResult:
        if current is None:
            return MarkRemovingResult(agent=agent, found=False, changed=False)
        if labels_of(current).get(REMOVING_LABEL) == "true":
            return MarkRemovingResult(agent=agent, found=True, changed=False)
        try:
            await self._kube.patch(
                AGENTS, agent.namespace, agent.name, {"metadata": {"labels": {REMOVING_LABEL: "true"}}}
            )
        except HubNotFound:
            return MarkRemovingResult(agent=agent, found=False, changed=False)
        return MarkRemovingResult(agent=agent, found=True, changed=True)

    @activity.defn(name=HubActivity.WAIT_AGENT_UNBOUND.value)
    @refusals_retried
    async def wait_agent_unbound(self, input: WaitAgentUnboundInput) -> AgentUnbound:
        """Until clusterDeploymentName is cleared and the host is unbound (or waits for a reboot:
        `unbinding-pending-user-action`). Never claimed or gone: done at once.
        Deadline: non-retryable AgentUnbindingTimeout."""
        ref = input.agent
        last: dict[str, Any] = {}
        first = [True]

        def evaluate(agent: KubeObject | None) -> AgentUnbound | None:
            # The first call sees the fresh read: "never claimed" is never concluded from a cache.
            was_first, first[0] = first[0], False
            if agent is None:
                return AgentUnbound(agent=ref, gone=True, was_claimed=not was_first)
            state = agent_state(agent)
            # Unbinding states come only after a claim: one the provider released before this wait
            # began was claimed all the same (its withdrawal and the newcomers' sync must follow).
            if was_first and not agent_claimed(agent) and state not in UNBINDING_STATES:
                return AgentUnbound(agent=ref, was_claimed=False, state=state)
            last["state"], last["agent"] = state, agent
            released = not dig(agent, "spec", "clusterDeploymentName", "name")
            if released and (
                AgentState.is_unbound(state) or state == AgentState.UNBINDING_PENDING_USER_ACTION
            ):
                return AgentUnbound(agent=ref, was_claimed=True, state=state)
            return None

        try:
            unbound = await self._wait_agent(ref, evaluate, deadline=input.deadline)
            if input.nodepool is not None and unbound.was_claimed:
                # Its Machine is gone: handed Agents held back for the removal may now come in. The
                # Agent, unbound, approved and still labelled, goes out of their reach first (on the
                # copy the wait ended on: a stale one costs a conflict and a read).
                now = await self._withdraw_unclaimed(ref, last.get("agent"))
                if now is not None and agent_claimed(now):
                    # A Machine claimed it first: released like any claimed Agent, by the retry.
                    raise error(
                        f"Agent {ref.namespace}/{ref.name} was claimed again while it was released",
                        HubErrorType.CONFLICT,
                        non_retryable=False,
                        namespace=ref.namespace,
                        name=ref.name,
                    )
                await sync_replicas(self._kube, input.nodepool)
        except WaitTimedOut:
            raise error(
                f"Agent {ref.namespace}/{ref.name} was not unbound by the deadline",
                HubErrorType.AGENT_UNBINDING_TIMEOUT,
                non_retryable=True,
                namespace=ref.namespace,
                name=ref.name,
                state=last.get("state"),
            ) from None
        return unbound

    @activity.defn(name=HubActivity.UNBIND_AGENT.value)
    @refusals_retried
    @delivers_reports
    async def unbind_agent(self, input: UnbindAgentInput) -> ReleasedAgents:
        """Scale-down of one worker, each step idempotent: withdraw the approval of an Agent not
        claimed yet, annotate its Machine so CAPI deletes that one, mark the Agent as leaving, bring
        the NodePool's replicas down, wait until the Agent is
        unbound, sync the replicas again for any Agent held back by the removal, then delete the
        Agent and the host's stale registrations.
        Deadline: non-retryable AgentUnbindingTimeout (the workflow shows it and calls again)."""
        current = await self._kube.get_optional(AGENTS, input.agent.namespace, input.agent.name)
        if current is not None and input.worker is not None and handed_elsewhere(current, input.worker):
            # An attempt of this unbind deleted our Agent and was retried; the host, lost and given
            # to another slot, registered again under the same name and was handed over.
            activity.logger.warning(
                "Agent %s/%s is handed to another worker slot now: not unbound for %s",
                input.agent.namespace,
                input.agent.name,
                input.worker,
            )
            return ReleasedAgents(kept=[input.agent.name])
        current = await self._withdraw_unclaimed(input.agent, current)
        await annotate_machine(self._kube, input.agent, current, input.nodepool)
        await self._mark_removing(input.agent, current)
        await sync_replicas(self._kube, input.nodepool)
        await self.wait_agent_unbound(
            WaitAgentUnboundInput(agent=input.agent, deadline=input.deadline, nodepool=input.nodepool)
        )
        return await self.release_agent(
            ReleaseAgentInput(agent=input.agent, infraenv=input.infraenv, order=input.order, macs=input.macs)
        )

    @activity.defn(name=HubActivity.RELEASE_AGENT.value)
    @refusals_retried
    @delivers_reports
    async def release_agent(self, input: ReleaseAgentInput) -> ReleasedAgents:
        """Delete the worker's Agent (NotFound counts as success) and the host's stale registrations.
        With `input.worker`, an Agent handed to that worker is left for its unbind and returned in
        `handed`: deleting it would leave its Machine and the NodePool's count behind. One handed to
        another worker, or bound to a cluster other than through this worker's hand-off, is never
        touched (`kept`): the named Agent may be another slot's, matched by this worker's wait
        because its host was given to this slot behind the other's back."""
        result = ReleasedAgents()
        if input.agent is not None:
            (await self._release_named(input.agent, input.worker, result)).append(input.agent.name)
        if input.find_handed and input.worker is not None:
            listing = await self._kube.list_current(
                AGENTS, input.infraenv.namespace, label_selector=f"{INFRAENV_LABEL}={input.infraenv.name}"
            )
            for agent in sorted(listing.items, key=lambda a: str(meta(a).get("name"))):
                name = str(meta(agent).get("name"))
                if handed_to(agent, input.worker) and name not in result.handed:
                    result.handed.append(name)
        if input.macs:
            stale = await self.release_stale_agents(
                ReleaseStaleAgentsInput(
                    infraenv=input.infraenv, order=input.order, macs=input.macs, worker=input.worker
                )
            )
            result.deleted += [name for name in stale.deleted if name not in result.deleted]
            result.kept += [name for name in stale.kept if name not in result.kept]
            result.handed += [name for name in stale.handed if name not in result.handed]
        return result

    async def _release_named(self, ref: AgentRef, worker: str | None, result: ReleasedAgents) -> list[str]:
        """Which of `result`'s lists the Agent belongs in, once dealt with. Without `worker` (an
        unbind, which knows the Agent is its own) the Agent is deleted. With it, the decision is
        taken on a fresh read and the delete is conditional on that version: an Agent handed to
        another slot meanwhile is not deleted on a stale look."""
        if worker is None:
            await self.delete_agent(ref)
            return result.deleted

        def judge(agent: KubeObject) -> list[str]:
            if handed_elsewhere(agent, worker):
                return result.kept
            if handed_to(agent, worker):
                return result.handed
            if agent_claimed(agent):
                return result.kept  # in a cluster, but not through this worker's hand-off
            return result.deleted

        current = await self._kube.get_optional(AGENTS, ref.namespace, ref.name)
        # Gone already: NotFound counts as success.
        where = await self._delete_as_judged(ref, current, judge, result, gone=result.deleted)
        return where if where is not None else result.deleted

    async def _delete_as_judged(
        self,
        ref: AgentRef,
        current: KubeObject | None,
        judge: Callable[[KubeObject], list[str] | None],
        result: ReleasedAgents,
        gone: list[str] | None,
    ) -> list[str] | None:
        """Which of `result`'s lists `judge` puts the Agent in (None: not ours to judge), deleting it
        when that is `result.deleted`, on the version judged: an Agent changed since (a hand-off
        landing meanwhile) is read and judged again, never deleted on a stale look. `gone`: where an
        Agent that no longer exists belongs."""
        for attempt in range(MAX_CONFLICT_RETRIES):
            if current is None:
                return gone
            where = judge(current)
            if where is not result.deleted:
                return where
            try:
                await self._kube.delete(
                    AGENTS,
                    ref.namespace,
                    ref.name,
                    uid=meta(current).get("uid"),
                    resource_version=meta(current).get("resourceVersion"),
                )
            except HubConflict:
                await asyncio.sleep(conflict_backoff(attempt))
                current = await self._kube.get_optional(AGENTS, ref.namespace, ref.name)
                continue
            return result.deleted
        raise still_conflicting(
            AGENTS.kind, ref.namespace, ref.name, f"Agent {ref.namespace}/{ref.name}", MAX_CONFLICT_RETRIES
        )

    @activity.defn(name=HubActivity.RELEASE_STALE_AGENTS.value)
    @refusals_retried
    async def release_stale_agents(self, input: ReleaseStaleAgentsInput) -> ReleasedAgents:
        """Delete the unclaimed registrations of a host being released (a duplicate-MAC twin, or an
        Agent that registered after its worker stopped waiting), so a wiped host leaves nothing behind.
        Agents that are approved, bound or handed to a worker are never touched; those handed to the
        releasing worker (`input.worker`) are returned in `handed`, for the workflow to unbind."""
        return await self._release_unclaimed(
            input.infraenv, order=input.order, macs=set(input.macs), worker=input.worker
        )

    @activity.defn(name=HubActivity.RELEASE_WIPED_HOST_AGENTS.value)
    @refusals_retried
    async def release_wiped_host_agents(self, input: ReleaseWipedHostAgentsInput) -> ReleasedAgents:
        """After the wipe, delete what the host registered between its Agent's release and its
        power-off: its unclaimed Agents created, and last changed, by the second the order's BMIs
        were listed without the host (`input.listed_at`). One changed in that same second after the
        list could be the host's registration for a BMI given it meanwhile, which needs allocation,
        image and boot within that second: not on real hardware. Nothing is deleted later than
        `WIPED_HOST_LIST_FRESH_S` after the list (a hub down for long): by then the host may be
        anyone's. The list's time is the BMaaS activity worker's clock, compared with this worker's
        and the hub's: they are taken to agree within seconds (NTP). A name of its own, so an
        activity worker that would drop the cutoff never takes it."""
        return await self._release_unclaimed(
            input.infraenv,
            order=input.order,
            macs=set(input.macs),
            worker=input.worker,
            changed_by=input.listed_at,
        )

    async def _release_unclaimed(
        self,
        ref: InfraEnvRef,
        *,
        order: OrderRef | None,
        macs: set[str] | None,
        worker: str | None,
        changed_by: datetime | None = None,
    ) -> ReleasedAgents:
        """Delete the InfraEnv's unclaimed Agents: those reporting one of `macs` (None: all), not
        labelled for another order than `order`; with `changed_by`, only those created and last
        changed by then (in whole seconds, as the hub gives them), and only until
        `WIPED_HOST_LIST_FRESH_S` after it. See release_stale_agents."""
        listing = await self._kube.list_current(
            AGENTS, ref.namespace, label_selector=f"{INFRAENV_LABEL}={ref.name}"
        )
        result = ReleasedAgents()

        def verdict(agent: KubeObject) -> list[str] | None:
            """Where the Agent goes in `result`; None: not ours to judge (skipped)."""
            labels = labels_of(agent)
            if meta(agent).get("deletionTimestamp") or (macs is not None and not agent_macs(agent) & macs):
                return None
            if order is not None and labels.get(ORDER_LABEL, order.name) != order.name:
                return None
            if changed_by is not None:
                changed = last_changed_at(agent)
                if changed is None or changed > changed_by:
                    return None  # maybe the host's registration for the BMI it was given next
                if datetime.now(UTC) - changed_by > timedelta(seconds=WIPED_HOST_LIST_FRESH_S):
                    activity.logger.warning(
                        "Agent %s/%s of a wiped host is left: its order's BMIs were listed too long ago",
                        ref.namespace,
                        meta(agent).get("name"),
                    )
                    return None
            if worker is not None and handed_to(agent, worker):
                return result.handed
            spec = agent.get("spec") or {}
            if spec.get("approved") or spec.get("clusterDeploymentName") or WORKER_LABEL in labels:
                return result.kept
            return result.deleted

        for listed in sorted(listing.items, key=lambda a: str(meta(a).get("name"))):
            name = str(meta(listed).get("name"))
            agent_ref = AgentRef(namespace=ref.namespace, name=name)
            where = await self._delete_as_judged(agent_ref, listed, verdict, result, gone=None)
            if where is not None:
                where.append(name)
        return result

    @activity.defn(name=HubActivity.DELETE_AGENT.value)
    @refusals_retried
    async def delete_agent(self, agent: AgentRef) -> DeleteResult:
        """Delete the Agent; NotFound counts as success."""
        deleted = await self._kube.delete(AGENTS, agent.namespace, agent.name)
        return DeleteResult(already_gone=not deleted)


# How long after the order's BMIs were listed without a wiped host its registrations may be swept.
WIPED_HOST_LIST_FRESH_S = 60.0
UNBINDING_STATES = frozenset({AgentState.UNBINDING, AgentState.UNBINDING_PENDING_USER_ACTION})


def pull_secret_problem(text: str) -> str | None:
    """A reason assisted-service's ParsePullSecret would refuse this pull secret for, or None. Never
    stricter than it (a good secret refused here would stop the tenant); it refuses some that pass
    here (no registry at all, an `auth` that is no user:password), which then wait for an image.
    Registries are named by position, never by key: a malformed paste can hold a credential there."""
    try:
        parsed = json.loads(text.strip())
    except RecursionError:
        return None  # nested deeper than this parser goes: left to assisted-service to judge
    except ValueError:
        return "it is not JSON"
    # Go's decoder matches a struct's field names regardless of case.
    auths = None
    if isinstance(parsed, dict):
        auths = parsed.get("auths", next((v for k, v in parsed.items() if k.lower() == "auths"), None))
    if not isinstance(auths, dict):
        return 'it has no "auths" object'
    for position, entry in enumerate(auths.values(), start=1):
        where = f'registry {position} of "auths"'
        if not isinstance(entry, dict) or not ({"auth", "credsStore"} & entry.keys()):
            return f'{where} has neither "auth" nor "credsStore"'
        auth = entry.get("auth")
        if auth is None:
            continue
        try:
            # Go's decoder skips line breaks; so does this one.
            text_auth = auth.replace("\r", "").replace("\n", "") if isinstance(auth, str) else "?"
            base64.b64decode(text_auth, validate=True)
        except ValueError:
            return f'the "auth" of {where} is not base64'
    return None
