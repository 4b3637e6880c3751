"""A scale-down that cancels a worker's Agent wait after the wait handed the Agent to the NodePool
but before the workflow heard which Agent it was (WorkerRevision.AGENT_HANDED_IN_WAIT): the release
must find the Agent by its slot's mark and unbind it like a Ready worker's. Deleting it, or keeping
it as another worker's, would leave a bound host, its Machine and a NodePool count behind."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from activities.assisted import AssistedActivities
from contracts.activities import HubActivity
from contracts.hub import AgentHandOff, WaitAndHandAgentInput
from contracts.workflows import worker_workflow_id
from tests.workflows.stack import Stack, eventually, fast_policy, running_stack, scheduled_activities
from worker.main import build_workers, open_backends

NODEPOOLS = "/apis/hypershift.openshift.io/v1beta1/nodepools"


class HandsThenHolds(AssistedActivities):
    """The real wait and hand-off, after which the activity holds on as if the scale-down's
    cancellation had reached it just then, so the workflow never learns the Agent's name."""

    handed = asyncio.Event()

    @activity.defn(name=HubActivity.WAIT_AGENT_AND_HAND.value)
    async def wait_agent_and_hand(self, input: WaitAndHandAgentInput) -> AgentHandOff:
        await super().wait_agent_and_hand(input)
        self.handed.set()
        while True:
            activity.heartbeat()
            await asyncio.sleep(0.2)


@pytest.fixture
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    # The cancellation reaches the held wait with a heartbeat's answer, and the SDK sends a wait's
    # heartbeats at most every 80 % of its heartbeat timeout: a short one brings it within seconds.
    policy = fast_policy(wait_heartbeat_timeout=timedelta(seconds=3))
    async with running_stack(
        temporal_env.client, tmp_path_factory.mktemp("handed"), policy=policy, in_process_worker=False
    ) as running:
        async with open_backends(running.settings) as backends:
            backends.assisted = HandsThenHolds(backends.kube, backends.ignition_http)
            async with contextlib.AsyncExitStack() as workers:
                for worker in build_workers(running.client, running.settings, backends):
                    await workers.enter_async_context(worker)
                yield running


async def _nodepool_replicas(stack: Stack, name: str) -> list[Any]:
    response = await stack.hub_http.get(NODEPOOLS)
    response.raise_for_status()
    return [np["spec"].get("replicas") for np in response.json()["items"] if np["metadata"]["name"] == name]


async def test_an_agent_handed_by_a_cancelled_wait_is_unbound_and_deleted(stack: Stack) -> None:
    order = await stack.create_order({"bm-standard": 1})
    await stack.apply(order, {"bm-standard": 1})
    await asyncio.wait_for(HandsThenHolds.handed.wait(), 120)
    nodepool = order.nodepool_name("bm-standard")

    async def claimed() -> bool:
        agents = await stack.agents(order.namespace)
        return len(agents) == 1 and bool(agents[0]["spec"].get("clusterDeploymentName"))

    # The provider takes the handed Agent as it would any: bound, with a Machine and a count of one.
    await eventually(claimed, "the handed Agent bound to the hosted cluster")
    assert await _nodepool_replicas(stack, nodepool) == [1]

    await stack.apply(order, {"bm-standard": 0})
    handle = stack.client.get_workflow_handle(worker_workflow_id(order, order.worker_name(0)))
    await asyncio.wait_for(handle.result(), 180)

    assert await stack.agents(order.namespace) == []
    assert await _nodepool_replicas(stack, nodepool) == [0]
    assert await stack.bmis(order) == []
    assert await stack.audit_violations() == []
    events = (await handle.fetch_history()).events
    cancelled = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED]
    scheduled = scheduled_activities(events)
    assert len(cancelled) == 1
    release = scheduled.index(HubActivity.RELEASE_AGENT.value)
    assert scheduled[release + 1] == HubActivity.UNBIND_AGENT.value, scheduled
    await stack.decommission_and_wait(order)
