"""Agent activities on the bare hub API, where each test writes Agents, NodePools and Machines itself
to pin exact situations: MAC correlation, hand-off labels, level-based replicas, unbinding."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from activities import assisted
from activities.assisted import INFRAENV_LABEL, AssistedActivities
from activities.hub import sync_replicas_now
from activities.kube import AGENTS, HubKube, dig
from contracts.hub import (
    WORKER_LABEL,
    AgentMatch,
    AgentRef,
    HandAgentInput,
    HubErrorType,
    InfraEnvRef,
    NodePoolRef,
    ReleaseAgentInput,
    ReleaseStaleAgentsInput,
    ReleaseWipedHostAgentsInput,
    UnbindAgentInput,
    WaitAgentInput,
    WaitAgentInstalledInput,
    WaitAgentUnboundInput,
    WaitAndHandAgentInput,
)
from contracts.refs import OrderRef
from tests.activities_hub.conftest import new_namespace

SELECTOR = {"osac.openshift.io/clusterorder": "order-1", "osac.openshift.io/resource_class": "small"}


def wait_input(api, macs: list[str], seconds: float = 30) -> WaitAgentInput:
    order = OrderRef(namespace=api.ns, name="order-1")
    return WaitAgentInput(
        infraenv=InfraEnvRef.for_order(order),
        order=order,
        macs=macs,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
    )


def deadline(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


# ---------------------------------------------------------------------------------------------
# MAC correlation


async def test_agent_registering_later_is_found_by_any_mac_spelling(api, api_assisted, kit):
    macs = kit.random_macs(2)
    run = kit.run()
    # The BMI reports uppercase dash form; the Agent reports lowercase colon form.
    spelled = [m.upper().replace(":", "-") for m in macs]
    task = asyncio.create_task(run(api_assisted.wait_agent_for_macs, wait_input(api, spelled)))
    await run.first_heartbeat()
    assert not task.done()
    # Noise: another InfraEnv's Agent with the same MAC, and an Agent of another order.
    api.agent("other-infraenv", macs[:1], infraenv="order-2-infraenv")
    api.agent("other-order", macs[:1], labels={"osac.openshift.io/clusterorder": "order-2"})
    api.agent("unrelated", kit.random_macs(2))
    api.agent("host-a", macs)
    agent = await asyncio.wait_for(task, 30)
    assert agent == AgentMatch(namespace=api.ns, name="host-a", unmatched_macs=[])
    beat = run.heartbeats[0][0]
    assert set(beat) >= {"infraenv", "agents_in_infraenv", "matching_agents"}


async def test_bond_mac_reported_on_a_second_nic_matches(api, api_assisted, kit):
    bmi_nics = kit.random_macs(3)
    extra = kit.random_macs(1)[0]
    # The host reports a bond carrying the BMI's third NIC MAC, in uppercase, as its second interface.
    api.agent("bonded", [extra.upper().replace(":", "-"), bmi_nics[2].upper()])
    agent = await kit.run()(api_assisted.wait_agent_for_macs, wait_input(api, bmi_nics))
    assert agent.name == "bonded"
    # Its other interface is reported (normalised) for the workflow to check against other BMIs.
    assert agent.unmatched_macs == [extra]


async def test_two_agents_with_a_bmi_mac_are_ambiguous_and_never_returned(api, api_assisted, kit):
    macs = kit.random_macs(2)
    api.agent("twin-1", [macs[0]])
    api.agent("twin-2", [kit.random_macs(1)[0], macs[1]])
    with pytest.raises(ApplicationError) as ambiguous:
        await kit.run()(api_assisted.wait_agent_for_macs, wait_input(api, macs))
    error = ambiguous.value
    assert error.type == HubErrorType.AMBIGUOUS_AGENT_MATCH == "AmbiguousAgentMatch"
    assert error.non_retryable
    assert error.details[0]["agents"] == ["twin-1", "twin-2"]  # for operators
    assert macs[0] not in str(error)
    for name in ("twin-1", "twin-2"):  # neither was touched
        assert api.get("Agent", name)["spec"]["approved"] is False


async def test_no_agent_by_the_deadline_times_out_and_a_retry_does_not_extend_it(api, api_assisted, kit):
    request = wait_input(api, kit.random_macs(1), seconds=0.5)
    api.agent("someone-else", kit.random_macs(1))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ApplicationError) as timeout:
        await kit.run()(api_assisted.wait_agent_for_macs, request)
    assert timeout.value.type == HubErrorType.AGENT_REGISTRATION_TIMEOUT and timeout.value.non_retryable
    assert loop.time() - started >= 0.4
    assert timeout.value.details[0]["agents_in_infraenv"] == 1
    # A retried attempt with the same (absolute) deadline fails at once instead of waiting again.
    started = loop.time()
    with pytest.raises(ApplicationError):
        await kit.run()(api_assisted.wait_agent_for_macs, request)
    assert loop.time() - started < 5


# ---------------------------------------------------------------------------------------------
# Waiting and handing off in one activity (WorkerRevision.AGENT_HANDED_IN_WAIT)


def wait_and_hand_input(api, macs: list[str], worker: str = "order-1-worker-0") -> WaitAndHandAgentInput:
    return WaitAndHandAgentInput(
        **wait_input(api, macs).model_dump(),
        nodepool=NodePoolRef(namespace=api.ns, name="np"),
        worker=worker,
        hostname=worker,
    )


async def test_wait_and_hand_approves_the_agent_as_soon_as_it_registers(api, api_assisted, kit):
    api.nodepool("np", SELECTOR)
    macs = kit.random_macs(2)
    run = kit.run()
    task = run.start(api_assisted.wait_agent_and_hand, wait_and_hand_input(api, macs))
    await run.first_heartbeat()
    assert not task.done()
    assert api.get("NodePool", "np")["spec"]["replicas"] == 0
    api.agent("host-a", macs)
    outcome = await asyncio.wait_for(task, 30)
    assert outcome.match == AgentMatch(namespace=api.ns, name="host-a", unmatched_macs=[])
    assert outcome.handed is not None and outcome.handed.changed
    assert outcome.handed.replicas is not None and outcome.handed.replicas.replicas == 1
    agent = api.get("Agent", "host-a")
    assert agent["spec"]["approved"] is True and agent["spec"]["hostname"] == "order-1-worker-0"
    assert agent["metadata"]["annotations"]["osac.openshift.io/worker"] == "order-1-worker-0"
    assert api.get("NodePool", "np")["spec"]["replicas"] == 1
    # A retry (the first attempt's completion lost) finds its own hand-off and changes nothing.
    lists = api.requests_by(kit.worker_user, "list", "agents.")
    again = await kit.run()(api_assisted.wait_agent_and_hand, wait_and_hand_input(api, macs))
    assert again.match.name == "host-a" and again.handed is not None and not again.handed.changed
    # The InfraEnv's Agents are listed once: the list the match was decided on is the hand-off's
    # duplicate check too. The other list is the NodePool's count.
    assert api.requests_by(kit.worker_user, "list", "agents.") - lists == 2


async def test_wait_and_hand_leaves_an_agent_reporting_a_foreign_nic_to_the_workflow(api, api_assisted, kit):
    """Whose the other NIC is only BMaaS knows: the workflow asks before anything is handed."""
    api.nodepool("np", SELECTOR)
    macs, extra = kit.random_macs(2), kit.random_macs(1)[0]
    api.agent("host-a", [*macs, extra])
    outcome = await kit.run()(api_assisted.wait_agent_and_hand, wait_and_hand_input(api, macs))
    assert outcome.match.unmatched_macs == [extra] and outcome.handed is None
    assert api.get("Agent", "host-a")["spec"]["approved"] is False
    assert api.get("NodePool", "np")["spec"]["replicas"] == 0


async def test_wait_and_hand_refuses_two_agents_with_the_hosts_macs(api, api_assisted, kit):
    api.nodepool("np", SELECTOR)
    macs = kit.random_macs(2)
    api.agent("twin-1", [macs[0]])
    api.agent("twin-2", [macs[1]])
    with pytest.raises(ApplicationError) as ambiguous:
        await kit.run()(api_assisted.wait_agent_and_hand, wait_and_hand_input(api, macs))
    assert ambiguous.value.type == HubErrorType.AMBIGUOUS_AGENT_MATCH and ambiguous.value.non_retryable
    for name in ("twin-1", "twin-2"):
        assert api.get("Agent", name)["spec"]["approved"] is False


async def test_wait_and_hand_waits_while_the_hosts_agent_is_another_slots(api, api_assisted, kit):
    """The host was slot 0's, deleted behind its back, wiped and given to slot 1 while slot 0 still
    holds the Agent (named after the host). Slot 1's wait never takes it: it waits for slot 0's
    release to delete it and hands the host's next registration over. Still held at the deadline,
    it says whose it is (AgentOwnedElsewhere), not that nothing registered."""
    api.nodepool("np", SELECTOR)
    macs = kit.random_macs(2)
    api.agent("host-a", macs)
    await kit.run()(
        api_assisted.wait_agent_and_hand, wait_and_hand_input(api, macs, worker="order-1-worker-0")
    )
    run = kit.run()
    task = run.start(
        api_assisted.wait_agent_and_hand, wait_and_hand_input(api, macs, worker="order-1-worker-1")
    )
    await run.first_heartbeat()
    assert not task.done()
    assert (
        api.get("Agent", "host-a")["metadata"]["annotations"]["osac.openshift.io/worker"]
        == "order-1-worker-0"
    )
    api.delete("Agent", "host-a")  # slot 0's release
    api.agent("host-a", macs)  # the host registers again
    outcome = await asyncio.wait_for(task, 30)
    assert outcome.match.name == "host-a" and outcome.handed is not None
    assert (
        api.get("Agent", "host-a")["metadata"]["annotations"]["osac.openshift.io/worker"]
        == "order-1-worker-1"
    )

    short = wait_and_hand_input(api, macs, worker="order-1-worker-2").model_copy(
        update={"deadline": deadline(0.5)}
    )
    with pytest.raises(ApplicationError) as held:
        await kit.run()(api_assisted.wait_agent_and_hand, short)
    assert held.value.type == HubErrorType.AGENT_OWNED_ELSEWHERE and held.value.non_retryable
    assert held.value.details[0]["worker"] == "order-1-worker-1"


async def test_release_leaves_the_agent_handed_to_the_releasing_worker_for_its_unbind(api, api_assisted, kit):
    """A wait cancelled after its hand-off never told the workflow which Agent it handed: the
    release finds it by the slot's mark, returns it to be unbound, and deletes only stale ones."""
    api.nodepool("np", SELECTOR)
    macs = kit.random_macs(2)
    api.agent("host-a", macs)
    await kit.run()(api_assisted.wait_agent_and_hand, wait_and_hand_input(api, macs))
    api.agent("late-duplicate", macs[:1])  # registered after the hand-off: stale
    other = kit.random_macs(1)
    api.agent("host-b", other)
    await kit.run()(
        api_assisted.wait_agent_and_hand, wait_and_hand_input(api, other, worker="order-1-worker-1")
    )
    order = OrderRef(namespace=api.ns, name="order-1")

    def release(agent: str | None, worker: str | None, host_macs: list[str]) -> ReleaseAgentInput:
        return ReleaseAgentInput(
            agent=AgentRef(namespace=api.ns, name=agent) if agent else None,
            infraenv=InfraEnvRef.for_order(order),
            order=order,
            macs=host_macs,
            worker=worker,
        )

    # Another worker's release never takes this worker's Agent: it is kept, as before.
    kept = await kit.run()(api_assisted.release_agent, release(None, "order-1-worker-1", macs))
    assert kept.handed == [] and kept.kept == ["host-a"] and kept.deleted == ["late-duplicate"]
    released = await kit.run()(api_assisted.release_agent, release(None, "order-1-worker-0", macs))
    assert released.handed == ["host-a"] and released.deleted == []
    # Named, it is still left for the unbind rather than deleted.
    named = await kit.run()(api_assisted.release_agent, release("host-b", "order-1-worker-1", other))
    assert named.handed == ["host-b"] and named.deleted == []
    assert api.get("Agent", "host-a") is not None and api.get("Agent", "host-b") is not None


