"""A wait's deadline on an informer cut off from the hub. The cache still counts as synced, but its
watch was cut and every list and watch since is refused: the deadline's verdict must come from the
hub itself, never from the blind cache. A false timeout fails the attempt and wipes a healthy host
(found by review)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from activities.assisted import AssistedActivities
from activities.kube import AGENTS, HubKube
from contracts.hub import AgentRef, HubErrorType, InfraEnvRef, WaitAgentInput, WaitAgentUnboundInput
from contracts.refs import OrderRef
from lab.hub.testing import start_hub
from tests.activities_hub.conftest import SHARED_CRD_DIR

# Every list and watch of Agents refused, every open stream cut: the informer hears nothing more.
BLIND = {
    "errors": [{"code": 500, "verbs": ["watch", "list"], "resources": ["agents"]}],
    "closeWatchesNow": True,
}


def _deadline(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


@contextlib.asynccontextmanager
async def _blind_informer(
    tmp_path: Any, api: Any, http: httpx.AsyncClient
) -> AsyncIterator[tuple[Any, AssistedActivities]]:
    """A hub of the test's own (its faults touch no other test) with a first Agent, and the Agent
    activities on a kube whose informer synced on it, then went blind."""
    hub = start_hub(tmp_path, crd_dirs=[SHARED_CRD_DIR])
    kube = HubKube.from_kubeconfig(str(hub.kubeconfig))
    try:
        with httpx.Client(base_url=hub.url, headers=hub.headers(), timeout=30.0) as client:
            own = type(api)(client, "default")
            own.agent("first", ["0a:00:00:00:00:01"])
            informer = kube.informer(AGENTS)
            await informer.wait(lambda: informer.get("default", "first"), tick_seconds=1)
            own.set_faults(BLIND)
            await informer.wait(lambda: True if not informer.connected else None, tick_seconds=0.1)
            assert informer.synced  # what the waits used to trust
            try:
                yield own, AssistedActivities(kube, http)
            finally:
                own.clear_faults()
    finally:
        await kube.close()
        hub.stop()


async def test_an_agent_registered_while_the_cache_is_blind_is_no_registration_timeout(
    tmp_path, api, http, kit
):
    """The host's Agent registers while the informer is blind. At the deadline the fresh list is
    refused too, so the wait cannot know: a retryable error, not AgentRegistrationTimeout. Once the
    hub answers, the next attempt finds the Agent."""
    async with _blind_informer(tmp_path, api, http) as (own, assisted):
        macs = kit.random_macs()
        own.agent("host-a", macs)
        order = OrderRef(namespace="default", name="order-1")
        wait = WaitAgentInput(
            infraenv=InfraEnvRef.for_order(order), order=order, macs=macs, deadline=_deadline(2)
        )
        with pytest.raises(ApplicationError) as unknown:
            await asyncio.wait_for(kit.run()(assisted.wait_agent_for_macs, wait), 60)
        assert unknown.value.type != HubErrorType.AGENT_REGISTRATION_TIMEOUT
        assert not unknown.value.non_retryable
        own.clear_faults()
        match = await asyncio.wait_for(kit.run()(assisted.wait_agent_for_macs, wait), 60)
        assert match.name == "host-a"


async def test_an_agent_unbound_while_the_cache_is_blind_is_seen_at_the_deadline(tmp_path, api, http, kit):
    """A leaving worker's Agent is released while the informer is blind: the deadline's fresh read
    sees it unbound, instead of AgentUnbindingTimeout on the cache's stale claimed copy."""
    async with _blind_informer(tmp_path, api, http) as (own, assisted):
        own.patch(
            "Agent",
            "first",
            {
                "metadata": {"labels": {"agentMachineRef": "m-first"}},
                "spec": {"clusterDeploymentName": {"name": "cluster", "namespace": "default"}},
            },
        )
        own.patch(
            "Agent",
            "first",
            {
                "status": {
                    "debugInfo": {"state": "added-to-existing-cluster"},
                    "conditions": [{"type": "Bound", "status": "True", "reason": "Bound"}],
                }
            },
            status=True,
        )
        run = kit.run()
        # The deadline's fresh read must come after the patches below: room for a loaded machine.
        wait = WaitAgentUnboundInput(agent=AgentRef(namespace="default", name="first"), deadline=_deadline(6))
        task = run.start(assisted.wait_agent_unbound, wait)
        await run.first_heartbeat()  # past its first, fresh read: claimed, so it waits
        own.patch(
            "Agent",
            "first",
            {"metadata": {"labels": {"agentMachineRef": None}}, "spec": {"clusterDeploymentName": None}},
        )
        own.patch("Agent", "first", {"status": {"debugInfo": {"state": "known-unbound"}}}, status=True)
        unbound = await asyncio.wait_for(task, 60)
        assert unbound.was_claimed and unbound.state == "known-unbound"
