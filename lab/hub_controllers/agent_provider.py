"""The HyperShift agent platform: NodePool replicas -> CAPI Machines + AgentMachines -> claimed Agents.

Per NodePool with `spec.platform.agent.agentLabelSelector` (Machines, AgentMachines and Agents live in
the NodePool's namespace), as CAPI's machine controller and openshift/cluster-api-provider-agent do:

- scale up: create Machines (`<nodepool>-<5 chars>`, labels `hypershift.openshift.io/nodePool` and
  `cluster.x-k8s.io/cluster-name`) until there are `spec.replicas`, each followed by its AgentMachine:
  same name and labels, owned by the Machine (a controller ownerReference, so the hub's garbage
  collector deletes it with the Machine). Each AgentMachine without an Agent claims one that matches
  the selector and is approved, `Validated=True`, `Connected=True`, `Bound=False` and not being
  deleted, by a compare-and-swap update (PUT with the Agent's resourceVersion) that sets label
  `agentMachineRef=<the AgentMachine's uid>`, annotation `agentMachineRefNamespace=<its namespace>`
  and `spec.clusterDeploymentName = {name: <clusterName>, namespace: <nodepool namespace>}`; then the
  AgentMachine gets `spec.providerID: agent://<agent>` and `status.agentRef`, `status.ready: false`.
- once the Agent is installed (`added-to-existing-cluster`) its AgentMachine turns `status.ready`
  and only then does the Machine get `spec.providerID` (CAPI copies it from a ready infrastructure
  machine); Machines show `status.phase` and `status.nodeRef` once their node joined.
- scale down: victims are Machines annotated `cluster.x-k8s.io/delete-machine` first, then Machines
  without a joined node, then random (seeded); each victim's Agent is unbound (label, annotation and
  `clusterDeploymentName` removed, never deleted) and the Machine deleted (its AgentMachine goes with
  it). A victim hit by the `hanging_drain` fault is drained for as long as the fault stays armed: its
  Machine stays, in phase Deleting and still counted (CAPI counts a deleting Machine until it is
  gone), its Agent claimed.
- an Agent that is deleted (or stops being claimed by its AgentMachine) takes its Machine with it;
  CAPI then creates a replacement if replicas still ask for it. So does an AgentMachine deleted
  under a claim. A claimed Agent whose AgentMachine no longer exists is released.
- `status.replicas` counts claimed Agents that reached `added-to-existing-cluster` (HyperShift
  reports the MachineDeployment's available replicas, i.e. joined nodes).

Which Agent a Machine has is read from its AgentMachine (`status.agentRef`, else `spec.providerID`)
and checked against the Agent's label, so a restarted controller re-derives every claim from what is
stored. The in-memory expectations (`_creating`, `_agent_machines_created`, `_claimed`) cover the
moments where the watch caches lag behind this controller's own writes, so a stale cache can never
create a Machine twice or claim a second Agent for one AgentMachine.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import string
from dataclasses import dataclass
from typing import Any

from lab.hub_controllers.agent_status import now_rfc3339
from lab.hub_controllers.constants import (
    AgentConditionType,
    Annotation,
    ConditionStatus,
    EventType,
    HostState,
    Label,
    MachinePhase,
    NodePoolConditionType,
)
from lab.hub_controllers.events import EventRecorder
from lab.hub_controllers.faults import FaultBook, FaultKind
from lab.hub_controllers.informer import Informer
from lab.hub_controllers.kube import ApiError, KubeApi, Obj, WatchEventType, key_of, split_key
from lab.hub_controllers.registration import host_state_of
from lab.hub_controllers.resources import AGENT_MACHINES, AGENTS, MACHINES, NODE_POOLS, ApiResource
from lab.hub_controllers.selectors import selector_matches
from lab.hub_controllers.workqueue import Controller

log = logging.getLogger(__name__)

PROVIDER_ID_PREFIX = "agent://"
_EXPECTATION_TTL_S = 30.0


@dataclass
class _Claim:
    """A claim this controller made or adopted, authoritative over caches that lag behind it."""

    agent: str
    agent_machine_uid: str
    recorded: bool = False  # the AgentMachine's providerID and agentRef are written
    installed: bool = False  # the AgentMachine's ready and the Machine's providerID are written


def _condition(agent: Obj, kind: AgentConditionType) -> str | None:
    for cond in agent.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind.value:
            return str(cond.get("status"))
    return None


def claimable(agent: Obj) -> bool:
    """The provider's eligibility rule (osac-reference.md §5)."""
    m = agent.get("metadata", {})
    return (
        not m.get("deletionTimestamp")
        and not (m.get("labels") or {}).get(Label.AGENT_MACHINE_REF.value)
        and bool(agent.get("spec", {}).get("approved"))
        and _condition(agent, AgentConditionType.VALIDATED) == ConditionStatus.TRUE.value
        and _condition(agent, AgentConditionType.CONNECTED) == ConditionStatus.TRUE.value
        and _condition(agent, AgentConditionType.BOUND) == ConditionStatus.FALSE.value
    )


