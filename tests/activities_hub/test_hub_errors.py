"""The hub wrapper's error taxonomy where it decides a host's fate: which 404 says an object is gone,
and which refusals (401/403) are retried rather than failing an attempt that holds a host."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio import workflow
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from activities.assisted import AssistedActivities
from activities.kube import AGENTS, CLUSTER_ORDERS, HubApiError, HubAuthError, HubKube, HubNotFound, Resource
from contracts.activities import HubActivity
from contracts.hub import (
    AgentRef,
    HandAgentInput,
    HubErrorType,
    NodePoolRef,
    WaitAgentInstalledInput,
    WaitAgentUnboundInput,
)
from contracts.refs import OrderRef
from lab.hub.kubeconfig import kubeconfig
from tests.workflows.stack import eventually

SELECTOR = {"osac.openshift.io/clusterorder": "order-1", "osac.openshift.io/resource_class": "small"}
# A kind the hub does not serve (yet): its CRD being installed again, say.
UNSERVED = Resource("agent-install.openshift.io", "v1beta1", "agentreplicas", "AgentReplica")


def _deadline(seconds: float = 120) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def _retryable_404(err: BaseException) -> None:
    assert isinstance(err, HubApiError), repr(err)
    assert not isinstance(err, HubNotFound) and not err.non_retryable, err
    assert err.type == HubErrorType.UNAVAILABLE and err.code == 404, err


def _claimed(api: Any, name: str, *, installed: bool = False) -> None:
    """Claimed by a Machine of the NodePool, bound, and (`installed`) joined."""
    api.patch(
        "Agent",
        name,
        {
            "metadata": {"labels": {"agentMachineRef": f"m-{name}"}},
            "spec": {"clusterDeploymentName": {"name": "cluster", "namespace": api.ns}},
        },
    )
    conditions = [{"type": "Bound", "status": "True", "reason": "Bound"}]
    if installed:
        conditions.append({"type": "Installed", "status": "True", "reason": "InstallationCompleted"})
    api.patch(
        "Agent",
        name,
        {"status": {"debugInfo": {"state": "added-to-existing-cluster"}, "conditions": conditions}},
        status=True,
    )


async def test_only_the_objects_own_notfound_says_it_is_gone(api, api_kube):
    """A path the hub does not serve answers 404 with a Status whose details name nothing: never
    "gone" (no None, no "already deleted"), retried; a list or watch is never "gone" either. A real
    object's NotFound names it, and still means gone."""
    with pytest.raises(HubApiError) as read:
        await api_kube.get_optional(UNSERVED, api.ns, "x")
    _retryable_404(read.value)
    with pytest.raises(HubApiError) as deleted:
        await api_kube.delete(UNSERVED, api.ns, "x")
    _retryable_404(deleted.value)
    with pytest.raises(HubApiError) as listed:
        await api_kube.list(UNSERVED, api.ns)
    _retryable_404(listed.value)
    assert "not the object's own NotFound" in str(read.value)

    await api_kube.create(CLUSTER_ORDERS, api.ns, {"metadata": {"name": "o"}, "spec": {"templateID": "t"}})
    assert await api_kube.delete(CLUSTER_ORDERS, api.ns, "o") is True
    assert await api_kube.delete(CLUSTER_ORDERS, api.ns, "o") is False  # its own NotFound: gone
    assert await api_kube.get_optional(CLUSTER_ORDERS, api.ns, "o") is None
    with pytest.raises(HubNotFound) as missing:
        await api_kube.get(CLUSTER_ORDERS, api.ns, "o")
    assert missing.value.non_retryable and missing.value.type == HubErrorType.NOT_FOUND
    # A create can only miss its namespace, and that NotFound names the namespace.
    with pytest.raises(HubNotFound):
        await api_kube.create(
            CLUSTER_ORDERS, "no-such-ns", {"metadata": {"name": "o"}, "spec": {"templateID": "t"}}
        )


async def test_a_404_page_never_ends_a_wait_as_if_the_agent_were_gone(api, api_kube, api_assisted, kit):
    """A plain 404 page (a proxy in front of the hub) on an Agent that is there: the release's wait
    must not report it gone (the teardown would wipe a host whose node was never drained), nor the
    install wait fail it (the host wiped); both are retried, and the Agent is read once the page
    goes."""
    api.agent("host-a", kit.random_macs())
    _claimed(api, "host-a")
    ref = AgentRef(namespace=api.ns, name="host-a")
    api.set_faults(
        {
            "errors": [
                {"code": 404, "verbs": ["get", "delete"], "resources": ["agents"], "users": [kit.worker_user]}
            ]
        }
    )
    try:
        with pytest.raises(HubApiError) as read:
            await api_kube.get_optional(AGENTS, api.ns, "host-a")
        _retryable_404(read.value)
        with pytest.raises(HubApiError) as deleted:
            await api_kube.delete(AGENTS, api.ns, "host-a")
        _retryable_404(deleted.value)
        with pytest.raises(ApplicationError) as unbound:
            await kit.run()(
                api_assisted.wait_agent_unbound, WaitAgentUnboundInput(agent=ref, deadline=_deadline())
            )
        _retryable_404(unbound.value)
        with pytest.raises(ApplicationError) as installed:
            await kit.run()(
                api_assisted.wait_agent_installed, WaitAgentInstalledInput(agent=ref, deadline=_deadline())
            )
        _retryable_404(installed.value)
    finally:
        api.clear_faults()
    assert api.get("Agent", "host-a") is not None
    assert (await api_kube.get_optional(AGENTS, api.ns, "host-a")) is not None