async def test_release_of_a_named_agent_never_deletes_another_workers(api, api_assisted, kit):
    """Slot A's host was given to slot B behind A's back and B's hand-off of A's Agent failed
    (AgentOwnedElsewhere: a concurrent hand-off, or a worker of before B's wait waited for A's
    release). B's release names that Agent: it must be left to A. An unhanded Agent is deleted as
    before, and one handed to B is returned for B's unbind."""
    api.nodepool("np", SELECTOR)
    host = kit.random_macs(2)
    api.agent("a1", [*host, kit.random_macs(1)[0]])  # the host's MACs plus an Agent-only NIC
    order = OrderRef(namespace=api.ns, name="order-1")
    hand = HandAgentInput(
        agent=AgentRef(namespace=api.ns, name="a1"),
        nodepool=NodePoolRef(namespace=api.ns, name="np"),
        worker="order-1-worker-0",
    )
    await kit.run()(api_assisted.hand_agent_to_nodepool, hand)
    with pytest.raises(ApplicationError) as taken:
        await kit.run()(
            api_assisted.hand_agent_to_nodepool, hand.model_copy(update={"worker": "order-1-worker-1"})
        )
    assert taken.value.type == HubErrorType.AGENT_OWNED_ELSEWHERE

    def release(agent: str, worker: str | None = "order-1-worker-1", macs=()) -> ReleaseAgentInput:
        return ReleaseAgentInput(
            agent=AgentRef(namespace=api.ns, name=agent),
            infraenv=InfraEnvRef.for_order(order),
            order=order,
            macs=list(macs),
            worker=worker,
        )

    before = api.get("Agent", "a1")
    kept = await kit.run()(api_assisted.release_agent, release("a1", macs=host))
    assert kept.kept == ["a1"] and kept.deleted == [] and kept.handed == []
    assert api.get("Agent", "a1") == before  # untouched

    # Bound to a cluster without any slot's hand-off (claimed by someone else): untouched too.
    api.agent("bound", kit.random_macs(1))
    api.patch("Agent", "bound", {"spec": {"clusterDeploymentName": {"name": "c", "namespace": api.ns}}})
    assert (await kit.run()(api_assisted.release_agent, release("bound"))).kept == ["bound"]
    assert api.get("Agent", "bound") is not None

    # Nobody's: deleted, as before.
    api.agent("unhanded", kit.random_macs(1))
    gone = await kit.run()(api_assisted.release_agent, release("unhanded"))
    assert gone.deleted == ["unhanded"] and api.get("Agent", "unhanded") is None

    # The releasing worker's own: left for its unbind, as before.
    api.agent("b1", kit.random_macs(1))
    b1 = AgentRef(namespace=api.ns, name="b1")
    to_b = hand.model_copy(update={"agent": b1, "worker": "order-1-worker-1"})
    await kit.run()(api_assisted.hand_agent_to_nodepool, to_b)
    own = await kit.run()(api_assisted.release_agent, release("b1"))
    assert own.handed == ["b1"] and own.deleted == [] and api.get("Agent", "b1") is not None

    # An unbind (no worker: it knows the Agent is its own) deletes it.
    assert (await kit.run()(api_assisted.release_agent, release("b1", worker=None))).deleted == ["b1"]
    assert api.get("Agent", "b1") is None and api.get("Agent", "a1") == before


# ---------------------------------------------------------------------------------------------
# Hand-off and level-based replicas


