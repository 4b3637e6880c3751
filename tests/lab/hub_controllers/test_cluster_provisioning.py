"""The cluster-provisioning stand-in: namespace, NodePools per bare-metal node set, clusterReference."""

from __future__ import annotations

from typing import Any

from lab.hub_controllers.resources import AGENTS, CLUSTER_ORDERS, NAMESPACES, NODE_POOLS
from lab.hub_controllers.testing import Lab, wait_until


def _order(lab: Lab, ns: str, name: str, node_requests: list[dict[str, Any]], **metadata: Any) -> None:
    lab.client.create(
        CLUSTER_ORDERS,
        {
            "metadata": {"name": name, "namespace": ns, **metadata},
            "spec": {
                "templateID": "ocp_4_17_small",
                "releaseImage": "quay.io/openshift-release-dev/ocp-release:4.17.3-x86_64",
                "nodeRequests": node_requests,
            },
        },
    )


def _reference(lab: Lab, ns: str, name: str) -> dict[str, Any] | None:
    order = lab.client.get(CLUSTER_ORDERS, ns, name) or {}
    reference: dict[str, Any] | None = (order.get("status") or {}).get("clusterReference")
    return reference


def test_new_order_gets_a_hosted_cluster_and_node_pools_in_its_namespace(lab: Lab, ns: str) -> None:
    _order(
        lab,
        ns,
        "o1",
        [
            {"numberOfNodes": 2, "bareMetal": {"instanceType": "bm-standard"}},
            {"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-gpu"}},
            {"numberOfNodes": 3, "resourceClass": "legacy-vm"},
        ],
    )
    reference = wait_until(lambda: _reference(lab, ns, "o1"), "clusterReference")
    cluster_ns = ns
    assert reference["namespace"] == cluster_ns
    assert reference["hostedClusterName"] == "o1"
    assert lab.client.get(NAMESPACES, None, cluster_ns) is not None

    pools = {p["metadata"]["name"]: p for p in lab.client.list(NODE_POOLS, cluster_ns)}
    assert set(pools) == {"nodepool-o1-bm-standard", "nodepool-o1-bm-gpu"}  # not the non-bare-metal set
    spec = pools["nodepool-o1-bm-standard"]["spec"]
    assert spec["replicas"] == 0
    assert spec["clusterName"] == "o1"
    assert spec["platform"]["type"] == "Agent"
    assert spec["platform"]["agent"]["agentLabelSelector"]["matchLabels"] == {
        "osac.openshift.io/clusterorder": "o1",
        "osac.openshift.io/resource_class": "bm-standard",
    }
    assert spec["release"]["image"].endswith("4.17.3-x86_64")
    assert lab.client.list(AGENTS, cluster_ns) == []  # it never touches workers


def test_node_sets_added_later_get_their_node_pool(lab: Lab, ns: str) -> None:
    _order(lab, ns, "o2", [{"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-standard"}}])
    reference = wait_until(lambda: _reference(lab, ns, "o2"), "clusterReference")
    lab.client.patch(NODE_POOLS, reference["namespace"], "nodepool-o2-bm-standard", {"spec": {"replicas": 1}})

    requests = [
        {"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-standard"}},
        {"numberOfNodes": 2, "bareMetal": {"instanceType": "bm-gpu"}},
    ]
    lab.client.patch(CLUSTER_ORDERS, ns, "o2", {"spec": {"nodeRequests": requests}})
    wait_until(
        lambda: lab.client.get(NODE_POOLS, reference["namespace"], "nodepool-o2-bm-gpu"),
        "the new node set's NodePool",
    )
    # Existing NodePools are left alone: their replicas belong to the workers controller.
    existing = lab.client.get(NODE_POOLS, reference["namespace"], "nodepool-o2-bm-standard")
    assert existing is not None and existing["spec"]["replicas"] == 1


def test_unmanaged_orders_are_left_alone(lab: Lab, ns: str) -> None:
    _order(
        lab,
        ns,
        "hands-off",
        [{"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-standard"}}],
        annotations={"osac.openshift.io/management-state": "unmanaged"},
    )
    _order(lab, ns, "managed", [{"numberOfNodes": 1, "bareMetal": {"instanceType": "bm-standard"}}])
    wait_until(lambda: _reference(lab, ns, "managed"), "the managed order's clusterReference")
    assert _reference(lab, ns, "hands-off") is None
    assert lab.client.get(NAMESPACES, None, f"{ns}-hands-off") is None

    # Handing it back to management is all it takes.
    lab.client.patch(
        CLUSTER_ORDERS,
        ns,
        "hands-off",
        {"metadata": {"annotations": {"osac.openshift.io/management-state": None}}},
    )
    wait_until(lambda: _reference(lab, ns, "hands-off"), "clusterReference once managed")