def _provider_agent(obj: Obj) -> str | None:
    provider_id = str(obj.get("spec", {}).get("providerID") or "")
    return provider_id[len(PROVIDER_ID_PREFIX) :] if provider_id.startswith(PROVIDER_ID_PREFIX) else None


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _uid(obj: Obj) -> str:
    return str(obj["metadata"].get("uid") or "")


def _machine_ref(agent: Obj) -> str | None:
    """The uid of the AgentMachine that claimed the Agent (its `agentMachineRef` label), if any."""
    return (agent["metadata"].get("labels") or {}).get(Label.AGENT_MACHINE_REF.value)


def _agent_ref(agent_machine: Obj) -> dict[str, Any]:
    ref = (agent_machine.get("status") or {}).get("agentRef")
    return ref if isinstance(ref, dict) else {}


def agent_of(agent_machine: Obj) -> str | None:
    """The Agent an AgentMachine claimed: `status.agentRef`, else its `spec.providerID`."""
    name = _agent_ref(agent_machine).get("name")
    return str(name) if name else _provider_agent(agent_machine)


def _recorded(agent_machine: Obj, agent_name: str) -> bool:
    """Whether the AgentMachine names `agent_name` in both places the claim writes."""
    ref = _agent_ref(agent_machine)
    return _provider_agent(agent_machine) == agent_name and ref.get("name") == agent_name


def _owned_by_another(agent_machine: Obj, machine: Obj) -> bool:
    """An AgentMachine left by a namesake Machine (the garbage collector is about to take it)."""
    uid = machine["metadata"].get("uid")
    return any(
        ref.get("kind") == MACHINES.kind and ref.get("uid") != uid
        for ref in agent_machine["metadata"].get("ownerReferences") or []
    )


def _by_machine_ref(agents: dict[str, Obj]) -> dict[str, Obj]:
    """AgentMachine uid -> the first Agent (in `agents` order) whose `agentMachineRef` names it."""
    result: dict[str, Obj] = {}
    for agent in agents.values():
        ref = _machine_ref(agent)
        if ref is not None:
            result.setdefault(ref, agent)
    return result


def _eligible(agent: Obj, selector: dict[str, Any]) -> bool:
    return claimable(agent) and selector_matches(selector, agent["metadata"].get("labels") or {})


def _candidates(agents: dict[str, Obj], selector: dict[str, Any], taken: set[str]) -> list[Obj]:
    """Agents a pending AgentMachine may claim, oldest first (ties broken by name)."""
    return sorted(
        (a for a in agents.values() if _name(a) not in taken and _eligible(a, selector)),
        key=lambda a: (str(a["metadata"].get("creationTimestamp", "")), _name(a)),
    )