async def test_hand_off_applies_the_nodepools_selector_and_never_binds(api, api_assisted, kit):
    api.nodepool("np", SELECTOR)
    api.agent("host-a", kit.random_macs())
    request = HandAgentInput(
        agent=AgentRef(namespace=api.ns, name="host-a"),
        nodepool=NodePoolRef(namespace=api.ns, name="np"),
        worker="order-1-worker-0",
        hostname="order-1-worker-0",
    )
    result = await kit.run()(api_assisted.hand_agent_to_nodepool, request)
    assert result.changed
    agent = api.get("Agent", "host-a")
    kit.validate("Agent", agent)
    labels = agent["metadata"]["labels"]
    assert {k: labels.get(k) for k in SELECTOR} == SELECTOR
    assert labels["osac.openshift.io/worker"] == "order-1-worker-0"
    assert labels["osac.openshift.io/worker-name"] == "order-1-worker-0"  # OSAC's own key
    assert agent["spec"]["approved"] is True and agent["spec"]["role"] == "worker"
    assert agent["spec"]["hostname"] == "order-1-worker-0"
    assert "clusterDeploymentName" not in agent["spec"]

    again = await kit.run()(api_assisted.hand_agent_to_nodepool, request)
    assert not again.changed

    # An Agent handed to another slot is never taken over.
    with pytest.raises(ApplicationError) as taken:
        await kit.run()(
            api_assisted.hand_agent_to_nodepool, request.model_copy(update={"worker": "order-1-worker-9"})
        )
    assert taken.value.type == HubErrorType.AGENT_OWNED_ELSEWHERE and taken.value.non_retryable


async def test_concurrent_hand_offs_of_one_agent_to_two_slots_let_exactly_one_win(
    api, api_assisted, api_kube, kit, monkeypatch
):
    """Both workers read the Agent unclaimed before either writes: the write is a compare-and-swap,
    so the later one conflicts, re-reads, and finds the Agent taken."""
    api.nodepool("np", SELECTOR)
    api.agent("host-a", kit.random_macs())
    both_read = asyncio.Barrier(2)
    patch = api_kube.patch

    async def patch_once_both_read(resource, namespace, name, body, **kwargs):
        if resource is AGENTS and not both_read.broken:
            await asyncio.wait_for(both_read.wait(), 10)
            await both_read.abort()  # one rendezvous: later writes (re-tries) go straight through
        return await patch(resource, namespace, name, body, **kwargs)

    monkeypatch.setattr(api_kube, "patch", patch_once_both_read)

    def request(worker: str) -> HandAgentInput:
        return HandAgentInput(
            agent=AgentRef(namespace=api.ns, name="host-a"),
            nodepool=NodePoolRef(namespace=api.ns, name="np"),
            worker=worker,
        )

    outcomes = await asyncio.gather(
        kit.run()(api_assisted.hand_agent_to_nodepool, request("w-0")),
        kit.run()(api_assisted.hand_agent_to_nodepool, request("w-1")),
        return_exceptions=True,
    )
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1 and won[0].changed, outcomes
    assert len(lost) == 1 and isinstance(lost[0], ApplicationError), outcomes
    assert lost[0].type == HubErrorType.AGENT_OWNED_ELSEWHERE and lost[0].non_retryable
    winner = won[0].labels["osac.openshift.io/worker"]
    agent = api.get("Agent", "host-a")
    assert agent["metadata"]["labels"]["osac.openshift.io/worker"] == winner
    assert agent["metadata"]["annotations"]["osac.openshift.io/worker"] == winner


async def test_a_hand_off_after_a_match_writes_on_the_listed_copy_and_reads_only_after_a_conflict(
    api, api_assisted, kit
):
    """The list the match was decided on holds the Agent: the hand-off's compare-and-swap is made on
    that copy, with no read of its own. A copy changed since costs a conflict and one read, and what
    changed meanwhile is kept."""
    api.nodepool("np", SELECTOR)

    def request(agent: str, worker: str) -> HandAgentInput:
        return HandAgentInput(
            agent=AgentRef(namespace=api.ns, name=agent),
            nodepool=NodePoolRef(namespace=api.ns, name="np"),
            worker=worker,
        )

    api.agent("host-a", kit.random_macs())
    listed = api.get("Agent", "host-a")
    gets = api.requests_by(kit.worker_user, "get", "agents.")
    handed = await kit.run()(api_assisted._hand, request("host-a", "w-0"), [listed])
    assert handed.changed and api.get("Agent", "host-a")["spec"]["approved"] is True
    assert api.requests_by(kit.worker_user, "get", "agents.") == gets

    api.agent("host-b", kit.random_macs())
    stale = api.get("Agent", "host-b")
    api.patch("Agent", "host-b", {"metadata": {"labels": {"example.com/changed-meanwhile": "yes"}}})
    gets = api.requests_by(kit.worker_user, "get", "agents.")
    handed = await kit.run()(api_assisted._hand, request("host-b", "w-1"), [listed, stale])
    assert handed.changed
    assert api.requests_by(kit.worker_user, "get", "agents.") == gets + 1
    labels = api.get("Agent", "host-b")["metadata"]["labels"]
    assert labels["example.com/changed-meanwhile"] == "yes" and labels["osac.openshift.io/worker"] == "w-1"


async def test_hand_off_refuses_an_agent_annotated_for_another_slot(api, api_assisted, kit):
    """A long slot name is labelled in a hashed short form; the annotation with the full name counts too."""
    api.nodepool("np", SELECTOR)
    api.agent("host-a", kit.random_macs())
    api.patch("Agent", "host-a", {"metadata": {"annotations": {"osac.openshift.io/worker": "w-other"}}})
    request = HandAgentInput(
        agent=AgentRef(namespace=api.ns, name="host-a"),
        nodepool=NodePoolRef(namespace=api.ns, name="np"),
        worker="w-0",
    )
    with pytest.raises(ApplicationError) as taken:
        await kit.run()(api_assisted.hand_agent_to_nodepool, request)
    assert taken.value.type == HubErrorType.AGENT_OWNED_ELSEWHERE and taken.value.non_retryable
    assert api.get("Agent", "host-a")["spec"]["approved"] is False


async def test_hand_off_needs_a_nodepool_with_a_selector(api, api_assisted, kit):
    api.agent("host-a", kit.random_macs())
    request = HandAgentInput(
        agent=AgentRef(namespace=api.ns, name="host-a"),
        nodepool=NodePoolRef(namespace=api.ns, name="missing"),
        worker="w",
    )
    with pytest.raises(ApplicationError) as missing:
        await kit.run()(api_assisted.hand_agent_to_nodepool, request)
    assert missing.value.type == HubErrorType.NODEPOOL_NOT_FOUND and not missing.value.non_retryable

    api.nodepool("empty", {})
    with pytest.raises(ApplicationError) as no_selector:
        await kit.run()(
            api_assisted.hand_agent_to_nodepool,
            request.model_copy(update={"nodepool": NodePoolRef(namespace=api.ns, name="empty")}),
        )
    assert no_selector.value.type == HubErrorType.NODEPOOL_SELECTOR_INVALID
    assert api.get("Agent", "host-a")["spec"]["approved"] is False


