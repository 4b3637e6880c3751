"""The informer's per-namespace index: `in_namespace` answers exactly what a scan of the whole cache
would (same objects, same order) right after every add, update, delete and re-list; and the NodePool
provider's claim bookkeeping, which relies on Machine events instead of rescanning every claim."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

from lab.hub_controllers.agent_provider import NodePoolController
from lab.hub_controllers.events import EventRecorder
from lab.hub_controllers.informer import Informer
from lab.hub_controllers.kube import KubeApi, WatchEventType
from lab.hub_controllers.resources import AGENT_MACHINES, AGENTS, MACHINES, NODE_POOLS

Obj = dict[str, Any]
NAMESPACES = ("ns1", "ns2", "ns3")


def _obj(name: str, namespace: str | None, rv: int) -> Obj:
    meta: Obj = {"name": name, "resourceVersion": str(rv)}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta}


def _informer() -> Informer:
    return Informer(cast(KubeApi, None), AGENTS)  # never started: the cache is fed by hand


def _scan(informer: Informer, namespace: str) -> list[Obj]:
    """The definition the index must keep: every cached object of that namespace, in cache order."""
    return [o for o in informer.items() if o.get("metadata", {}).get("namespace") == namespace]


def _names(objs: list[Obj]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def _assert_consistent(informer: Informer) -> None:
    for namespace in (*NAMESPACES, "", "absent"):
        listed = informer.in_namespace(namespace)
        assert listed == _scan(informer, namespace), namespace
        assert all(a is b for a, b in zip(listed, _scan(informer, namespace), strict=True))


def test_listing_follows_add_update_delete_and_keeps_cache_order() -> None:
    informer = _informer()
    informer._apply(WatchEventType.ADDED, _obj("a", "ns1", 1))
    informer._apply(WatchEventType.ADDED, _obj("b", "ns2", 2))
    informer._apply(WatchEventType.ADDED, _obj("c", "ns1", 3))
    informer._apply(WatchEventType.ADDED, _obj("node", None, 4))  # cluster-scoped: in no namespace
    assert _names(informer.in_namespace("ns1")) == ["a", "c"]
    assert _names(informer.in_namespace("ns2")) == ["b"]
    assert informer.in_namespace("ns3") == [] and informer.in_namespace("") == []

    updated = _obj("a", "ns1", 5)
    informer._apply(WatchEventType.MODIFIED, updated)
    assert _names(informer.in_namespace("ns1")) == ["a", "c"]  # an update keeps its place
    assert informer.in_namespace("ns1")[0] is updated  # and shows the new object at once

    informer._apply(WatchEventType.DELETED, _obj("a", "ns1", 6))
    assert _names(informer.in_namespace("ns1")) == ["c"]
    informer._apply(WatchEventType.ADDED, _obj("a", "ns1", 7))
    assert _names(informer.in_namespace("ns1")) == ["c", "a"]  # re-created: last, as in the cache
    informer._apply(WatchEventType.DELETED, _obj("b", "ns2", 8))
    assert informer.in_namespace("ns2") == []
    informer._apply(WatchEventType.DELETED, _obj("gone", "ns2", 9))  # unknown: nothing happens
    informer._apply(WatchEventType.BOOKMARK, _obj("", "ns3", 10))  # bookmarks are not objects
    _assert_consistent(informer)


def test_the_returned_list_is_a_copy() -> None:
    informer = _informer()
    informer._apply(WatchEventType.ADDED, _obj("a", "ns1", 1))
    informer.in_namespace("ns1").clear()
    assert _names(informer.in_namespace("ns1")) == ["a"]


def test_relist_replaces_the_namespaces_contents() -> None:
    informer = _informer()
    informer._replace([_obj("a", "ns1", 1), _obj("b", "ns1", 1), _obj("c", "ns2", 1)], "1")
    seen: list[tuple[str, str, list[str]]] = []

    def record(kind: WatchEventType, obj: Obj) -> None:  # handlers already see the updated listing
        seen.append((kind.value, obj["metadata"]["name"], _names(informer.in_namespace("ns1"))))

    informer.add_handler(record)
    seen.clear()
    informer._replace([_obj("d", "ns1", 2), _obj("b", "ns1", 3), _obj("e", "ns3", 2)], "3")
    assert _names(informer.in_namespace("ns1")) == ["b", "d"]
    assert informer.in_namespace("ns2") == []
    assert _names(informer.in_namespace("ns3")) == ["e"]
    assert seen == [
        ("DELETED", "a", ["b"]),
        ("DELETED", "c", ["b"]),
        ("ADDED", "d", ["b", "d"]),
        ("MODIFIED", "b", ["b", "d"]),
        ("ADDED", "e", ["b", "d"]),
    ]
    _assert_consistent(informer)


def test_random_histories_match_a_full_scan() -> None:
    rng = random.Random(1)
    informer = _informer()
    rv = 0
    names = [f"o{i}" for i in range(12)]
    for _ in range(2000):
        rv += 1
        namespace = rng.choice((*NAMESPACES, None, ""))
        obj = _obj(rng.choice(names), namespace, rv)
        roll = rng.random()
        if roll < 0.5:
            informer._apply(WatchEventType.ADDED if roll < 0.25 else WatchEventType.MODIFIED, obj)
        elif roll < 0.8:
            informer._apply(WatchEventType.DELETED, obj)
        else:
            items = [
                _obj(n, rng.choice((*NAMESPACES, None)), rv) for n in rng.sample(names, rng.randint(0, 8))
            ]
            informer._replace(items, str(rv))
        _assert_consistent(informer)


# -- NodePool provider: claims end when their Machine leaves the cache -------------------------------


def _machine(name: str, rv: int) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "resourceVersion": str(rv),
            "labels": {"hypershift.openshift.io/nodePool": "np1"},
        }
    }


async def test_claims_are_dropped_once_their_machine_is_no_longer_cached() -> None:
    api = cast(KubeApi, None)  # never called: the caches and claims are fed by hand
    machines = Informer(api, MACHINES)
    controller = NodePoolController(
        api,
        Informer(api, NODE_POOLS),
        Informer(api, AGENTS),
        machines,
        Informer(api, AGENT_MACHINES),
        events=cast(EventRecorder, None),
    )
    now = asyncio.get_running_loop().time()
    machines._apply(WatchEventType.ADDED, _machine("m1", 1))
    machines._apply(WatchEventType.ADDED, _machine("m2", 2))
    controller._remember(_machine("m1", 1), "agent-1", "uid-1")
    controller._remember(_machine("m2", 2), "agent-2", "uid-2")
    controller._remember(_machine("m3", 3), "agent-3", "uid-3")  # its Machine left before the claim

    def claims() -> dict[str, str]:
        return {key: claim.agent for key, claim in controller._claimed.items()}

    controller._expire(now)
    assert claims() == {"ns1/m1": "agent-1", "ns1/m2": "agent-2"}

    machines._apply(WatchEventType.DELETED, _machine("m1", 4))
    machines._apply(WatchEventType.DELETED, _machine("m2", 5))
    machines._apply(WatchEventType.ADDED, _machine("m2", 6))  # back before the next pass: still claimed
    controller._expire(now)
    assert claims() == {"ns1/m2": "agent-2"}

    machines._replace([], "7")  # a re-list that finds the Machine gone ends the claim too
    controller._expire(now)
    assert claims() == {}


def _agent_machine(name: str, uid: str, rv: int) -> Obj:
    return {"metadata": {"name": name, "namespace": "ns1", "uid": uid, "resourceVersion": str(rv)}}


async def test_agent_machines_are_found_by_uid_through_replacements_and_re_lists() -> None:
    """The Agents' labels name AgentMachines by uid: the provider's uid index follows the cache."""
    api = cast(KubeApi, None)  # never called: the cache is fed by hand
    agent_machines = Informer(api, AGENT_MACHINES)
    controller = NodePoolController(
        api,
        Informer(api, NODE_POOLS),
        Informer(api, AGENTS),
        Informer(api, MACHINES),
        agent_machines,
        events=cast(EventRecorder, None),
    )
    agent_machines._apply(WatchEventType.ADDED, _agent_machine("m1", "uid-1", 1))
    agent_machines._apply(WatchEventType.ADDED, _agent_machine("m2", "uid-2", 2))
    assert controller._agent_machine_keys == {"uid-1": "ns1/m1", "uid-2": "ns1/m2"}

    # A re-list finds m1 replaced by a namesake and m2 gone.
    agent_machines._replace([_agent_machine("m1", "uid-3", 3)], "3")
    assert controller._agent_machine_keys == {"uid-3": "ns1/m1"}
    agent_machines._apply(WatchEventType.DELETED, _agent_machine("m1", "uid-3", 4))
    assert controller._agent_machine_keys == {} and controller._agent_machine_uids == {}