class NodePoolController(Controller):
    name = "hypershift-agent-provider"
    # One writer keeps claims simple (the CAS still guards them). Pools reconciled side by side were
    # measured no faster at 500 workers on two cores: they only share the one process's CPU.
    workers = 1

    def __init__(
        self,
        api: KubeApi,
        node_pools: Informer,
        agents: Informer,
        machines: Informer,
        agent_machines: Informer,
        *,
        events: EventRecorder,
        faults: FaultBook | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self._api, self._node_pools, self._agents, self._machines = api, node_pools, agents, machines
        self._agent_machines = agent_machines
        self._events = events
        self._faults = faults
        self._draining: set[str] = set()  # Machines whose drain hangs (the `hanging_drain` fault)
        self._rng = random.Random(seed)
        self._creating: dict[
            str, tuple[str, float]
        ] = {}  # machine key -> (pool key, loop time), until cached
        self._deleted: dict[str, float] = {}  # machine key -> loop time deleted, until the cache drops it
        # AgentMachines as created (key -> (object, loop time)) until their informer has them: a claim
        # needs the uid, and the caches must not make this controller create one twice.
        self._agent_machines_created: dict[str, tuple[Obj, float]] = {}
        # The AgentMachine informer's uids (the Agents' labels name AgentMachines by uid), both ways.
        self._agent_machine_keys: dict[str, str] = {}  # uid -> key
        self._agent_machine_uids: dict[str, str] = {}  # key -> uid
        self._claimed: dict[str, _Claim] = {}  # machine (= AgentMachine) key -> its claim
        # Claims `_expire` must look at: made since its last run, or whose Machine left the cache since.
        # Any other claim's Machine was cached at the last run and still is, so scanning every claim
        # (one per Machine of every NodePool) on each reconcile would only find the same answer.
        self._claims_to_check: set[str] = set()
        self._status_subresource: dict[ApiResource, bool] = {}
        # The uid index first: the handlers `watch` adds may enqueue reconciles that read it.
        agent_machines.add_handler(self._on_agent_machine_event)
        self.watch(node_pools)
        self.watch(machines, self._pool_of_machine)
        self.watch(agent_machines, self._pool_of_agent_machine)
        self.watch(agents, self._pools_for_agent)
        machines.add_handler(self._on_machine_event)

    # -- event mapping ---------------------------------------------------------------------------
    def _pool_of_machine(self, _kind: WatchEventType, machine: Obj) -> list[str]:
        m = machine.get("metadata", {})
        pool = (m.get("labels") or {}).get(Label.NODEPOOL.value)
        return [f"{m.get('namespace')}/{pool}"] if pool else []

    def _pool_of_agent_machine(self, kind: WatchEventType, agent_machine: Obj) -> list[str]:
        # Created with its Machine's labels; one made by someone else is mapped through its Machine.
        keys = self._pool_of_machine(kind, agent_machine)
        machine = None if keys else self._machines.get(key_of(agent_machine))
        return keys if machine is None else self._pool_of_machine(kind, machine)

    def _on_machine_event(self, kind: WatchEventType, machine: Obj) -> None:
        if kind is WatchEventType.DELETED:
            self._claims_to_check.add(key_of(machine))
            self._agent_machines_created.pop(key_of(machine), None)

    def _on_agent_machine_event(self, kind: WatchEventType, agent_machine: Obj) -> None:
        key, uid = key_of(agent_machine), _uid(agent_machine)
        if kind is WatchEventType.DELETED:
            if self._agent_machine_uids.get(key) == uid:
                del self._agent_machine_uids[key]
                self._agent_machine_keys.pop(uid, None)
            created = self._agent_machines_created.get(key)
            if created is not None and _uid(created[0]) == uid:
                del self._agent_machines_created[key]  # gone before its creation was seen
            return
        previous = self._agent_machine_uids.get(key)
        if previous is not None and previous != uid:  # a namesake replaced it
            self._agent_machine_keys.pop(previous, None)
        self._agent_machine_uids[key] = uid
        self._agent_machine_keys[uid] = key
        created = self._agent_machines_created.get(key)
        if created is not None and _uid(created[0]) == uid:
            del self._agent_machines_created[key]  # cached now

    def _pools_for_agent(self, _kind: WatchEventType, agent: Obj) -> list[str]:
        m = agent.get("metadata", {})
        namespace = str(m.get("namespace", ""))
        keys = [key_of(np) for np in self._node_pools.in_namespace(namespace)]
        ref = (m.get("labels") or {}).get(Label.AGENT_MACHINE_REF.value)
        agent_machine_key = self._agent_machine_keys.get(ref) if ref else None
        agent_machine = self._agent_machines.get(agent_machine_key) if agent_machine_key else None
        if agent_machine is not None:
            keys.extend(self._pool_of_agent_machine(_kind, agent_machine))
        return keys

    # -- reconcile -------------------------------------------------------------------------------
    async def reconcile(self, key: str) -> float | None:
        namespace, pool_name = split_key(key)
        ns = namespace or ""
        now = asyncio.get_running_loop().time()
        self._expire(now)
        node_pool = self._node_pools.get(key)
        live = [
            m
            for m in self._machines.in_namespace(ns)
            if (m["metadata"].get("labels") or {}).get(Label.NODEPOOL.value) == pool_name
            and key_of(m) not in self._deleted
        ]
        for m in live:
            self._creating.pop(key_of(m), None)
        agents = {_name(a): a for a in self._agents.in_namespace(ns)}
        retry: float | None = None

        desired = 0
        selector: dict[str, Any] | None = None
        if node_pool is not None and not node_pool["metadata"].get("deletionTimestamp"):
            desired = int(node_pool.get("spec", {}).get("replicas") or 0)
            selector = ((node_pool.get("spec", {}).get("platform") or {}).get("agent") or {}).get(
                "agentLabelSelector"
            )
            if not selector:
                desired = 0  # not an agent NodePool (or misconfigured): never touch Agents for it

        # 1. Every Machine has its AgentMachine. One missing under a claim was deleted (CAPI fails
        # such a Machine): the Machine goes too. One never made (a failed create, a restart between
        # the two creates) is made now.
        for machine in list(live):
            if self._agent_machine_of(machine) is not None:
                continue
            if key_of(machine) in self._claimed:
                await self._delete_machine(machine, now)
                live.remove(machine)
            elif not await self._ensure_agent_machine(machine, selector):
                live.remove(machine)  # deleted meanwhile; the cache has not seen it yet

        # 2. Machines whose Agent is gone, being deleted, or no longer claimed by their AgentMachine.
        for machine in list(live):
            agent_name, agent_machine_uid = self._claim_of(machine)
            if agent_name is None:
                continue
            agent = agents.get(agent_name)
            lost = agent is None or bool(agent["metadata"].get("deletionTimestamp"))
            if not lost and agent is not None and key_of(machine) not in self._claimed:
                lost = _machine_ref(agent) != agent_machine_uid
            if lost:
                await self._delete_machine(machine, now)
                live.remove(machine)

        # 3. Claims naming AgentMachines that no longer exist (e.g. a Machine deleted by hand).
        await self._release_orphans(agents)

        pending_creates = [k for k, (pool, _) in self._creating.items() if pool == key]

        # 4. Scale down. A victim whose drain hangs stays, counted, until the fault is cleared; a
        # deletion once begun is never undone, whatever the replicas say meanwhile.
        hanging = bool(self._faults and self._faults.config.hanging_drain.armed)
        for machine in [m for m in live if key_of(m) in self._draining]:
            if hanging:
                retry = 1.0  # looked at again: the drain ends once the fault is cleared
                continue
            agent_name, agent_machine_uid = self._claim_of(machine)
            await self._release(agents.get(agent_name or ""), agent_machine_uid)
            await self._delete_machine(machine, now)
            live.remove(machine)
        count = len(live) + len(pending_creates)
        if count > desired:
            for machine in self._victims(live, count - desired, agents):
                if key_of(machine) in self._draining:
                    continue
                agent_name, agent_machine_uid = self._claim_of(machine)
                agent = agents.get(agent_name or "")
                if hanging and self._drain_hangs(machine, agent):
                    self._draining.add(key_of(machine))
                    retry = 1.0
                    continue
                await self._release(agent, agent_machine_uid)
                await self._delete_machine(machine, now)
                live.remove(machine)
        # 5. Scale up.
        elif count < desired and node_pool is not None:
            for _ in range(desired - count):
                await self._create_machine(node_pool, selector, now)

        # 6. AgentMachines without an Agent claim one.
        if selector and node_pool is not None:
            taken = {c.agent for c in self._claimed.values()}
            # `agents` is a snapshot that no write below changes, so what is derived from it is built
            # once, on first need, instead of rescanning every Agent for every pending AgentMachine.
            by_machine_ref: dict[str, Obj] | None = None
            ranked: list[Obj] | None = None
            for machine in live:
                agent_machine = self._agent_machine_of(machine)
                if agent_machine is None:  # a namesake's is still in the way (step 1)
                    retry = 1.0
                    continue
                claim = self._claimed.get(key_of(machine))
                if claim is None and (known := agent_of(agent_machine)) is not None:
                    if _recorded(agent_machine, known):
                        continue
                    # Half written before a restart; step 2 found the Agent's label naming it.
                    claim = self._remember(machine, known, _uid(agent_machine))
                if claim is not None:
                    if not claim.recorded:  # the AgentMachine write failed, or is not cached yet
                        await self._record(agent_machine, claim)
                    continue
                if by_machine_ref is None:
                    by_machine_ref = _by_machine_ref(agents)
                adopted = await self._adopt(machine, agent_machine, by_machine_ref)
                if adopted is not None:
                    taken.add(adopted)
                    continue
                if ranked is None:
                    ranked = _candidates(agents, selector, taken)
                # `taken` only grows: filtering the first ranking equals ranking afresh.
                candidates = [a for a in ranked if _name(a) not in taken]
                claimed = await self._claim(node_pool, machine, agent_machine, candidates, selector)
                if claimed is None:
                    retry = 1.0 if retry is None else retry  # also re-driven by Agent events
                else:
                    taken.add(claimed)

        # 7. AgentMachine, Machine and NodePool status.
        ready = 0
        for machine in live:
            agent = agents.get(self._agent_name(machine) or "")
            if agent is not None and host_state_of(agent) is HostState.ADDED_TO_EXISTING_CLUSTER:
                ready += 1
                await self._mark_installed(machine, agent)
            await self._write_machine_status(machine, agent)
        if node_pool is not None:
            await self._write_pool_status(node_pool, ready, desired)
        return retry

    def _expire(self, now: float) -> None:
        for k in [k for k, (_, t) in self._creating.items() if now - t > _EXPECTATION_TTL_S]:
            del self._creating[k]
        for k in [k for k, t in self._deleted.items() if now - t > _EXPECTATION_TTL_S]:
            del self._deleted[k]
        for k in [k for k in self._deleted if self._machines.get(k) is None]:
            del self._deleted[k]
        # Kept while their Machine is cached (its AgentMachine cannot be gone unseen meanwhile), so
        # only those of Machines never cached can outlive their use.
        for k in [
            k
            for k, (_, t) in self._agent_machines_created.items()
            if now - t > _EXPECTATION_TTL_S and self._machines.get(k) is None
        ]:
            del self._agent_machines_created[k]
        # Claims are only made for cached Machines, so a claim whose Machine left the cache is over.
        for k in [k for k in self._claims_to_check if k in self._claimed and self._machines.get(k) is None]:
            del self._claimed[k]
        self._claims_to_check.clear()

    def _drain_hangs(self, machine: Obj, agent: Obj | None) -> bool:
        """Whether this victim's drain gets stuck (the `hanging_drain` fault, drawn once)."""
        if self._faults is None or agent is None:
            return False
        interfaces = (agent.get("status", {}).get("inventory") or {}).get("interfaces") or []
        macs = [str(i.get("macAddress") or "") for i in interfaces]
        return self._faults.decide(FaultKind.HANGING_DRAIN, _name(agent), macs)

    def _agent_machine_of(self, machine: Obj) -> Obj | None:
        """The Machine's AgentMachine: cached, or as this controller created it moments ago."""
        key = key_of(machine)
        cached = self._agent_machines.get(key)
        if cached is not None and not _owned_by_another(cached, machine):
            return cached
        created = self._agent_machines_created.get(key)
        return created[0] if created is not None and not _owned_by_another(created[0], machine) else None

    def _claim_of(self, machine: Obj) -> tuple[str | None, str | None]:
        """The Machine's Agent, and the uid that Agent is labelled with (its AgentMachine's): from
        this controller's own claim, else as the AgentMachine records it."""
        claim = self._claimed.get(key_of(machine))
        if claim is not None:
            return claim.agent, claim.agent_machine_uid
        agent_machine = self._agent_machine_of(machine)
        if agent_machine is None:
            return None, None
        return agent_of(agent_machine), _uid(agent_machine)

    def _agent_name(self, machine: Obj) -> str | None:
        return self._claim_of(machine)[0]

    def _victims(self, live: list[Obj], count: int, agents: dict[str, Obj]) -> list[Obj]:
        def joined(machine: Obj) -> bool:
            agent = agents.get(self._agent_name(machine) or "")
            return agent is not None and host_state_of(agent) is HostState.ADDED_TO_EXISTING_CLUSTER

        deleting = sorted((m for m in live if key_of(m) in self._draining), key=_name)
        marked = [
            m
            for m in live
            if Annotation.DELETE_MACHINE.value in (m["metadata"].get("annotations") or {})
            and m not in deleting
        ]
        rest = [m for m in live if m not in marked and m not in deleting]
        unhealthy = [m for m in rest if not joined(m)]
        healthy = [m for m in rest if joined(m)]
        for group in (marked, unhealthy, healthy):
            group.sort(key=_name)
            self._rng.shuffle(group)
        return (deleting + marked + unhealthy + healthy)[:count]

    # -- writes ----------------------------------------------------------------------------------
    async def _create_machine(self, node_pool: Obj, selector: dict[str, Any] | None, now: float) -> None:
        m = node_pool["metadata"]
        cluster = str(node_pool.get("spec", {}).get("clusterName") or m["name"])
        suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
        name = f"{m['name']}-{suffix}"
        body: Obj = {
            "metadata": {
                "name": name,
                "namespace": m["namespace"],
                "labels": {Label.NODEPOOL.value: m["name"], Label.CAPI_CLUSTER_NAME.value: cluster},
            },
            "spec": {
                "clusterName": cluster,
                "bootstrap": {"dataSecretName": f"user-data-{m['name']}"},
                "infrastructureRef": {
                    "apiVersion": AGENT_MACHINES.api_version,
                    "kind": AGENT_MACHINES.kind,
                    "name": name,
                    "namespace": m["namespace"],
                },
            },
        }
        machine = await self._api.create(MACHINES, body)
        self._creating[f"{m['namespace']}/{name}"] = (key_of(node_pool), now)
        await self._create_agent_machine(machine, selector)

    async def _create_agent_machine(self, machine: Obj, selector: dict[str, Any] | None) -> None:
        """Create the Machine's AgentMachine (not when a namesake's is still in the way: step 1 of a
        later pass does, once the garbage collector took that one)."""
        m = machine["metadata"]
        body: Obj = {
            "metadata": {
                "name": m["name"],
                "namespace": m["namespace"],
                "labels": dict(m.get("labels") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": MACHINES.api_version,
                        "kind": MACHINES.kind,
                        "name": m["name"],
                        "uid": m["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"agentLabelSelector": selector} if selector else {},
        }
        try:
            created: Obj | None = await self._api.create(AGENT_MACHINES, body)
        except ApiError as exc:
            if not exc.is_already_exists:
                raise
            # Made by us before a restart (not cached yet), or a namesake's awaiting collection.
            created = await self._api.get(AGENT_MACHINES, m["namespace"], m["name"])
            if created is None or _owned_by_another(created, machine):
                return
        assert created is not None
        self._agent_machines_created[key_of(machine)] = (created, asyncio.get_running_loop().time())

    async def _ensure_agent_machine(self, machine: Obj, selector: dict[str, Any] | None) -> bool:
        """Create the AgentMachine of a cached Machine without one; False when the Machine is gone
        (its deletion not cached yet): an AgentMachine made for it would claim an Agent for nothing."""
        m = machine["metadata"]
        stored = await self._api.get(MACHINES, m.get("namespace"), m["name"])
        if stored is None or _uid(stored) != _uid(machine):
            return False
        await self._create_agent_machine(stored, selector)
        return True

    async def _delete_machine(self, machine: Obj, now: float) -> None:
        """Delete the Machine; the hub's garbage collector then deletes its AgentMachine."""
        m = machine["metadata"]
        await self._api.delete(MACHINES, m.get("namespace"), m["name"], uid=m.get("uid"))
        self._deleted[key_of(machine)] = now
        self._claimed.pop(key_of(machine), None)
        self._agent_machines_created.pop(key_of(machine), None)
        self._draining.discard(key_of(machine))

    def _remember(self, machine: Obj, agent_name: str, agent_machine_uid: str) -> _Claim:
        claim = self._claimed[key_of(machine)] = _Claim(agent_name, agent_machine_uid)
        self._claims_to_check.add(key_of(machine))
        return claim

    async def _adopt(self, machine: Obj, agent_machine: Obj, by_machine_ref: dict[str, Obj]) -> str | None:
        """An Agent already claimed for this AgentMachine (we stopped between the Agent write and the
        AgentMachine write): its label is this AgentMachine's uid."""
        agent = by_machine_ref.get(_uid(agent_machine))
        if agent is None:
            return None
        await self._record(agent_machine, self._remember(machine, _name(agent), _uid(agent_machine)))
        return _name(agent)

    async def _record(self, agent_machine: Obj, claim: _Claim) -> None:
        """Name the claimed Agent on the AgentMachine: `spec.providerID`, then `status.agentRef`."""
        if not await self._set_provider_id(AGENT_MACHINES, agent_machine, claim.agent):
            return  # gone with its Machine
        ref = {"namespace": agent_machine["metadata"].get("namespace"), "name": claim.agent}
        if _agent_ref(agent_machine) != ref:
            await self._write_status(AGENT_MACHINES, agent_machine, {"agentRef": ref, "ready": False})
        claim.recorded = True

    async def _mark_installed(self, machine: Obj, agent: Obj) -> None:
        """The Agent is installed: its AgentMachine turns ready, and CAPI copies the providerID from
        a ready infrastructure machine to the Machine."""
        claim = self._claimed.get(key_of(machine))
        if claim is not None and claim.installed:
            return
        agent_machine = self._agent_machine_of(machine)
        if agent_machine is None or not (
            claim.recorded if claim is not None else _recorded(agent_machine, _name(agent))
        ):
            return
        if (agent_machine.get("status") or {}).get("ready") is not True:
            await self._write_status(AGENT_MACHINES, agent_machine, {"ready": True})
        if await self._set_provider_id(MACHINES, machine, _name(agent)) and claim is not None:
            claim.installed = True

    async def _set_provider_id(self, res: ApiResource, obj: Obj, agent_name: str) -> bool:
        """`spec.providerID: agent://<agent_name>` on `obj` unless it has it; False if `obj` is gone."""
        provider_id = f"{PROVIDER_ID_PREFIX}{agent_name}"
        if obj.get("spec", {}).get("providerID") == provider_id:
            return True
        m = obj["metadata"]
        try:
            await self._api.patch(res, m.get("namespace"), m["name"], {"spec": {"providerID": provider_id}})
        except ApiError as exc:
            if not exc.is_not_found:
                raise
            return False
        return True

    async def _claim(
        self,
        node_pool: Obj,
        machine: Obj,
        agent_machine: Obj,
        candidates: list[Obj],
        selector: dict[str, Any],
    ) -> str | None:
        """Claim the first of `candidates` (see `_candidates`) that a compare-and-swap lets us have.

        A conflict usually means only that the cached copy is behind (the host state controller
        writes the Agent's status all the time), so `mutate` reads the Agent afresh and it is
        claimed if it is still eligible; otherwise every pending AgentMachine would try every stale
        candidate in turn.
        """
        uid = _uid(agent_machine)

        def claim(agent: Obj) -> Obj | None:
            # The cached copy is eligible; a fresh one, read after a conflict, may no longer be.
            return self._claimed_copy(node_pool, agent_machine, agent) if _eligible(agent, selector) else None

        for candidate in candidates:
            m = candidate["metadata"]
            try:
                # From the cached copy first: its resourceVersion makes the write a compare-and-swap.
                stored = await self._api.mutate(
                    AGENTS, m.get("namespace"), m["name"], claim, attempts=2, cached=candidate
                )
            except ApiError as exc:
                if exc.is_conflict or exc.is_not_found:
                    continue  # changed again since the fresh read, or removed: try the next one
                raise
            if stored is None or _machine_ref(stored) != uid:
                continue  # gone, or claimed by someone else meanwhile, or no longer fit
            await self._record(agent_machine, self._remember(machine, _name(stored), uid))
            await self._events.emit(
                node_pool,
                EventType.NORMAL,
                "AgentClaimed",
                f"Machine {_name(machine)} claimed Agent {_name(stored)}",
            )
            return _name(stored)
        return None

    @staticmethod
    def _claimed_copy(node_pool: Obj, agent_machine: Obj, agent: Obj) -> Obj:
        np_meta = node_pool["metadata"]
        cluster = str(node_pool.get("spec", {}).get("clusterName") or np_meta["name"])
        claimed = dict(agent)
        claimed["metadata"] = {
            **agent["metadata"],
            "labels": {
                **(agent["metadata"].get("labels") or {}),
                Label.AGENT_MACHINE_REF.value: _uid(agent_machine),
            },
            "annotations": {
                **(agent["metadata"].get("annotations") or {}),
                Annotation.AGENT_MACHINE_REF_NAMESPACE.value: agent_machine["metadata"]["namespace"],
            },
        }
        claimed["spec"] = {
            **agent.get("spec", {}),
            "clusterDeploymentName": {"name": cluster, "namespace": np_meta["namespace"]},
        }
        return claimed

    async def _release(self, agent: Obj | None, agent_machine_uid: str | None) -> None:
        """Unbind `agent` if it is still claimed by the AgentMachine with this uid."""
        if agent is None or not agent_machine_uid:
            return
        m = agent["metadata"]

        def unbind(fresh: Obj) -> Obj | None:
            labels = fresh["metadata"].get("labels") or {}
            if labels.get(Label.AGENT_MACHINE_REF.value) != agent_machine_uid:
                return None  # not ours (any more)
            fresh["metadata"]["labels"] = {
                k: v for k, v in labels.items() if k != Label.AGENT_MACHINE_REF.value
            }
            annotations = fresh["metadata"].get("annotations") or {}
            annotations.pop(Annotation.AGENT_MACHINE_REF_NAMESPACE.value, None)
            fresh["metadata"]["annotations"] = annotations
            fresh.setdefault("spec", {}).pop("clusterDeploymentName", None)
            return fresh

        await self._api.mutate(AGENTS, m.get("namespace"), m["name"], unbind)

    async def _release_orphans(self, agents: dict[str, Obj]) -> None:
        written: set[str] | None = None
        for agent in agents.values():
            ref = _machine_ref(agent)
            if not ref or ref in self._agent_machine_keys:
                continue
            if written is None:  # rarely needed: built on first need
                written = {c.agent_machine_uid for c in self._claimed.values()} | {
                    _uid(obj) for obj, _ in self._agent_machines_created.values()
                }
            if ref in written:
                continue  # created or claimed a moment ago; the AgentMachine cache has not caught up
            await self._release(agent, ref)

    async def _write_status(self, res: ApiResource, obj: Obj, status: dict[str, Any]) -> None:
        """Merge-patch status, through the status subresource when the server has one."""
        m = obj["metadata"]
        if self._status_subresource.get(res) is not False:
            try:
                await self._api.patch(
                    res, m.get("namespace"), m["name"], {"status": status}, subresource="status"
                )
                self._status_subresource[res] = True
                return
            except ApiError as exc:
                if not exc.is_not_found:
                    raise
                if await self._api.get(res, m.get("namespace"), m["name"]) is None:
                    return  # the object itself is gone
                self._status_subresource[res] = False  # served without a status subresource
        try:
            await self._api.patch(res, m.get("namespace"), m["name"], {"status": status})
        except ApiError as exc:
            if not exc.is_not_found:
                raise

    async def _write_machine_status(self, machine: Obj, agent: Obj | None) -> None:
        status: dict[str, Any] = {"phase": MachinePhase.PENDING.value}
        if key_of(machine) in self._draining:
            status["phase"] = MachinePhase.DELETING.value
        elif agent is not None:
            joined = host_state_of(agent) is HostState.ADDED_TO_EXISTING_CLUSTER
            status["phase"] = (MachinePhase.RUNNING if joined else MachinePhase.PROVISIONING).value
            if joined:
                hostname = agent.get("spec", {}).get("hostname") or (
                    (agent.get("status", {}).get("inventory") or {}).get("hostname") or _name(agent)
                )
                status["nodeRef"] = {"apiVersion": "v1", "kind": "Node", "name": hostname}
        current = machine.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return
        await self._write_status(MACHINES, machine, status)

    async def _write_pool_status(self, node_pool: Obj, ready: int, desired: int) -> None:
        current = node_pool.get("status") or {}
        ok = ready == desired
        condition = {
            "type": NodePoolConditionType.READY.value,
            "status": (ConditionStatus.TRUE if ok else ConditionStatus.FALSE).value,
            "reason": "AsExpected" if ok else "WaitingForAvailableMachines",
            "message": "" if ok else f"{ready} of {desired} machines are available",
        }
        old = next(
            (
                c
                for c in current.get("conditions") or []
                if c.get("type") == NodePoolConditionType.READY.value
            ),
            None,
        )
        if (
            current.get("replicas") == ready
            and old is not None
            and all(old.get(k) == v for k, v in condition.items())
        ):
            return
        stamp = old.get("lastTransitionTime") if old and old.get("status") == condition["status"] else None
        condition["lastTransitionTime"] = stamp or now_rfc3339()
        await self._write_status(NODE_POOLS, node_pool, {"replicas": ready, "conditions": [condition]})