async def test_concurrent_hand_offs_and_syncs_converge_on_the_level(
    api, api_hub, api_assisted, api_hub_acts, kit
):
    api.nodepool("np", SELECTOR)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    for i in range(5):
        api.agent(f"host-{i}", kit.random_macs())
    # Noise that must not count: selector labels but not approved, and another pool's Agent.
    api.agent("unapproved", kit.random_macs(), labels=SELECTOR)
    api.agent(
        "elsewhere",
        kit.random_macs(),
        labels={**SELECTOR, "osac.openshift.io/resource_class": "big"},
        approved=True,
    )
    # Every NodePool write of the workers conflicts at first, as under a busy provider.
    faults = {
        "errors": [
            {
                "code": 409,
                "verbs": ["patch"],
                "resources": ["nodepools"],
                "users": [kit.worker_user],
                "limit": 4,
            }
        ]
    }
    api.set_faults(faults)

    async def worker(i: int) -> int:
        handed = await kit.run()(
            api_assisted.hand_agent_to_nodepool,
            HandAgentInput(
                agent=AgentRef(namespace=api.ns, name=f"host-{i}"), nodepool=pool, worker=f"w-{i}"
            ),
        )
        assert handed.replicas is not None  # the hand-off syncs the replicas itself
        synced = await kit.run()(api_hub_acts.sync_nodepool_replicas, pool)
        return handed.replicas.conflicts_retried + synced.conflicts_retried

    try:
        conflicts = await asyncio.gather(*(worker(i) for i in range(5)))
    finally:
        api.clear_faults()
    assert sum(conflicts) >= 4
    assert api.get("NodePool", "np")["spec"]["replicas"] == 5
    # Syncing again is a no-op; its answer lists who counts.
    settled = await kit.run()(api_hub_acts.sync_nodepool_replicas, pool)
    assert not settled.changed and settled.replicas == 5 and settled.agents == [f"host-{i}" for i in range(5)]

    # Two leave: marked removing, they stop counting (again computed, not decremented).
    for i in (1, 3):
        marked = await kit.run()(
            api_assisted.mark_agent_removing, AgentRef(namespace=api.ns, name=f"host-{i}")
        )
        assert marked.changed
    syncs = await asyncio.gather(*(kit.run()(api_hub_acts.sync_nodepool_replicas, pool) for _ in range(3)))
    assert {s.replicas for s in syncs} == {3}
    assert api.get("NodePool", "np")["spec"]["replicas"] == 3
    kit.validate("NodePool", api.get("NodePool", "np"))

    gone = await kit.run()(api_hub_acts.sync_nodepool_replicas, NodePoolRef(namespace=api.ns, name="absent"))
    assert not gone.nodepool_found


async def test_concurrent_replica_syncs_of_one_nodepool_share_one_read_and_write(
    api, api_kube, api_hub_acts, kit
):
    """A burst of syncs on one NodePool (a burst of hand-offs) runs as one sync at a time, each
    caller joining the next one to start, so it still counts what the caller changed before."""
    api.nodepool("np", SELECTOR)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    for i in range(4):
        api.agent(f"host-{i}", kit.random_macs(), labels=SELECTOR, approved=True)
    lists = api_kube.stats.requests["list"]
    syncs = await asyncio.gather(*(kit.run()(api_hub_acts.sync_nodepool_replicas, pool) for _ in range(20)))
    assert {s.replicas for s in syncs} == {4}
    assert api.get("NodePool", "np")["spec"]["replicas"] == 4
    assert api_kube.stats.requests["list"] - lists <= 2  # one running, at most one more joined
    # A change made while a sync runs is counted by the one its caller joins.
    first = asyncio.ensure_future(kit.run()(api_hub_acts.sync_nodepool_replicas, pool))
    await asyncio.sleep(0)
    api.agent("host-4", kit.random_macs(), labels=SELECTOR, approved=True)
    second = await kit.run()(api_hub_acts.sync_nodepool_replicas, pool)
    await first
    assert second.replicas == 5 and api.get("NodePool", "np")["spec"]["replicas"] == 5


# ---------------------------------------------------------------------------------------------
# Scale-down: the Machine, unbinding, deletion


def machine(api, name: str, agent: str | None, namespace: str | None = None) -> dict:
    """A Machine; with `agent`, as CAPI leaves it once that Agent is installed (its providerID)."""
    return api.create(
        "Machine",
        {
            "metadata": {"name": name, "namespace": namespace or api.ns},
            "spec": {
                "clusterName": "cluster",
                "bootstrap": {"dataSecretName": "none"},
                "infrastructureRef": {
                    "apiVersion": "capi-provider.agent-install.openshift.io/v1beta1",
                    "kind": "AgentMachine",
                    "name": name,
                },
                **({"providerID": f"agent://{agent}"} if agent else {}),
            },
        },
    )


async def test_annotate_machine_for_deletion(api, api_hub_acts, kit):
    machine(api, "np-abcde", "host-a")
    machine(api, "np-fghij", "host-b")
    ref = AgentRef(namespace=api.ns, name="host-a")
    result = await kit.run()(api_hub_acts.annotate_machine_for_deletion, ref)
    assert result.machine == "np-abcde" and result.changed
    annotated = api.get("Machine", "np-abcde")["metadata"]["annotations"]
    assert annotated["cluster.x-k8s.io/delete-machine"] == "true"
    assert "annotations" not in api.get("Machine", "np-fghij")["metadata"] or not api.get(
        "Machine", "np-fghij"
    )["metadata"]["annotations"].get("cluster.x-k8s.io/delete-machine")
    assert not (await kit.run()(api_hub_acts.annotate_machine_for_deletion, ref)).changed
    nothing = await kit.run()(
        api_hub_acts.annotate_machine_for_deletion, AgentRef(namespace=api.ns, name="x")
    )
    assert nothing.machine is None


