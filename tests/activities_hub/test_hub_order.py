"""ClusterOrder activities: facts, cluster reference, status publication under concurrent writers,
and Events."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.exceptions import ApplicationError

from activities.hub import HubActivities, cluster_release, order_facts
from activities.kube import CLUSTER_ORDERS, HubKube
from activities.order_events import EVENT_WRITES_AT_ONCE
from contracts.hub import (
    ClusterReleaseInput,
    Condition,
    ConditionStatus,
    EventInput,
    EventReason,
    EventType,
    HubErrorType,
    ManagementState,
    PublishStatusInput,
    WaitClusterReferenceInput,
)
from contracts.refs import ClusterReference, NetworkAttachmentRef, OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerStatus
from lab.http_server import ThreadedServer
from lab.hub.kubeconfig import write_kubeconfig
from tests.held_requests import HeldRequests

REFERENCE = {
    "namespace": "hosted-ns",
    "hostedClusterName": "order-1",
    "roleBindingName": "order-1-admin",
    "serviceAccountName": "order-1-admin",
}


def ref(api, name: str = "order-1") -> OrderRef:
    return OrderRef(namespace=api.ns, name=name)


async def test_read_order_returns_non_secret_facts(api, api_hub_acts, kit):
    api.create(
        "ClusterOrder",
        {
            "metadata": {
                "name": "order-1",
                "annotations": {"osac.openshift.io/management-state": "unmanaged"},
                "finalizers": ["test.osac.openshift.io/hold"],
            },
            "spec": {
                "templateID": "ocp_4_17_small",
                "releaseImage": kit.release_image,
                "pullSecret": kit.pull_secret,
                "sshPublicKey": kit.ssh_key,
                "networkAttachment": {"subnetRef": "subnet-a", "securityGroupRefs": ["sg-1", "sg-2"]},
                "nodeRequests": [
                    {"numberOfNodes": 2, "bareMetal": {"instanceType": "small"}},
                    {"numberOfNodes": 1, "bareMetal": {"instanceType": "gpu-large"}},
                    {"numberOfNodes": 5, "bareMetal": {"instanceType": "small"}},  # duplicate
                    {"numberOfNodes": 1, "bareMetal": {"instanceType": "Not_A_Label"}},
                    {"numberOfNodes": 3, "resourceClass": "vm-class"},  # not bare metal
                ],
            },
        },
    )
    api.patch("ClusterOrder", "order-1", {"status": {"clusterReference": REFERENCE}}, status=True)
    facts = await kit.run()(api_hub_acts.read_order, ref(api))
    assert facts.uid == api.get("ClusterOrder", "order-1")["metadata"]["uid"]
    assert facts.release_image == kit.release_image
    assert facts.pull_secret_set and facts.ssh_public_key_set
    assert facts.network_attachment == NetworkAttachmentRef(
        subnet="subnet-a", security_groups=("sg-1", "sg-2")
    )
    assert [(n.name, n.instance_type, n.count) for n in facts.node_sets] == [
        ("small", "small", 2),
        ("gpu-large", "gpu-large", 1),
    ]
    assert len(facts.invalid_node_requests) == 2
    assert "nodeRequests[2]" in facts.invalid_node_requests[0]
    assert facts.cluster_reference == ClusterReference(namespace="hosted-ns", hosted_cluster_name="order-1")
    assert facts.management_state == ManagementState.UNMANAGED and facts.unmanaged
    assert not facts.deleting
    assert kit.pull_secret_marker not in kit.dumps(facts)

    api.delete("ClusterOrder", "order-1")  # held by its finalizer: being deleted
    assert (await kit.run()(api_hub_acts.read_order, ref(api))).deleting

    with pytest.raises(ApplicationError) as missing:
        await kit.run()(api_hub_acts.read_order, ref(api, "absent"))
    assert missing.value.type == HubErrorType.ORDER_NOT_FOUND and missing.value.non_retryable


async def test_a_cluster_reference_naming_no_namespace_counts_as_none(api, api_hub_acts, kit):
    """The status is open in the CRD: a hand-edited reference whose namespace is no DNS label would
    become the worker workflows' NodePool reference, which they could not build (a workflow task
    failing for good, holding the hosts; found by review). It counts as no reference yet."""
    api.order()
    for bad in ({**REFERENCE, "namespace": "Not_A_Label"}, {**REFERENCE, "hostedClusterName": "order 1"}):
        api.patch("ClusterOrder", "order-1", {"status": {"clusterReference": bad}}, status=True)
        assert (await kit.run()(api_hub_acts.read_order, ref(api))).cluster_reference is None
    # The wait says why it goes on waiting, and why it gave up.
    run = kit.run()
    soon = datetime.now(UTC) + timedelta(seconds=3)
    task = run.start(
        api_hub_acts.wait_cluster_reference, WaitClusterReferenceInput(order=ref(api), deadline=soon)
    )
    await run.first_heartbeat()
    assert run.heartbeats[0][0]["cluster_reference_invalid"] is True
    with pytest.raises(ApplicationError) as late:
        await asyncio.wait_for(task, 30)
    assert late.value.type == HubErrorType.CLUSTER_REFERENCE_TIMEOUT and "no DNS label" in late.value.message
    api.patch("ClusterOrder", "order-1", {"status": {"clusterReference": REFERENCE}}, status=True)
    facts = await kit.run()(api_hub_acts.read_order, ref(api))
    assert facts.cluster_reference == ClusterReference(namespace="hosted-ns", hosted_cluster_name="order-1")


async def test_wait_cluster_reference(api, api_hub_acts, kit):
    api.order()
    run = kit.run()
    task = run.start(api_hub_acts.wait_cluster_reference, WaitClusterReferenceInput(order=ref(api)))
    await run.first_heartbeat()
    assert not task.done()
    api.patch("ClusterOrder", "order-1", {"status": {"clusterReference": REFERENCE}}, status=True)
    reference = await asyncio.wait_for(task, 30)
    assert reference == ClusterReference(namespace="hosted-ns", hosted_cluster_name="order-1")
    assert run.heartbeats[0][0]["cluster_reference_set"] is False
    assert kit.pull_secret_marker not in kit.dumps(run.heartbeats)

    api.order("order-2")
    soon = datetime.now(UTC) + timedelta(seconds=0.5)
    with pytest.raises(ApplicationError) as late:
        await kit.run()(
            api_hub_acts.wait_cluster_reference,
            WaitClusterReferenceInput(order=ref(api, "order-2"), deadline=soon),
        )
    assert late.value.type == HubErrorType.CLUSTER_REFERENCE_TIMEOUT and late.value.non_retryable

    with pytest.raises(ApplicationError) as missing:
        await kit.run()(
            api_hub_acts.wait_cluster_reference, WaitClusterReferenceInput(order=ref(api, "absent"))
        )
    assert missing.value.type == HubErrorType.ORDER_NOT_FOUND


def pool(api, name: str, cluster: str, release: str) -> None:
    api.create(
        "NodePool",
        {
            "metadata": {"name": name},
            "spec": {
                "clusterName": cluster,
                "replicas": 0,
                "release": {"image": release},
                "platform": {"type": "Agent", "agent": {"agentLabelSelector": {"matchLabels": {"a": name}}}},
            },
        },
    )


async def test_read_cluster_release_takes_the_release_most_of_the_clusters_nodepools_run(
    api, api_hub_acts, kit
):
    cluster = ClusterReference(namespace=api.ns, hosted_cluster_name="order-1")
    read = ClusterReleaseInput(order=ref(api), cluster=cluster)
    assert (await kit.run()(api_hub_acts.read_cluster_release, read)).release_image is None  # none yet

    old, new = "quay.io/ocp-release:4.17.3-x86_64", "quay.io/ocp-release:4.18.0-x86_64"
    pool(api, "nodepool-order-1-a", "order-1", new)
    pool(api, "nodepool-order-1-b", "order-1", new)
    pool(api, "nodepool-order-1-c", "order-1", old)  # being upgraded, say
    pool(api, "nodepool-other-a", "other", old)
    pool(api, "nodepool-other-b", "other", old)  # another hosted cluster's: not counted
    found = await kit.run()(api_hub_acts.read_cluster_release, read)
    assert found.release_image == new
    assert found.nodepools == {
        "nodepool-order-1-a": new,
        "nodepool-order-1-b": new,
        "nodepool-order-1-c": old,
    }


def test_a_tie_between_releases_is_broken_the_same_way_for_every_reader() -> None:
    cluster = ClusterReference(namespace="ns", hosted_cluster_name="c")
    pools = [
        {"metadata": {"name": name}, "spec": {"clusterName": "c", "release": {"image": image}}}
        for name, image in (("p1", "r:a"), ("p2", "r:b"))
    ]
    assert cluster_release(pools, cluster).release_image == "r:b"
    assert cluster_release(list(reversed(pools)), cluster).release_image == "r:b"
    no_release = {"metadata": {"name": "p"}, "spec": {"clusterName": "c"}}
    assert cluster_release([no_release], cluster).release_image is None


def workers() -> list[WorkerStatus]:
    return [
        WorkerStatus(node_set="small", name="order-1-worker-0", resource_id="bmi-0", phase=WorkerPhase.READY),
        WorkerStatus(
            node_set="small",
            name="order-1-worker-1",
            phase=WorkerPhase.FAILED,
            attempt_count=2,
            last_failure_reason=FailureReason.AGENT_REGISTRATION_TIMEOUT,
            last_failure_message="The host did not register for installation in time; retrying.",
            last_failure_time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            next_retry_time=datetime(2026, 1, 2, 3, 9, 5, tzinfo=UTC),
        ),
    ]


def publish_input(api, **changes) -> PublishStatusInput:
    values = {
        "order": ref(api),
        "workers": workers(),
        "desired": 2,
        "current": 2,
        "ready": 1,
        "conditions": [
            Condition(type="InfraEnvReady", status=ConditionStatus.TRUE, reason="InfraEnvReady"),
            Condition(type="WorkersFailed", status=ConditionStatus.FALSE, reason="NoFailures"),
        ],
    }
    values.update(changes)
    return PublishStatusInput(**values)


async def test_publish_order_status_keeps_other_fields_under_a_concurrent_writer(api, api_hub_acts, kit):
    api.order()
    old = "2020-01-01T00:00:00Z"
    foreign = {
        "type": "ClusterAvailable",
        "status": "True",
        "reason": "AsExpected",
        "message": "",
        "lastTransitionTime": old,
    }
    api.patch(
        "ClusterOrder",
        "order-1",
        {
            "status": {
                "phase": "Progressing",
                "clusterReference": REFERENCE,
                "conditions": [
                    foreign,
                    {
                        "type": "InfraEnvReady",
                        "status": "True",
                        "reason": "Earlier",
                        "message": "",
                        "lastTransitionTime": old,
                    },
                    {
                        "type": "WorkersFailed",
                        "status": "True",
                        "reason": "ProvisioningFailed",
                        "message": "",
                        "lastTransitionTime": old,
                    },
                ],
            }
        },
        status=True,
    )
    # The first writes of the workers' user conflict, and a real writer changes status meanwhile.
    api.set_faults(
        {
            "errors": [
                {
                    "code": 409,
                    "verbs": ["patch"],
                    "resources": ["clusterorders/status"],
                    "users": [kit.worker_user],
                    "limit": 3,
                }
            ]
        }
    )
    stop = threading.Event()

    writes: list[int] = []

    def other_writer() -> None:  # another controller, writing a few times a second
        while True:
            phase = ["Progressing", "Ready"][len(writes) % 2]
            api.patch("ClusterOrder", "order-1", {"status": {"phase": phase}}, status=True)
            writes.append(1)
            if stop.wait(0.03):
                return

    writer = threading.Thread(target=other_writer, daemon=True)
    writer.start()
    try:
        result = await kit.run()(api_hub_acts.publish_order_status, publish_input(api))
    finally:
        stop.set()
        writer.join(30)
        api.clear_faults()
    assert result.order_found and result.changed and result.conflicts_retried >= 3 and writes

    order = api.get("ClusterOrder", "order-1")
    kit.validate("ClusterOrder", order)
    status = order["status"]
    assert status["phase"] in ("Progressing", "Ready")
    assert status["clusterReference"] == REFERENCE
    assert [w["name"] for w in status["workers"]] == ["order-1-worker-0", "order-1-worker-1"]
    assert status["workers"][1]["lastFailureReason"] == "AgentRegistrationTimeout"
    assert status["workers"][1]["attemptCount"] == 2 and status["workers"][0]["resourceID"] == "bmi-0"
    assert (status["desiredWorkers"], status["currentWorkers"], status["readyWorkers"]) == (2, 2, 1)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["ClusterAvailable"] == foreign
    # Same status: the transition time stays; a changed status gets a new one.
    assert conditions["InfraEnvReady"]["lastTransitionTime"] == old
    assert conditions["InfraEnvReady"]["reason"] == "InfraEnvReady"
    assert conditions["WorkersFailed"]["status"] == "False"
    assert conditions["WorkersFailed"]["lastTransitionTime"] != old

    # Publishing the same again writes nothing.
    again = await kit.run()(api_hub_acts.publish_order_status, publish_input(api))
    assert not again.changed
    assert (
        api.get("ClusterOrder", "order-1")["metadata"]["resourceVersion"]
        == order["metadata"]["resourceVersion"]
    )

    # Without conditions, only workers and counts are written; the conditions stay as they are.
    fewer = publish_input(api, conditions=[], ready=2)
    assert (await kit.run()(api_hub_acts.publish_order_status, fewer)).changed
    assert not (await kit.run()(api_hub_acts.publish_order_status, fewer)).changed
    after = api.get("ClusterOrder", "order-1")["status"]
    assert after["readyWorkers"] == 2 and after["conditions"] == status["conditions"]

    gone = await kit.run()(api_hub_acts.publish_order_status, publish_input(api, order=ref(api, "absent")))
    assert not gone.order_found


async def test_events_are_written_with_the_status_once_per_key(api, api_hub_acts, kit):
    order = api.order()
    keyed = EventInput(
        order=ref(api),
        reason=EventReason.WORKER_READY,
        message="Worker order-1-worker-0 is ready.",
        key="order-1-worker-0/attempt-1",
    )
    warning = EventInput(
        order=ref(api), reason=EventReason.WORKER_FAILED, message="A worker failed.", type=EventType.WARNING
    )
    with_events = publish_input(api).model_copy(update={"events": [keyed, warning]})
    first = await kit.run()(api_hub_acts.publish_order_status, with_events)
    # A retry of the same activity (same keys) adds no Event; an unkeyed Event is written again.
    second = await kit.run()(api_hub_acts.publish_order_status, with_events)
    assert first.changed and not second.changed
    assert first.events_queued == second.events_queued == 2
    assert await api_hub_acts.events.drain(30)
    assert (api_hub_acts.events.written, api_hub_acts.events.dropped) == (4, 0)
    events = api.items("Event")
    assert sorted(e["reason"] for e in events) == ["WorkerFailed", "WorkerFailed", "WorkerReady"]
    ready = next(e for e in events if e["reason"] == "WorkerReady")
    assert ready["type"] == "Normal" and ready["message"] == keyed.message
    involved = ready["involvedObject"]
    assert (involved["kind"], involved["name"], involved["namespace"], involved["uid"]) == (
        "ClusterOrder",
        "order-1",
        api.ns,
        order["metadata"]["uid"],
    )
    assert ready["source"]["component"] == "osac-baremetal-workers"
    absent = with_events.model_copy(update={"order": ref(api, "absent")})
    gone = await kit.run()(api_hub_acts.publish_order_status, absent)
    assert not gone.order_found and gone.events_queued == 0


async def test_failing_event_writes_never_hold_the_status_back(api, api_hub_acts, kit):
    """A hub rejecting Event writes: a few retries each, then the Event is dropped; the status is
    written and the activity succeeds (its retry would hold back every later status write)."""
    api.order()
    recorder = api_hub_acts.events
    events = [
        EventInput(order=ref(api), reason=EventReason.WORKER_READY, message=f"Worker {i} ready.", key=f"k{i}")
        for i in range(3)
    ]

    async def publish(**changes: Any) -> tuple[bool, int, int, int]:
        """The write's (changed, queued), and the Events written and dropped once it is drained."""
        written, dropped = recorder.written, recorder.dropped
        result = await kit.run()(api_hub_acts.publish_order_status, publish_input(api, **changes))
        assert await recorder.drain(30)
        return result.changed, result.events_queued, recorder.written - written, recorder.dropped - dropped

    # Four failed writes in a row: retried by the recorder, every Event written.
    api.set_faults({"errors": [{"code": 500, "verbs": ["create"], "resources": ["events"], "limit": 4}]})
    assert await publish(events=events) == (True, 3, 3, 0)
    # Every Event write fails: dropped, and the status still goes out.
    api.set_faults({"errors": [{"code": 500, "verbs": ["create"], "resources": ["events"]}]})
    try:
        assert await publish(ready=2, events=events[:1]) == (True, 1, 0, 1)
    finally:
        api.set_faults({})
    assert api.get("ClusterOrder", "order-1")["status"]["readyWorkers"] == 2
    # Refused for good: the namespace is being deleted (our finalizer holds the order, so it stays
    # Terminating), and the hub forbids new objects in it with a 403. Each Event is dropped at its
    # first refusal, not retried, and the status still goes out: a decommission's last write must
    # not wait on Events that can never be written.
    api.patch(
        "ClusterOrder", "order-1", {"metadata": {"finalizers": ["osac.openshift.io/baremetal-workers"]}}
    )
    api.http.delete(f"/api/v1/namespaces/{api.ns}").raise_for_status()
    creates = api.requests_by(kit.worker_user, "create", "events")
    assert await publish(ready=0, events=events) == (True, 3, 0, 3)
    assert api.get("ClusterOrder", "order-1")["status"]["readyWorkers"] == 0
    assert api.requests_by(kit.worker_user, "create", "events") - creates == 3  # one try each
    api.patch("ClusterOrder", "order-1", {"metadata": {"finalizers": None}})