@workflow.defn(sandboxed=False)
class CallUntilDone:
    """One activity by name, retried without end as the workflows' calls are (only faster)."""

    @workflow.run
    async def run(self, name: str, arg: dict[str, Any]) -> dict[str, Any]:
        result = await workflow.execute_activity(
            name,
            arg,
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=1)
            ),
        )
        return dict(result)


async def _retried(handle: WorkflowHandle[Any, Any]) -> Any:
    """The pending activity once a failed attempt was retried (its last failure shown); the workflow
    must still be running."""
    description = await handle.describe()
    if description.status != WorkflowExecutionStatus.RUNNING:
        raise AssertionError(f"the workflow ended ({description.status}) instead of retrying")
    for pending in description.raw_description.pending_activities:
        if pending.attempt >= 2 and pending.last_failure.message:
            return pending
    return None


def _call(client: Any, queue: str, name: HubActivity, arg: Any) -> Any:
    return client.start_workflow(
        CallUntilDone.run,
        args=[name.value, arg.model_dump(mode="json")],
        id=f"call-{name.value}-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )


async def test_a_refusal_in_an_activity_holding_a_host_is_retried_visibly(
    temporal_env, api, api_assisted, api_hub_acts, kit
):
    """A 403 (a role a rollout forgot) while the worker's host is allocated: the hand-off is retried,
    the pending activity naming the 403, and goes through once the permission is back, instead of
    failing the attempt (BMI deleted, healthy host wiped). The order's own read still fails at
    once: its workflow shows that as RequestRefused and asks again later."""
    client = temporal_env.client
    queue = f"hub-errors-{uuid.uuid4().hex[:8]}"
    api.nodepool("np", SELECTOR)
    api.order()
    api.agent("host-a", kit.random_macs())
    hand = HandAgentInput(
        agent=AgentRef(namespace=api.ns, name="host-a"),
        nodepool=NodePoolRef(namespace=api.ns, name="np"),
        worker="order-1-worker-0",
    )
    api.set_faults(
        {"errors": [{"code": 403, "resources": ["nodepools", "clusterorders"], "users": [kit.worker_user]}]}
    )
    try:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[CallUntilDone],
            activities=api_assisted.all() + api_hub_acts.all(),
        ):
            handle = await _call(client, queue, HubActivity.HAND_AGENT_TO_NODEPOOL, hand)
            pending = await eventually(lambda: _retried(handle), "the hand-off retried", timeout=60)
            assert pending.activity_type.name == HubActivity.HAND_AGENT_TO_NODEPOOL
            assert pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_UNSPECIFIED
            failure = pending.last_failure
            assert failure.application_failure_info.type == HubErrorType.FORBIDDEN
            assert not failure.application_failure_info.non_retryable
            assert "HTTP 403" in failure.message and "retried" in failure.message

            with pytest.raises(WorkflowFailureError) as refused:
                read = await _call(
                    client, queue, HubActivity.READ_ORDER, OrderRef(namespace=api.ns, name="order-1")
                )
                await read.result()
            cause = refused.value.cause
            assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
            assert cause.cause.type == HubErrorType.FORBIDDEN and cause.cause.non_retryable

            api.clear_faults()
            handed = await handle.result()
    finally:
        api.clear_faults()
    assert handed["changed"] is True
    assert api.get("Agent", "host-a")["spec"]["approved"] is True


async def test_a_rotated_token_file_is_followed_and_its_401s_retried_meanwhile(
    temporal_env, api, api_hub, http, kit, tmp_path: Path
):
    """An off-hub worker's kubeconfig takes its token from a file (a mounted secret). The hub moved
    to a new token before the file did: the install wait of a worker holding a host is retried, its
    last failure naming the 401, and once the file has the new token the same client uses it."""
    config = kubeconfig(api_hub.url, "unused")
    config["users"][0]["user"] = {"tokenFile": "token"}  # relative to the kubeconfig, as kubectl reads it
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    token = tmp_path / "token"
    token.write_text("a-token-the-hub-no-longer-takes")
    kube = HubKube.from_kubeconfig(str(tmp_path / "kubeconfig"))
    api.agent("host-a", kit.random_macs())
    _claimed(api, "host-a", installed=True)
    ref = AgentRef(namespace=api.ns, name="host-a")
    client = temporal_env.client
    queue = f"hub-errors-{uuid.uuid4().hex[:8]}"
    try:
        # Outside a host-holding activity a refusal stays final.
        with pytest.raises(HubAuthError) as refused:
            await kube.get(AGENTS, api.ns, "host-a")
        assert refused.value.non_retryable and refused.value.type == HubErrorType.UNAUTHORIZED
        async with Worker(
            client,
            task_queue=queue,
            workflows=[CallUntilDone],
            activities=AssistedActivities(kube, http, heartbeat_every=0.2).all(),
        ):
            wait = WaitAgentInstalledInput(agent=ref, deadline=_deadline())
            handle = await _call(client, queue, HubActivity.WAIT_AGENT_INSTALLED, wait)
            pending = await eventually(lambda: _retried(handle), "the install wait retried", timeout=60)
            failure = pending.last_failure
            assert failure.application_failure_info.type == HubErrorType.UNAUTHORIZED
            assert not failure.application_failure_info.non_retryable and "HTTP 401" in failure.message
            token.write_text(kit.worker_token + "\n")  # a trailing newline, as secrets often have
            installed = await asyncio.wait_for(handle.result(), 60)
        assert installed["agent"] == {"namespace": api.ns, "name": "host-a"}
        assert (await kube.get(AGENTS, api.ns, "host-a"))["metadata"]["name"] == "host-a"
    finally:
        await kube.close()