def agent_machine(api, machine_object: dict, agent: str | None) -> dict:
    """The provider's AgentMachine of a Machine (named after it, owned by it); with `agent`, as the
    claim leaves it: naming the Agent, whose label then carries this AgentMachine's uid."""
    m = machine_object["metadata"]
    created = api.create(
        "AgentMachine",
        {
            "metadata": {
                "name": m["name"],
                "ownerReferences": [
                    {
                        "apiVersion": "cluster.x-k8s.io/v1beta1",
                        "kind": "Machine",
                        "name": m["name"],
                        "uid": m["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"providerID": f"agent://{agent}"} if agent else {},
        },
    )
    if agent is not None:
        api.patch(
            "AgentMachine",
            m["name"],
            {"status": {"ready": False, "agentRef": {"namespace": api.ns, "name": agent}}},
            status=True,
        )
        api.patch(
            "Agent",
            agent,
            {
                "metadata": {
                    "labels": {"agentMachineRef": created["metadata"]["uid"]},
                    "annotations": {"agentMachineRefNamespace": api.ns},
                }
            },
        )
    return created


async def test_an_installing_agents_machine_is_found_through_its_agent_machine(api, api_hub_acts, kit):
    """CAPI gives a Machine its providerID only once its AgentMachine is ready, i.e. the Agent
    installed: while two workers install, the one scaled down has its own Machine marked (found
    through the AgentMachine its Agent's label names), never the other's, and no Machine when the
    Agent is not claimed."""
    installing = {name: machine(api, name, agent=None) for name in ("np-abcde", "np-fghij", "np-klmno")}
    for agent, name in (("host-a", "np-abcde"), ("host-b", "np-fghij")):
        api.agent(agent, kit.random_macs(1))
        agent_machine(api, installing[name], agent)
    agent_machine(api, installing["np-klmno"], None)  # pending: no Agent claimed yet
    api.agent("host-c", kit.random_macs(1))

    marked = await kit.run()(
        api_hub_acts.annotate_machine_for_deletion, AgentRef(namespace=api.ns, name="host-b")
    )
    assert marked.machine == "np-fghij" and marked.machine_namespace == api.ns and marked.changed
    annotations = {
        name: (api.get("Machine", name)["metadata"].get("annotations") or {}) for name in installing
    }
    assert annotations["np-fghij"]["cluster.x-k8s.io/delete-machine"] == "true"
    assert "cluster.x-k8s.io/delete-machine" not in annotations["np-abcde"]
    assert "cluster.x-k8s.io/delete-machine" not in annotations["np-klmno"]
    unclaimed = await kit.run()(
        api_hub_acts.annotate_machine_for_deletion, AgentRef(namespace=api.ns, name="host-c")
    )
    assert unclaimed.machine is None


async def test_an_agent_machine_named_apart_from_its_machine_leads_to_its_owner(api, api_hub_acts, kit):
    """The AgentMachine's owner reference names its Machine (CAPI before 1.7 named them apart); an
    installed Agent whose references are gone is still found by its Machine's providerID."""
    owner = machine(api, "np-abcde", agent=None)
    api.agent("host-a", kit.random_macs(1))
    renamed = {**owner, "metadata": {**owner["metadata"], "name": "agentmachine-a"}}
    created = agent_machine(api, renamed, "host-a")
    assert created["metadata"]["ownerReferences"][0]["name"] == "agentmachine-a"
    owned = [{**created["metadata"]["ownerReferences"][0], "name": "np-abcde"}]
    api.patch("AgentMachine", "agentmachine-a", {"metadata": {"ownerReferences": owned}})
    found = await kit.run()(
        api_hub_acts.annotate_machine_for_deletion, AgentRef(namespace=api.ns, name="host-a")
    )
    assert found.machine == "np-abcde" and found.changed
    machine(api, "np-fghij", "host-b")
    api.agent("host-b", kit.random_macs(1))
    installed = await kit.run()(
        api_hub_acts.annotate_machine_for_deletion, AgentRef(namespace=api.ns, name="host-b")
    )
    assert installed.machine == "np-fghij" and installed.changed


def claim(api, name: str) -> None:
    api.patch(
        "Agent",
        name,
        {
            "metadata": {"labels": {"agentMachineRef": f"m-{name}"}},
            "spec": {"clusterDeploymentName": {"name": "cluster", "namespace": api.ns}},
        },
    )
    api.patch(
        "Agent",
        name,
        {
            "status": {
                "debugInfo": {"state": "added-to-existing-cluster"},
                "conditions": [{"type": "Bound", "status": "True", "reason": "Bound"}],
            }
        },
        status=True,
    )


async def test_wait_agent_unbound(api, api_assisted, api_kube, kit):
    ref = AgentRef(namespace=api.ns, name="host-a")
    api.agent("host-a", kit.random_macs())
    never = await kit.run()(
        api_assisted.wait_agent_unbound, WaitAgentUnboundInput(agent=ref, deadline=deadline(30))
    )
    assert not never.was_claimed and not never.gone  # never claimed: unbound at once

    claim(api, "host-a")
    run = kit.run()
    task = asyncio.create_task(
        run(api_assisted.wait_agent_unbound, WaitAgentUnboundInput(agent=ref, deadline=deadline(30)))
    )
    await run.first_heartbeat()
    # The provider releases it: clusterDeploymentName cleared first, the state follows.
    api.patch(
        "Agent",
        "host-a",
        {"metadata": {"labels": {"agentMachineRef": None}}, "spec": {"clusterDeploymentName": None}},
    )
    informer = api_kube.informer(AGENTS)
    # Until the activity's own cache has seen the release, then past one more heartbeat of it.
    await informer.wait(
        lambda: None if dig(informer.get(api.ns, "host-a") or {}, "spec", "clusterDeploymentName") else True,
        deadline=deadline(30),
    )
    seen = len(run.heartbeats)
    await informer.wait(
        lambda: True if len(run.heartbeats) > seen else None, deadline=deadline(30), tick_seconds=0.05
    )
    assert not task.done()  # released, but the state still says installed: not yet unbound
    api.patch(
        "Agent", "host-a", {"status": {"debugInfo": {"state": "unbinding-pending-user-action"}}}, status=True
    )
    result = await asyncio.wait_for(task, 30)
    assert result.was_claimed and result.state == "unbinding-pending-user-action"
    assert "added-to-existing-cluster" in {h[0]["state"] for h in run.heartbeats}

    claim(api, "host-a")
    with pytest.raises(ApplicationError) as stuck:
        await kit.run()(
            api_assisted.wait_agent_unbound, WaitAgentUnboundInput(agent=ref, deadline=deadline(0.5))
        )
    assert stuck.value.type == HubErrorType.AGENT_UNBINDING_TIMEOUT and stuck.value.non_retryable

    deleted = await kit.run()(api_assisted.delete_agent, ref)
    assert not deleted.already_gone
    gone = await kit.run()(
        api_assisted.wait_agent_unbound, WaitAgentUnboundInput(agent=ref, deadline=deadline(30))
    )
    assert gone.gone
    assert (await kit.run()(api_assisted.delete_agent, ref)).already_gone
    assert not (await kit.run()(api_assisted.mark_agent_removing, ref)).found


async def test_wait_agent_installed_reports_failures_and_deadline(api, api_assisted, kit):
    ref = AgentRef(namespace=api.ns, name="host-a")
    api.agent("host-a", kit.random_macs())
    run = kit.run()
    task = asyncio.create_task(
        run(api_assisted.wait_agent_installed, WaitAgentInstalledInput(agent=ref, deadline=deadline(30)))
    )
    await run.first_heartbeat()
    api.patch(
        "Agent",
        "host-a",
        {"status": {"debugInfo": {"state": "error"}, "progress": {"currentStage": "Writing image to disk"}}},
        status=True,
    )
    with pytest.raises(ApplicationError) as failed:
        await asyncio.wait_for(task, 30)
    assert failed.value.type == HubErrorType.AGENT_INSTALL_FAILED and failed.value.non_retryable
    assert failed.value.details[0]["state"] == "error"
    assert failed.value.details[0]["stage"] == "Writing image to disk"
    assert {"state", "stage", "claimed", "bound", "installed"} <= set(run.heartbeats[0][0])

    api.agent("host-b", kit.random_macs())
    with pytest.raises(ApplicationError) as late:
        await kit.run()(
            api_assisted.wait_agent_installed,
            WaitAgentInstalledInput(agent=AgentRef(namespace=api.ns, name="host-b"), deadline=deadline(0.5)),
        )
    assert late.value.type == HubErrorType.AGENT_INSTALL_FAILED and late.value.details[0]["timeout"] is True


def fit_for_claim(api, name: str) -> None:
    """Validated and connected: with approval and the selector's labels, the provider may claim it."""
    conditions = [{"type": kind, "status": "True", "reason": kind} for kind in ("Validated", "Connected")] + [
        {"type": "Bound", "status": "False", "reason": "Unbound"}
    ]
    api.patch("Agent", name, {"status": {"conditions": conditions}}, status=True)


async def held_back(run, wait: asyncio.Task, *, by: list[str]) -> None:
    """Until the wait's heartbeats say it is past its deadline, held back by the removal of `by`."""
    async with asyncio.timeout(30):
        while not any(beat and beat[0].get("held_back_by") == by for beat in run.heartbeats):
            run.beat.clear()
            beat = asyncio.ensure_future(run.beat.wait())
            await asyncio.wait({beat, wait}, return_when=asyncio.FIRST_COMPLETED)
            beat.cancel()
            assert not wait.done(), f"the wait ended before it was held back: {wait.exception()!r}"


async def beats_until(run, wait: asyncio.Task, moment: datetime) -> None:
    """Heartbeat by heartbeat until `moment`, the wait still running at each."""
    while datetime.now(UTC) < moment:
        run.beat.clear()
        beat = asyncio.ensure_future(run.beat.wait())
        await asyncio.wait({beat, wait}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        beat.cancel()
        assert not wait.done(), f"the wait ended before {moment}: {wait.exception()!r}"


async def test_an_agent_held_back_by_a_hanging_removal_outlives_its_install_deadline(api, api_assisted, kit):
    """While a leaving Agent's Machine is held (a drain with no timeout, a PodDisruptionBudget),
    replica syncs count only claimed Agents, so a newcomer fit for its claim is not claimed.
    Failing it at its install deadline would wipe its host and queue another behind the same
    removal, about once an hour for as long as the drain hangs. It waits instead, saying what
    holds it, and has a whole window once the removal is done (kept by a retried attempt)."""
    api.nodepool("np", SELECTOR)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    api.agent("leaving", kit.random_macs(), labels=SELECTOR, approved=True)
    api.patch("Agent", "leaving", {"metadata": {"labels": {"agentMachineRef": "m-leaving"}}})
    api.patch("Agent", "leaving", {"metadata": {"labels": {"osac.openshift.io/removing": "true"}}})
    for name in ("newcomer", "late"):
        api.agent(name, kit.random_macs(), labels=SELECTOR, approved=True)
        fit_for_claim(api, name)

    def wait_input(name: str, seconds: float = 0.2, timeout: float = 3) -> WaitAgentInstalledInput:
        return WaitAgentInstalledInput(
            agent=AgentRef(namespace=api.ns, name=name),
            deadline=deadline(seconds),
            nodepool=pool,
            timeout=timedelta(seconds=timeout),
        )

    run = kit.run()
    newcomer = run.start(api_assisted.wait_agent_installed, wait_input("newcomer"))
    await held_back(run, newcomer, by=["leaving"])
    # The removal is done, the provider claims the newcomer and it installs.
    api.patch("Agent", "leaving", {"metadata": {"labels": {"agentMachineRef": None}}})
    claim(api, "newcomer")
    installed = await asyncio.wait_for(newcomer, 30)
    assert installed.agent.name == "newcomer"

    # Held again, and the removal done well before the deadline: the Agent still has a whole
    # window from when it was last seen held, not what was left of its first one.
    api.patch("Agent", "leaving", {"metadata": {"labels": {"agentMachineRef": "m-leaving"}}})
    run = kit.run()
    # The hold moves the deadline a whole window past its last recheck: 6 s leaves the retried
    # attempt seconds, not a fraction of one, to send its first heartbeat on a loaded machine.
    late_input = wait_input("late", seconds=1.5, timeout=6)
    late = run.start(api_assisted.wait_agent_installed, late_input)
    await held_back(run, late, by=["leaving"])
    api.patch("Agent", "leaving", {"metadata": {"labels": {"agentMachineRef": None}}})
    await beats_until(run, late, late_input.deadline + timedelta(seconds=0.3))
    # A retried attempt (the worker restarted) keeps the deadline the hold moved; an Agent never
    # claimed then fails at it.
    retried = kit.run()
    retried.env.info = dataclasses.replace(retried.env.info, heartbeat_details=run.heartbeats[-1])
    late.cancel()
    again = retried.start(api_assisted.wait_agent_installed, late_input)  # its deadline has passed
    beat = asyncio.ensure_future(retried.first_heartbeat())
    await asyncio.wait({beat, again}, return_when=asyncio.FIRST_COMPLETED)
    assert not again.done(), "the retried attempt failed at once: it lost the moved deadline"
    beat.cancel()
    with pytest.raises(ApplicationError) as failed:
        await asyncio.wait_for(again, 30)
    assert failed.value.type == HubErrorType.AGENT_INSTALL_FAILED and failed.value.details[0]["timeout"]

    # Without the NodePool (workers started before this), the deadline is the deadline.
    api.patch("Agent", "leaving", {"metadata": {"labels": {"agentMachineRef": "m-leaving"}}})
    api.agent("older", kit.random_macs(), labels=SELECTOR, approved=True)
    fit_for_claim(api, "older")
    with pytest.raises(ApplicationError) as older:
        await kit.run()(
            api_assisted.wait_agent_installed,
            WaitAgentInstalledInput(agent=AgentRef(namespace=api.ns, name="older"), deadline=deadline(0.2)),
        )
    assert older.value.type == HubErrorType.AGENT_INSTALL_FAILED


async def test_hand_off_refuses_an_agent_whose_mac_appeared_twice(api, api_assisted, kit):
    """A duplicate that registered after the correlation still stops the hand-off."""
    api.nodepool("np", SELECTOR)
    macs = kit.random_macs(2)
    api.agent("host-a", macs)
    agent = await kit.run()(api_assisted.wait_agent_for_macs, wait_input(api, macs))
    api.agent("phantom", [macs[1], kit.random_macs(1)[0]])
    request = HandAgentInput(agent=agent, nodepool=NodePoolRef(namespace=api.ns, name="np"), worker="w-0")
    with pytest.raises(ApplicationError) as ambiguous:
        await kit.run()(api_assisted.hand_agent_to_nodepool, request)
    assert ambiguous.value.type == HubErrorType.AMBIGUOUS_AGENT_MATCH
    assert ambiguous.value.details[0]["agents"] == ["host-a", "phantom"]
    assert api.get("Agent", "host-a")["spec"]["approved"] is False


async def test_hand_off_takes_an_extra_nic_other_hosts_share_for_no_duplicate(api, api_assisted, kit):
    """Two hosts reporting the same extra NIC (a BMC's USB NIC with one MAC on every board) are two
    hosts: the hand-off looks for another Agent reporting one of this BMI's NICs, not that one. An
    older workflow, which sends no MACs, keeps the check over every MAC of the Agent."""
    api.nodepool("np", SELECTOR)
    usb_nic = kit.random_macs(1)[0]
    macs = kit.random_macs(2)
    api.agent("host-a", [*macs, usb_nic])
    api.agent("host-b", [*kit.random_macs(2), usb_nic])
    agent = await kit.run()(api_assisted.wait_agent_for_macs, wait_input(api, macs))
    pool = NodePoolRef(namespace=api.ns, name="np")
    with pytest.raises(ApplicationError) as ambiguous:
        await kit.run()(
            api_assisted.hand_agent_to_nodepool, HandAgentInput(agent=agent, nodepool=pool, worker="w-0")
        )
    assert ambiguous.value.details[0]["agents"] == ["host-a", "host-b"]
    request = HandAgentInput(agent=agent, nodepool=pool, worker="w-0", macs=[m.upper() for m in macs])
    handed = await kit.run()(api_assisted.hand_agent_to_nodepool, request)
    assert handed.changed and api.get("Agent", "host-a")["spec"]["approved"] is True
    api.agent("phantom", [macs[1]])  # a duplicate of one of the BMI's NICs still stops it
    with pytest.raises(ApplicationError) as duplicate:
        await kit.run()(api_assisted.hand_agent_to_nodepool, request)
    assert duplicate.value.type == HubErrorType.AMBIGUOUS_AGENT_MATCH
    assert duplicate.value.details[0]["agents"] == ["host-a", "phantom"]


async def _match_held_by_a_late_agent(api, acts, kit) -> tuple[list[str], Any, asyncio.Task[Any]]:
    """A wait whose one match is held back by Agent "late", registered without its inventory yet."""
    macs = kit.random_macs(2)
    api.agent("host-a", macs)
    api.agent_registered("late")
    run = kit.run()
    task = run.start(acts.wait_agent_for_macs, wait_input(api, macs))
    await run.first_heartbeat()
    run.beat.clear()
    await asyncio.wait_for(run.beat.wait(), 30)  # a second heartbeat: still undecided
    assert not task.done()
    return macs, run, task


async def test_an_agent_without_its_inventory_yet_defers_the_match(api, api_assisted, kit):
    """One match, plus an Agent registered moments ago whose MACs are not known yet: wait for them."""
    macs, _, task = await _match_held_by_a_late_agent(api, api_assisted, kit)
    api.agent_inventory("late", [mac.upper() for mac in macs[:1]])
    with pytest.raises(ApplicationError) as ambiguous:
        await asyncio.wait_for(task, 30)
    assert ambiguous.value.type == HubErrorType.AMBIGUOUS_AGENT_MATCH


@pytest.mark.parametrize(
    ("grace", "held"),
    [
        (0.0, False),  # no grace: decided once "late" reports another host's NICs
        (1.0, False),  # decided when the grace ends, with nothing else changing
        (300.0, True),  # within the grace: held until the newcomer's inventory too
    ],
)
async def test_an_agent_registered_after_the_match_was_seen_holds_it_only_for_a_grace(
    api, api_kube, http, kit, grace: float, held: bool
):
    """The match waits for the inventories of the Agents the hub listed when it was first seen; one
    registered after holds it only for the newcomer grace: in a scale-up's burst some Agent is nearly
    always between its registration and its inventory, and each match waited for the whole burst."""
    acts = AssistedActivities(api_kube, http, heartbeat_every=0.2, newcomer_grace=grace)
    _, run, task = await _match_held_by_a_late_agent(api, acts, kit)
    api.agent_registered("later")
    api.agent_inventory("late", kit.random_macs(1))  # another host's
    if held:
        for _ in range(3):  # several looks later, still undecided
            run.beat.clear()
            await asyncio.wait_for(run.beat.wait(), 30)
        assert not task.done()
        api.agent_inventory("later", kit.random_macs(1))
    match = await asyncio.wait_for(task, 30)
    assert match.name == "host-a"


async def test_a_leaving_agents_machine_goes_before_a_newcomer_is_counted(api, api_hub_acts, kit):
    """CAPI deletes a Machine only when Machines exceed replicas: counting a newcomer while another
    Agent is leaving would leave replicas unchanged and both stuck. The removal goes first."""
    api.nodepool("np", SELECTOR)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    for name in ("leaving", "staying", "newcomer"):
        api.agent(name, kit.random_macs(), labels=SELECTOR, approved=True)
    for name in ("leaving", "staying"):  # both run on a Machine
        api.patch("Agent", name, {"metadata": {"labels": {"agentMachineRef": f"m-{name}"}}})
    api.patch("NodePool", "np", {"spec": {"replicas": 2}})
    api.patch("Agent", "leaving", {"metadata": {"labels": {"osac.openshift.io/removing": "true"}}})

    first = await kit.run()(api_hub_acts.sync_nodepool_replicas, pool)
    assert (first.replicas, first.agents, first.waiting_for_removal) == (1, ["staying"], ["leaving"])
    assert api.get("NodePool", "np")["spec"]["replicas"] == 1

    # The provider released the leaving Agent's Machine: now the newcomer counts.
    api.patch("Agent", "leaving", {"metadata": {"labels": {"agentMachineRef": None}}})
    second = await kit.run()(api_hub_acts.sync_nodepool_replicas, pool)
    assert (second.replicas, second.agents, second.waiting_for_removal) == (2, ["newcomer", "staying"], [])


def _unbind_input(api, agent: str, pool: NodePoolRef) -> UnbindAgentInput:
    order = OrderRef(namespace=api.ns, name="order-1")
    return UnbindAgentInput(
        agent=AgentRef(namespace=api.ns, name=agent),
        nodepool=pool,
        deadline=deadline(30),
        infraenv=InfraEnvRef.for_order(order),
        order=order,
    )


async def test_an_unbind_retried_after_the_host_went_to_another_slot_leaves_its_agent_alone(
    api, api_assisted, kit
):
    """A leaving worker's unbind deleted its Agent and was retried (its attempt timed out); the host,
    lost and given to another slot meanwhile, registered again under the same name and was handed to
    that slot. The retry withdrew that Agent's approval, lowered the count and deleted it."""
    api.nodepool("np", SELECTOR, replicas=1)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    api.agent(
        "host-1", kit.random_macs(), labels={**SELECTOR, WORKER_LABEL: "order-1-worker-1"}, approved=True
    )
    retried = _unbind_input(api, "host-1", pool).model_copy(update={"worker": "order-1-worker-0"})
    released = await kit.run()(api_assisted.unbind_agent, retried)
    assert released.kept == ["host-1"] and released.deleted == []
    agent = api.get("Agent", "host-1")
    assert agent is not None and agent["spec"]["approved"] is True
    assert api.get("NodePool", "np")["spec"]["replicas"] == 1


async def test_an_unbind_that_finds_its_agent_gone_marks_only_a_machine_of_its_own_cluster(
    api, api_assisted, kit
):
    """An Agent is named after its host in every order's namespace. An unbind that finds its Agent
    gone (retried after its first attempt deleted it) looks for the worker's Machine by providerID
    only where its NodePool keeps Machines: the NodePool's namespace and its hosted control plane's.
    The host, wiped and installed in another cluster meanwhile, has a Machine of the same providerID
    there, which is never marked for deletion (found by review: the whole hub was listed)."""
    api.nodepool("np", SELECTOR, replicas=1)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    for hosted_control_plane in (f"{api.ns}-cluster", f"{api.ns}-elsewhere"):
        new_namespace(api.http, hosted_control_plane)
    ours = machine(api, "np-abcde", "host-a", namespace=f"{api.ns}-cluster")  # clusterName "cluster"
    theirs = machine(api, "np-fghij", "host-a", namespace=f"{api.ns}-elsewhere")
    await kit.run()(api_assisted.unbind_agent, _unbind_input(api, "host-a", pool))

    def marked(obj: dict) -> bool:
        m = api.get("Machine", obj["metadata"]["name"], namespace=obj["metadata"]["namespace"])
        return (m["metadata"].get("annotations") or {}).get("cluster.x-k8s.io/delete-machine") == "true"

    assert marked(ours)
    assert not marked(theirs)


async def test_an_empty_answer_from_the_hub_is_taken_for_no_object_and_no_list(api, api_kube, kit):
    """A proxy answering a read with 200 and nothing: taken for an empty list, the NodePool's count
    went down to the Agents it did not list (0: every Machine removed), and taken for an object, an
    Agent was judged unclaimed (found by review). It is a retryable protocol error."""
    api.nodepool("np", SELECTOR, replicas=1)
    api.agent("host-a", kit.random_macs(), labels={**SELECTOR, WORKER_LABEL: "w-0"}, approved=True)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    for verb, resource in (("list", "agents"), ("get", "agents")):
        api.set_faults({"errors": [{"code": 200, "verbs": [verb], "resources": [resource]}]})
        try:
            with pytest.raises(ApplicationError) as empty:
                if verb == "list":
                    await sync_replicas_now(api_kube, pool)
                else:
                    await api_kube.get(AGENTS, api.ns, "host-a")
        finally:
            api.clear_faults()
        assert empty.value.type == HubErrorType.PROTOCOL and not empty.value.non_retryable
        assert "response is empty" in empty.value.message
    assert api.get("NodePool", "np")["spec"]["replicas"] == 1
    # The twin answers so only reads: a write refused with a 200 would tell of a change never made.
    for verbs in ([], ["delete"]):
        with pytest.raises(httpx.HTTPStatusError):
            api.set_faults({"errors": [{"code": 200, "verbs": verbs}]})


async def test_an_unclaimed_agent_loses_its_approval_before_the_replicas_go_down(api, api_assisted, kit):
    """A worker scaled down after its hand-off but before the provider claimed its Agent: the Agent
    is withdrawn (approval off, by a compare-and-swap) before the NodePool's count goes down. The
    provider claims only approved Agents and knows nothing of our removal label: a Machine CAPI
    keeps could otherwise claim it after the count went down (found by review)."""
    api.nodepool("np", SELECTOR, replicas=2)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    api.agent("staying", kit.random_macs(), labels=SELECTOR, approved=True)
    claim(api, "staying")
    api.agent("leaving", kit.random_macs(), labels=SELECTOR, approved=True)  # handed, never claimed
    unbind = _unbind_input(api, "leaving", pool)
    # The Agent outlives the unbind (its delete refused), so what was done to it can be seen.
    api.set_faults({"errors": [{"code": 500, "verbs": ["delete"], "resources": ["agents"]}]})
    try:
        with pytest.raises(ApplicationError):
            await kit.run()(api_assisted.unbind_agent, unbind)
    finally:
        api.clear_faults()
    leaving = api.get("Agent", "leaving")
    assert leaving is not None and leaving["spec"]["approved"] is False
    assert api.get("NodePool", "np")["spec"]["replicas"] == 1
    assert api.get("Agent", "staying")["spec"]["approved"] is True  # a claimed Agent is left as it is

    await kit.run()(api_assisted.unbind_agent, unbind)
    assert api.get("Agent", "leaving") is None


async def test_an_agent_its_machine_let_go_loses_its_approval_before_newcomers_are_counted(
    api, api_assisted, kit
):
    """Once the provider has let the leaving Agent go, the replicas are synced again for the
    newcomers held back by the removal. The Agent, unbound, approved and still labelled, would be
    fit for their Machines' claims until it is deleted: its approval goes first (found by review)."""
    api.nodepool("np", SELECTOR, replicas=1)
    pool = NodePoolRef(namespace=api.ns, name="np", agent_namespace=api.ns)
    api.agent("leaving", kit.random_macs(), labels=SELECTOR, approved=True)
    claim(api, "leaving")
    unbind = _unbind_input(api, "leaving", pool)
    api.set_faults({"errors": [{"code": 500, "verbs": ["delete"], "resources": ["agents"]}]})
    try:
        run = kit.run()
        task = run.start(api_assisted.unbind_agent, unbind)
        await run.first_heartbeat()  # waiting for the unbind
        assert api.get("Agent", "leaving")["spec"]["approved"] is True  # claimed: left as it is
        # The provider lets it go: its Machine deleted, the host unbound.
        api.patch(
            "Agent",
            "leaving",
            {"metadata": {"labels": {"agentMachineRef": None}}, "spec": {"clusterDeploymentName": None}},
        )
        api.patch(
            "Agent",
            "leaving",
            {
                "status": {
                    "debugInfo": {"state": "known-unbound"},
                    "conditions": [{"type": "Bound", "status": "False", "reason": "Unbound"}],
                }
            },
            status=True,
        )
        with pytest.raises(ApplicationError):
            await asyncio.wait_for(task, 30)  # its delete refused, so what was done can be seen
    finally:
        api.clear_faults()
    assert api.get("Agent", "leaving")["spec"]["approved"] is False


async def test_a_stale_registration_is_deleted_on_the_version_judged(api, api_assisted, kit):
    """The host's stale registrations are deleted on the version they were judged on: an Agent that
    changed since the list (a hand-off landing meanwhile) is read again and judged afresh, never
    deleted on the stale look (found by review). A conflict is no failure of the release."""
    macs = kit.random_macs()
    api.agent("stale", macs)
    api.agent("handed", macs, labels=SELECTOR, approved=True)
    order = OrderRef(namespace=api.ns, name="order-1")
    stale = ReleaseStaleAgentsInput(infraenv=InfraEnvRef.for_order(order), order=order, macs=macs)
    # The delete answered 409 once, as when the Agent changed since it was listed.
    api.set_faults({"errors": [{"code": 409, "verbs": ["delete"], "resources": ["agents"], "limit": 1}]})
    try:
        released = await kit.run()(api_assisted.release_stale_agents, stale)
    finally:
        api.clear_faults()
    assert (released.deleted, released.kept) == (["stale"], ["handed"])
    assert api.get("Agent", "stale") is None and api.get("Agent", "handed") is not None


async def test_the_sweep_after_a_wipe_takes_only_registrations_from_before_the_list(
    api, api_assisted, kit, monkeypatch
):
    """After the wipe the host may be another BMI's and register for it: only Agents the hub created
    and last changed by the second the order's BMIs were listed without the host are the released
    host's, and only while that list is fresh."""
    macs = kit.random_macs()
    agent = api.agent("late", macs)
    created = datetime.fromisoformat(agent["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    order = OrderRef(namespace=api.ns, name="order-1")

    def sweep(listed_at: datetime) -> ReleaseWipedHostAgentsInput:
        return ReleaseWipedHostAgentsInput(
            infraenv=InfraEnvRef.for_order(order), order=order, macs=macs, listed_at=listed_at
        )

    release = api_assisted.release_wiped_host_agents
    after_the_list = await kit.run()(release, sweep(created - timedelta(seconds=1)))
    assert after_the_list.deleted == after_the_list.kept == [] and api.get("Agent", "late") is not None
    with monkeypatch.context() as stale:
        stale.setattr(assisted, "WIPED_HOST_LIST_FRESH_S", 0.0)
        too_late = await kit.run()(release, sweep(created))
    assert too_late.deleted == [] and api.get("Agent", "late") is not None
    # The host registered again into an existing Agent (given to another BMI since): the Agent keeps
    # its creation time, but its conditions changed after the list.
    reused = api.agent("reused", macs)
    later = {"type": "Bound", "status": "False", "lastTransitionTime": "2999-01-01T00:00:00Z"}
    api.patch("Agent", "reused", {"status": {"conditions": [later]}}, status=True)
    reused_at = datetime.fromisoformat(reused["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    # Created in the second of the list: taken for the released host's.
    swept = await kit.run()(release, sweep(max(created, reused_at)))
    assert swept.deleted == ["late"] and api.get("Agent", "late") is None
    assert api.get("Agent", "reused") is not None


def _cache_missed_deletion(kube: HubKube, obj: dict[str, Any]) -> None:
    """The Agent informer's cache as a lost DELETED event leaves it until the next re-list."""
    kube.informer(AGENTS)._apply({"type": "ADDED", "object": obj})


def _cache_missed_creation(kube: HubKube, obj: dict[str, Any], seen_until: dict[str, Any]) -> None:
    """The Agent informer's cache as a lost ADDED event leaves it: without the object, and behind
    the hub since `seen_until` (the last object it did see)."""
    informer = kube.informer(AGENTS)
    informer._store((obj["metadata"]["namespace"], obj["metadata"]["name"]), None)
    informer._resource_version = seen_until["metadata"]["resourceVersion"]


async def _cached(kube: HubKube, namespace: str, name: str, present: bool = True) -> None:
    informer = kube.informer(AGENTS)
    await informer.wait(
        lambda: (informer.get(namespace, name) is not None) == present or None, tick_seconds=0.1
    )


async def test_an_ambiguity_only_the_cache_shows_is_decided_on_a_fresh_list(api, api_assisted, api_kube, kit):
    """Two Agents with the host's MAC in a lagging cache, one of them deleted on the hub: an
    ambiguity is final (the host is given up and wiped), so it is never concluded from the cache
    alone: the fresh list shows one Agent, and that one is the match (found by review)."""
    macs = kit.random_macs()
    old = api.agent("old", macs)
    api.agent("new", macs)
    await _cached(api_kube, api.ns, "new")
    api.delete("Agent", "old")
    await _cached(api_kube, api.ns, "old", present=False)
    _cache_missed_deletion(api_kube, old)
    found = await asyncio.wait_for(kit.run()(api_assisted.wait_agent_for_macs, wait_input(api, macs[:1])), 30)
    assert found.name == "new"


async def test_a_cache_the_fresh_list_overrules_is_not_listed_in_a_loop(api, api_assisted, api_kube, kit):
    """The lagging cache shows one match; the fresh list shows an Agent just registered without its
    inventory too, so the match waits (the ambiguity guard). The wait asks the hub again once a
    tick, heartbeating, and ends at its deadline: it listed every 0.2 s, never heartbeated and
    never reached its deadline (found by review)."""
    macs = kit.random_macs()
    registered = api.agent("registered", macs)
    fresh = api.create(
        "Agent",
        {
            "metadata": {"name": "just-registered", "labels": {INFRAENV_LABEL: "order-1-infraenv"}},
            "spec": {"approved": False, "role": ""},
        },
    )
    await _cached(api_kube, api.ns, "just-registered")
    _cache_missed_creation(api_kube, fresh, seen_until=registered)
    lists = api_kube.stats.requests["list"]
    run = kit.run()
    with pytest.raises(ApplicationError) as timed_out:
        await asyncio.wait_for(
            run(api_assisted.wait_agent_for_macs, wait_input(api, macs[:1], seconds=2)), 30
        )
    assert timed_out.value.type == HubErrorType.AGENT_REGISTRATION_TIMEOUT
    assert run.heartbeats  # it heartbeat while the hub and its cache disagreed
    assert api_kube.stats.requests["list"] - lists <= 15  # once a tick (0.2 s) at most, for 2 s