class _SlowEventHub:
    """A hub that serves one ClusterOrder and holds every Event create a moment, counting the
    creates it holds at once."""

    def __init__(self, namespace: str, hold: float) -> None:
        self.held = HeldRequests(hold)
        self.events: list[dict[str, Any]] = []
        self.order = {
            "apiVersion": "osac.openshift.io/v1alpha1",
            "kind": "ClusterOrder",
            "metadata": {"name": "order-1", "namespace": namespace, "uid": "u-1", "resourceVersion": "1"},
            "status": {},
        }

    def app(self) -> Starlette:
        base = "/apis/osac.openshift.io/v1alpha1/namespaces/{ns}/clusterorders/{name}"
        return Starlette(
            routes=[
                Route(base, self.get_order, methods=["GET"]),
                Route(f"{base}/status", self.get_order, methods=["PATCH"]),
                Route("/api/v1/namespaces/{ns}/events", self.create_event, methods=["POST"]),
            ]
        )

    async def get_order(self, request: Request) -> JSONResponse:
        return JSONResponse(self.order)

    async def create_event(self, request: Request) -> JSONResponse:
        await self.held.wait()
        body = await request.json()
        self.events.append(body)
        return JSONResponse(body, status_code=201)


async def test_a_burst_of_events_never_holds_the_status_write(kit, tmp_path):
    """A decommission reports many workers gone in one status write: the write queues their Events
    and returns; the recorder writes them a few at once in the background (written inside the
    write, one after the other, they held the order's next status write for seconds)."""
    hub = _SlowEventHub("ns-1", hold=0.3)
    order = OrderRef(namespace="ns-1", name="order-1")
    events = [
        EventInput(order=order, reason=EventReason.WORKER_DELETED, message=f"Worker {i} gone.", key=f"k{i}")
        for i in range(4 * EVENT_WRITES_AT_ONCE)
    ]
    with ThreadedServer(hub.app()) as server:
        kube = HubKube.from_kubeconfig(str(write_kubeconfig(tmp_path / "kubeconfig", server.url, "t")))
        acts = HubActivities(kube)
        try:
            result = await kit.run()(
                acts.publish_order_status,
                PublishStatusInput(order=order, workers=[], desired=0, current=0, ready=0, events=events),
            )
            # Writing them all takes at least 4 x 0.3 s: the write did not wait for them.
            assert (result.events_queued, result.events_dropped) == (len(events), 0)
            assert hub.held.answered < len(events)
            assert await acts.events.drain(60)
        finally:
            await acts.events.close()
            await kube.close()
    assert (acts.events.written, acts.events.dropped, hub.held.answered) == (len(events), 0, len(events))
    assert 1 < hub.held.most <= EVENT_WRITES_AT_ONCE
    # Stamped when the write queued them, though written over seconds.
    assert len({e["lastTimestamp"] for e in hub.events}) == 1, hub.events[0]["lastTimestamp"]


