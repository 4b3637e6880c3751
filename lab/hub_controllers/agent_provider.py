"""The HyperShift agent platform: NodePool replicas -> CAPI Machines -> claimed Agents.

Per NodePool with `spec.platform.agent.agentLabelSelector` (Machines and Agents live in the
NodePool's namespace):

- scale up: create Machines (`<nodepool>-<5 chars>`, labels `hypershift.openshift.io/nodePool` and
  `cluster.x-k8s.io/cluster-name`) until there are `spec.replicas`; each pending Machine claims one
  Agent that matches the selector and is approved, `Validated=True`, `Connected=True`, `Bound=False`
  and not being deleted, by a compare-and-swap update (PUT with the Agent's resourceVersion) that
  sets label `agentMachineRef=<machine>`, annotation `agentMachineRefNamespace=<its namespace>` and
  `spec.clusterDeploymentName = {name: <clusterName>, namespace: <nodepool namespace>}`; then the
  Machine gets `spec.providerID: agent://<agent>`.
- scale down: victims are Machines annotated `cluster.x-k8s.io/delete-machine` first, then Machines
  without a joined node, then random (seeded); each victim's Agent is unbound (label, annotation and
  `clusterDeploymentName` removed, never deleted) and the Machine deleted. A victim hit by the
  `hanging_drain` fault is drained for as long as the fault stays armed: its Machine stays, in phase
  Deleting and still counted (CAPI counts a deleting Machine until it is gone), its Agent claimed.
- an Agent that is deleted (or stops being claimed) takes its Machine with it; CAPI then creates a
  replacement if replicas still ask for it. A claimed Agent whose Machine vanished is released.
- `status.replicas` counts claimed Agents that reached `added-to-existing-cluster` (HyperShift
  reports the MachineDeployment's available replicas, i.e. joined nodes); Machines show
  `status.phase` and `status.nodeRef` once their node joined.

The in-memory expectations (`_creating`, `_claimed`) cover the moments where the watch caches lag
behind this controller's own writes, so a stale cache can never create a Machine twice or claim a
second Agent for one Machine.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import string
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
from lab.hub_controllers.resources import AGENTS, MACHINES, NODE_POOLS, ApiResource
from lab.hub_controllers.selectors import selector_matches
from lab.hub_controllers.workqueue import Controller

log = logging.getLogger(__name__)

PROVIDER_ID_PREFIX = "agent://"
_EXPECTATION_TTL_S = 30.0


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


def _provider_agent(machine: Obj) -> str | None:
    provider_id = str(machine.get("spec", {}).get("providerID") or "")
    return provider_id[len(PROVIDER_ID_PREFIX) :] if provider_id.startswith(PROVIDER_ID_PREFIX) else None


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _machine_ref(agent: Obj) -> str | None:
    """The Machine that claimed the Agent (its `agentMachineRef` label), if any."""
    return (agent["metadata"].get("labels") or {}).get(Label.AGENT_MACHINE_REF.value)


def _by_machine_ref(agents: dict[str, Obj]) -> dict[str, Obj]:
    """Machine name -> the first Agent (in `agents` order) whose `agentMachineRef` names it."""
    result: dict[str, Obj] = {}
    for agent in agents.values():
        ref = _machine_ref(agent)
        if ref is not None:
            result.setdefault(ref, agent)
    return result


def _eligible(agent: Obj, selector: dict[str, Any]) -> bool:
    return claimable(agent) and selector_matches(selector, agent["metadata"].get("labels") or {})


def _candidates(agents: dict[str, Obj], selector: dict[str, Any], taken: set[str]) -> list[Obj]:
    """Agents a pending Machine may claim, oldest first (ties broken by name)."""
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
        *,
        events: EventRecorder,
        faults: FaultBook | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self._api, self._node_pools, self._agents, self._machines = api, node_pools, agents, machines
        self._events = events
        self._faults = faults
        self._draining: set[str] = set()  # Machines whose drain hangs (the `hanging_drain` fault)
        self._rng = random.Random(seed)
        self._creating: dict[
            str, tuple[str, float]
        ] = {}  # machine key -> (pool key, loop time), until cached
        self._deleted: dict[str, float] = {}  # machine key -> loop time deleted, until the cache drops it
        self._claimed: dict[str, str] = {}  # machine key -> agent name, authoritative over a lagging cache
        # Claims `_expire` must look at: made since its last run, or whose Machine left the cache since.
        # Any other claim's Machine was cached at the last run and still is, so scanning every claim
        # (one per Machine of every NodePool) on each reconcile would only find the same answer.
        self._claims_to_check: set[str] = set()
        self._status_subresource: dict[ApiResource, bool] = {}
        self.watch(node_pools)
        self.watch(machines, self._pool_of_machine)
        self.watch(agents, self._pools_for_agent)
        machines.add_handler(self._on_machine_event)

    # -- event mapping ---------------------------------------------------------------------------
    def _pool_of_machine(self, _kind: WatchEventType, machine: Obj) -> list[str]:
        m = machine.get("metadata", {})
        pool = (m.get("labels") or {}).get(Label.NODEPOOL.value)
        return [f"{m.get('namespace')}/{pool}"] if pool else []

    def _on_machine_event(self, kind: WatchEventType, machine: Obj) -> None:
        if kind is WatchEventType.DELETED:
            self._claims_to_check.add(key_of(machine))

    def _pools_for_agent(self, _kind: WatchEventType, agent: Obj) -> list[str]:
        m = agent.get("metadata", {})
        namespace = str(m.get("namespace", ""))
        keys = [key_of(np) for np in self._node_pools.in_namespace(namespace)]
        ref = (m.get("labels") or {}).get(Label.AGENT_MACHINE_REF.value)
        machine = self._machines.get(f"{namespace}/{ref}") if ref else None
        if machine is not None:
            keys.extend(self._pool_of_machine(_kind, machine))
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

        # 1. Machines whose Agent is gone, being deleted, or no longer claimed by them.
        for machine in list(live):
            agent_name = self._agent_name(machine)
            if agent_name is None:
                continue
            agent = agents.get(agent_name)
            lost = agent is None or bool(agent["metadata"].get("deletionTimestamp"))
            if not lost and agent is not None and self._claimed.get(key_of(machine)) != agent_name:
                lost = (agent["metadata"].get("labels") or {}).get(Label.AGENT_MACHINE_REF.value) != _name(
                    machine
                )
            if lost:
                await self._delete_machine(machine, now)
                live.remove(machine)

        # 2. Claims pointing at Machines that no longer exist (e.g. a Machine deleted by hand).
        await self._release_orphans(ns, agents)

        desired = 0
        selector: dict[str, Any] | None = None
        if node_pool is not None and not node_pool["metadata"].get("deletionTimestamp"):
            desired = int(node_pool.get("spec", {}).get("replicas") or 0)
            selector = ((node_pool.get("spec", {}).get("platform") or {}).get("agent") or {}).get(
                "agentLabelSelector"
            )
            if not selector:
                desired = 0  # not an agent NodePool (or misconfigured): never touch Agents for it

        pending_creates = [k for k, (pool, _) in self._creating.items() if pool == key]

        # 3. Scale down. A victim whose drain hangs stays, counted, until the fault is cleared; a
        # deletion once begun is never undone, whatever the replicas say meanwhile.
        hanging = bool(self._faults and self._faults.config.hanging_drain.armed)
        for machine in [m for m in live if key_of(m) in self._draining]:
            if hanging:
                retry = 1.0  # looked at again: the drain ends once the fault is cleared
                continue
            await self._release(machine, agents.get(self._agent_name(machine) or ""))
            await self._delete_machine(machine, now)
            live.remove(machine)
        count = len(live) + len(pending_creates)
        if count > desired:
            for machine in self._victims(live, count - desired, agents):
                if key_of(machine) in self._draining:
                    continue
                agent = agents.get(self._agent_name(machine) or "")
                if hanging and self._drain_hangs(machine, agent):
                    self._draining.add(key_of(machine))
                    retry = 1.0
                    continue
                await self._release(machine, agent)
                await self._delete_machine(machine, now)
                live.remove(machine)
        # 4. Scale up.
        elif count < desired and node_pool is not None:
            for _ in range(desired - count):
                await self._create_machine(node_pool, now)

        # 5. Pending Machines claim Agents.
        if selector and node_pool is not None:
            taken = set(self._claimed.values())
            # `agents` is a snapshot that no write below changes, so what is derived from it is built
            # once, on first need, instead of rescanning every Agent for every pending Machine.
            by_machine_ref: dict[str, Obj] | None = None
            ranked: list[Obj] | None = None
            for machine in live:
                if _provider_agent(machine) is not None:
                    continue
                known = self._claimed.get(key_of(machine))
                if known is not None:  # claimed, but the providerID write failed or is not cached yet
                    await self._set_provider_id(machine, known)
                    continue
                if by_machine_ref is None:
                    by_machine_ref = _by_machine_ref(agents)
                adopted = await self._adopt(machine, by_machine_ref)
                if adopted is not None:
                    taken.add(adopted)
                    continue
                if ranked is None:
                    ranked = _candidates(agents, selector, taken)
                # `taken` only grows: filtering the first ranking equals ranking afresh.
                candidates = [a for a in ranked if _name(a) not in taken]
                claimed = await self._claim(node_pool, machine, candidates, selector)
                if claimed is None:
                    retry = 1.0 if retry is None else retry  # also re-driven by Agent events
                else:
                    taken.add(claimed)

        # 6. Machine and NodePool status.
        ready = 0
        for machine in live:
            agent = agents.get(self._agent_name(machine) or "")
            if agent is not None and host_state_of(agent) is HostState.ADDED_TO_EXISTING_CLUSTER:
                ready += 1
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

    def _agent_name(self, machine: Obj) -> str | None:
        return _provider_agent(machine) or self._claimed.get(key_of(machine))

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
    async def _create_machine(self, node_pool: Obj, now: float) -> None:
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
                    "apiVersion": "capi-provider.agent-install.openshift.io/v1beta1",
                    "kind": "AgentMachine",
                    "name": name,
                    "namespace": m["namespace"],
                },
            },
        }
        await self._api.create(MACHINES, body)
        self._creating[f"{m['namespace']}/{name}"] = (key_of(node_pool), now)

    async def _delete_machine(self, machine: Obj, now: float) -> None:
        m = machine["metadata"]
        await self._api.delete(MACHINES, m.get("namespace"), m["name"], uid=m.get("uid"))
        self._deleted[key_of(machine)] = now
        self._claimed.pop(key_of(machine), None)
        self._draining.discard(key_of(machine))

    async def _adopt(self, machine: Obj, by_machine_ref: dict[str, Obj]) -> str | None:
        """An Agent already claimed for this Machine (we stopped between claim and providerID)."""
        agent = by_machine_ref.get(_name(machine))
        if agent is None:
            return None
        await self._set_provider_id(machine, _name(agent))
        return _name(agent)

    async def _set_provider_id(self, machine: Obj, agent_name: str) -> None:
        self._claimed[key_of(machine)] = agent_name
        self._claims_to_check.add(key_of(machine))
        await self._api.patch(
            MACHINES,
            machine["metadata"].get("namespace"),
            _name(machine),
            {"spec": {"providerID": f"{PROVIDER_ID_PREFIX}{agent_name}"}},
        )

    async def _claim(
        self, node_pool: Obj, machine: Obj, candidates: list[Obj], selector: dict[str, Any]
    ) -> str | None:
        """Claim the first of `candidates` (see `_candidates`) that a compare-and-swap lets us have.

        A conflict usually means only that the cached copy is behind (the host state controller
        writes the Agent's status all the time), so `mutate` reads the Agent afresh and it is
        claimed if it is still eligible; otherwise every pending Machine would try every stale
        candidate in turn.
        """

        def claim(agent: Obj) -> Obj | None:
            # The cached copy is eligible; a fresh one, read after a conflict, may no longer be.
            return self._claimed_copy(node_pool, machine, agent) if _eligible(agent, selector) else None

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
            if stored is None or _machine_ref(stored) != _name(machine):
                continue  # gone, or claimed by someone else meanwhile, or no longer fit
            await self._set_provider_id(machine, _name(stored))
            await self._events.emit(
                node_pool,
                EventType.NORMAL,
                "AgentClaimed",
                f"Machine {_name(machine)} claimed Agent {_name(stored)}",
            )
            return _name(stored)
        return None

    @staticmethod
    def _claimed_copy(node_pool: Obj, machine: Obj, agent: Obj) -> Obj:
        np_meta = node_pool["metadata"]
        cluster = str(node_pool.get("spec", {}).get("clusterName") or np_meta["name"])
        claimed = dict(agent)
        claimed["metadata"] = {
            **agent["metadata"],
            "labels": {
                **(agent["metadata"].get("labels") or {}),
                Label.AGENT_MACHINE_REF.value: _name(machine),
            },
            "annotations": {
                **(agent["metadata"].get("annotations") or {}),
                Annotation.AGENT_MACHINE_REF_NAMESPACE.value: machine["metadata"]["namespace"],
            },
        }
        claimed["spec"] = {
            **agent.get("spec", {}),
            "clusterDeploymentName": {"name": cluster, "namespace": np_meta["namespace"]},
        }
        return claimed

    async def _release(self, machine: Obj, agent: Obj | None) -> None:
        if agent is None:
            return
        m = agent["metadata"]
        machine_name = _name(machine)

        def unbind(fresh: Obj) -> Obj | None:
            labels = fresh["metadata"].get("labels") or {}
            if labels.get(Label.AGENT_MACHINE_REF.value) != machine_name:
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

    async def _release_orphans(self, namespace: str, agents: dict[str, Obj]) -> None:
        for agent in agents.values():
            ref = (agent["metadata"].get("labels") or {}).get(Label.AGENT_MACHINE_REF.value)
            if not ref:
                continue
            machine_key = f"{namespace}/{ref}"
            if self._machines.get(machine_key) is not None or machine_key in self._creating:
                continue
            if machine_key in self._claimed:
                continue  # claimed a moment ago; the Machine cache has not caught up
            await self._release({"metadata": {"name": ref, "namespace": namespace}}, agent)

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
