"""The hub activities' contracts: names, payloads through Temporal's pydantic converter, MAC spelling."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from temporalio import activity
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.workflows import WorkflowActivities
from contracts.activities import HubActivity
from contracts.hub import (
    AgentRef,
    Condition,
    ConditionStatus,
    EventInput,
    EventReason,
    HandAgentInput,
    HubErrorType,
    InfraEnvRef,
    NodePoolRef,
    OrderFacts,
    PublishStatusInput,
    ReplicaSync,
    WaitAgentInput,
    normalize_mac,
)
from contracts.refs import ClusterReference, NetworkAttachmentRef, OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerStatus


def test_every_hub_activity_is_implemented_once(lab_assisted, lab_hub_acts):
    fns = lab_assisted.all() + lab_hub_acts.all() + WorkflowActivities().all()
    names = [str(activity._Definition.must_from_callable(fn).name) for fn in fns]
    assert sorted(names) == sorted(a.value for a in HubActivity)


def test_failure_reasons_and_error_types_agree():
    for name in (
        "AMBIGUOUS_AGENT_MATCH",
        "AGENT_REGISTRATION_TIMEOUT",
        "AGENT_INSTALL_FAILED",
        "AGENT_UNBINDING_TIMEOUT",
    ):
        assert HubErrorType[name].value == FailureReason[name].value
    assert HubErrorType.IGNITION_TOO_LARGE.value == FailureReason.DISCOVERY_IGNITION_TOO_LARGE.value


ORDER = OrderRef(namespace="tenant-a", name="order-1")
SAMPLES = [
    WaitAgentInput(
        infraenv=InfraEnvRef.for_order(ORDER),
        order=ORDER,
        macs=["AA-BB-CC-DD-EE-01"],
        deadline=datetime(2026, 1, 1, tzinfo=UTC),
    ),
    HandAgentInput(
        agent=AgentRef(namespace="tenant-a", name="host-1"),
        nodepool=NodePoolRef(namespace="tenant-a", name="nodepool-order-1-small", agent_namespace="tenant-a"),
        worker="order-1-worker-0",
        hostname="order-1-worker-0",
    ),
    PublishStatusInput(
        order=ORDER,
        workers=[
            WorkerStatus(
                node_set="small",
                name="order-1-worker-0",
                phase=WorkerPhase.FAILED,
                last_failure_reason=FailureReason.AGENT_INSTALL_FAILED,
                last_failure_time=datetime(2026, 1, 1, tzinfo=UTC),
            )
        ],
        desired=1,
        current=1,
        ready=0,
        conditions=[
            Condition(type="WorkersFailed", status=ConditionStatus.TRUE, reason="ProvisioningFailed")
        ],
    ),
    EventInput(order=ORDER, reason=EventReason.WORKER_READY, message="ready", key="k"),
    OrderFacts(
        order=ORDER,
        uid="u",
        network_attachment=NetworkAttachmentRef(subnet="s", security_groups=("a", "b")),
        cluster_reference=ClusterReference(namespace="n", hosted_cluster_name="h"),
    ),
    ReplicaSync(nodepool=NodePoolRef(namespace="n", name="p"), replicas=3, agents=["a", "b", "c"]),
]


@pytest.mark.parametrize("value", SAMPLES, ids=lambda v: type(v).__name__)
def test_payloads_round_trip_through_the_pydantic_converter(value):
    converter = pydantic_data_converter.payload_converter
    payloads = converter.to_payloads([value])
    assert converter.from_payloads(payloads, [type(value)]) == [value]


@pytest.mark.parametrize(
    "spelling",
    ["0A:1B:2C:3D:4E:5F", "0a-1b-2c-3d-4e-5f", "0a1b.2c3d.4e5f", "0A1B2C3D4E5F", " 0a:1b:2c:3d:4e:5f "],
)
def test_mac_spellings_normalise(spelling):
    assert normalize_mac(spelling) == "0a:1b:2c:3d:4e:5f"


def test_an_infiniband_address_normalises_like_an_ethernet_one():
    ipoib = "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:9b:5e:21"
    assert normalize_mac(ipoib.upper().replace(":", "-")) == ipoib
    assert normalize_mac(ipoib.replace(":", "")) == ipoib


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "0a:1b:2c:3d:4e",
        "zz:1b:2c:3d:4e:5f",
        "0a:1b:2c:3d:4e:5f:00",
        "02:42:ac:ff:fe:11:00:02",  # EUI-64: no server NIC an Agent reports
        "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:9b:5e",  # 19 bytes
    ],
)
def test_malformed_macs_are_rejected(bad):
    with pytest.raises(ValueError):
        normalize_mac(bad)


def test_an_order_name_too_long_for_its_derived_names_is_named_as_the_problem():
    """The NodePool (`nodepool-<order>-<type>`, OSAC's convention), InfraEnv and worker names are
    label values or DNS labels: an order whose name makes one longer than 63 characters is refused."""
    assert OrderRef(namespace="ns", name="o" * 42).long_name_problem("bm-standard", 99) is None  # 63
    problem = OrderRef(namespace="ns", name="o" * 43).long_name_problem("bm-standard", 0)
    assert problem is not None and problem.startswith("order.name: 'oooo")
    assert "its NodePool would be named 'nodepool-" in problem and "64 characters, over the 63" in problem
    # A short instance type leaves the NodePool room; the workers' names run out first.
    problem = OrderRef(namespace="ns", name="o" * 52).long_name_problem("a", 1000)
    assert problem is not None and "its workers (BMIs, hostnames) would be named" in problem
    assert OrderRef(namespace="ns", name="o" * 52).long_name_problem("a", 999) is None