async def test_the_cached_order_holds_no_pull_secret_even_in_kubectls_annotation(api, api_kube, kit):
    """`kubectl apply` keeps the whole applied object, pull secret included, in an annotation: the
    process's cache of ClusterOrders keeps neither that copy nor the spec's (found by review)."""
    order = api.order("order-applied")
    applied = json.dumps({"spec": order["spec"]})
    api.patch(
        "ClusterOrder",
        "order-applied",
        {
            "metadata": {
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied, "keep": "me"}
            }
        },
    )
    informer = api_kube.informer(CLUSTER_ORDERS)

    def annotated() -> dict[str, Any] | None:
        cached = informer.get(api.ns, "order-applied")
        return cached if cached and (cached["metadata"].get("annotations") or {}).get("keep") else None

    cached = await informer.wait(annotated, deadline=datetime.now(UTC) + timedelta(seconds=30))
    assert kit.pull_secret_marker not in json.dumps(cached)


def test_security_group_names_that_name_nothing_are_refused_and_repeats_dropped_silently() -> None:
    """`""` names no group (BMaaS refused every create with it): refused, naming the entry. A repeat
    adds no group and the CRD allows it (orders accepted with one stay accepted): dropped."""
    spec = {
        "networkAttachment": {"subnetRef": "subnet-a", "securityGroupRefs": ["sg-1", " ", "sg-2", "sg-1"]}
    }
    facts = order_facts(OrderRef(namespace="ns", name="o"), {"metadata": {"uid": "u"}, "spec": spec})
    assert facts.network_attachment == NetworkAttachmentRef(
        subnet="subnet-a", security_groups=("sg-1", "sg-2")
    )
    assert facts.invalid_network_attachment == [
        "networkAttachment.securityGroupRefs[1]: not a security group name"
    ]
    spec["networkAttachment"]["securityGroupRefs"] = ["sg-1", "sg-1"]
    facts = order_facts(OrderRef(namespace="ns", name="o"), {"metadata": {"uid": "u"}, "spec": spec})
    assert facts.network_attachment is not None and facts.network_attachment.security_groups == ("sg-1",)
    assert facts.invalid_network_attachment == []
