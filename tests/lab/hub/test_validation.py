"""Schema enforcement on every write: 422 Invalid with field paths, against our CRDs and the real ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import kubernetes
import pytest
from kubernetes.client import ApiException

from lab.hub.testing import (
    AGENT,
    CO,
    INFRAENV,
    MACHINE,
    NODEPOOL,
    RunningHub,
    api_status,
    running_hub,
    sample_agent,
    sample_cluster_order,
    sample_infraenv,
    sample_machine,
    sample_nodepool,
)


@pytest.fixture(scope="module")
def own_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningHub]:
    """Only the project's own CRDs (lab/crds), over plain http."""
    with running_hub(tmp_path_factory.mktemp("own-hub")) as running:
        yield running


@pytest.fixture(scope="module")
def own_custom(own_hub: RunningHub) -> Iterator[Any]:
    client = own_hub.api_client()
    kubernetes.client.CoreV1Api(client).create_namespace(
        kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name="v"))
    )
    yield kubernetes.client.CustomObjectsApi(client)
    client.close()


def _reject(custom: Any, kind: tuple[str, str, str], ns: str, body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ApiException) as caught:
        custom.create_namespaced_custom_object(kind[0], kind[1], ns, kind[2], body)
    assert caught.value.status == 422, caught.value.body
    status = api_status(caught.value)
    assert status["reason"] == "Invalid"
    assert status["details"]["name"] == body["metadata"]["name"]
    return status


def _fields(status: dict[str, Any]) -> set[str]:
    return {c["field"] for c in status["details"]["causes"]}


def test_422_names_the_field_path(custom, ns: str) -> None:
    body = sample_cluster_order("bad")
    del body["spec"]["templateID"]
    body["spec"]["nodeRequests"][0]["numberOfNodes"] = "two"
    body["spec"]["nodeRequests"].append({"bareMetal": {"instanceType": ""}, "numberOfNodes": 1})
    status = _reject(custom, CO, ns, body)
    assert _fields(status) == {
        "spec.templateID",
        "spec.nodeRequests[0].numberOfNodes",
        "spec.nodeRequests[1].bareMetal.instanceType",
    }
    reasons = {c["field"]: c["reason"] for c in status["details"]["causes"]}
    assert reasons["spec.templateID"] == "FieldValueRequired"
    assert reasons["spec.nodeRequests[0].numberOfNodes"] == "FieldValueTypeInvalid"
    assert status["message"].startswith('ClusterOrder.osac.openshift.io "bad" is invalid: [')
    assert status["details"]["kind"] == "ClusterOrder" and status["details"]["group"] == "osac.openshift.io"


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (NODEPOOL, lambda: _without(sample_nodepool("np"), "spec", "clusterName"), "spec.clusterName"),
        (
            NODEPOOL,
            lambda: _set(sample_nodepool("np"), ["spec", "platform", "type"], "Bogus"),
            "spec.platform.type",
        ),
        (NODEPOOL, lambda: _set(sample_nodepool("np"), ["spec", "replicas"], -1), "spec.replicas"),
        (
            MACHINE,
            lambda: _without(sample_machine("m"), "spec", "infrastructureRef"),
            "spec.infrastructureRef",
        ),
        (AGENT, lambda: _without(sample_agent("a"), "spec", "approved"), "spec.approved"),
        (AGENT, lambda: _set(sample_agent("a"), ["spec", "role"], "boss"), "spec.role"),
        (INFRAENV, lambda: _without(sample_infraenv("ie"), "spec", "pullSecretRef"), "spec.pullSecretRef"),
        (
            CO,
            lambda: _set(sample_cluster_order("co"), ["spec", "releaseImage"], "no-tag"),
            "spec.releaseImage",
        ),
    ],
)
def test_our_crds_alone_reject_bad_objects(own_custom, kind, body, field: str) -> None:
    status = _reject(own_custom, kind, "v", body())
    assert field in _fields(status)


def test_the_real_crds_are_enforced_too(own_custom, custom, ns: str) -> None:
    """An Agent status that only the real CRD rejects (interfaces need flags and address lists)."""
    group, version, plural = AGENT
    status = {"inventory": {"interfaces": [{"name": "eth0", "macAddress": "aa:bb:cc:dd:ee:ff"}]}}
    for api, namespace in ((own_custom, "v"), (custom, ns)):
        api.create_namespaced_custom_object(group, version, namespace, plural, sample_agent("host-1"))
    accepted = own_custom.patch_namespaced_custom_object_status(
        group, version, "v", plural, "host-1", {"status": status}
    )
    assert accepted["status"]["inventory"]["interfaces"][0]["macAddress"] == "aa:bb:cc:dd:ee:ff"
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object_status(group, version, ns, plural, "host-1", {"status": status})
    assert caught.value.status == 422
    assert {
        "status.inventory.interfaces[0].flags",
        "status.inventory.interfaces[0].ipV4Addresses",
        "status.inventory.interfaces[0].ipV6Addresses",
    } <= _fields(api_status(caught.value))


def test_worker_status_contract_is_checked(custom, ns: str) -> None:
    group, version, plural = CO
    custom.create_namespaced_custom_object(group, version, ns, plural, sample_cluster_order("o"))
    good = {
        "workers": [
            {
                "name": "o-worker-0",
                "nodeSet": "gpu-large",
                "kind": "BareMetalInstance",
                "phase": "Provisioning",
                "attemptCount": 1,
                "resourceID": "bmi-1",
                "lastFailureTime": "2026-01-01T00:00:00Z",
            }
        ],
        "desiredWorkers": 1,
        "conditions": [
            {
                "type": "InfraEnvReady",
                "status": "True",
                "reason": "Created",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    custom.patch_namespaced_custom_object_status(group, version, ns, plural, "o", {"status": good})
    bad = json.loads(json.dumps(good))
    bad["workers"][0]["phase"] = "Sleeping"
    bad["workers"][0]["lastFailureTime"] = "yesterday"
    del bad["conditions"][0]["lastTransitionTime"]
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object_status(group, version, ns, plural, "o", {"status": bad})
    causes = {c["field"]: c for c in api_status(caught.value)["details"]["causes"]}
    assert causes["status.workers[0].phase"]["reason"] == "FieldValueNotSupported"
    assert "status.workers[0].lastFailureTime" in causes
    assert causes["status.conditions[0].lastTransitionTime"]["reason"] == "FieldValueRequired"


def test_transition_rules_make_template_id_immutable(custom, ns: str) -> None:
    group, version, plural = CO
    custom.create_namespaced_custom_object(group, version, ns, plural, sample_cluster_order("o"))
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(
            group, version, ns, plural, "o", {"spec": {"templateID": "other"}}
        )
    cause = api_status(caught.value)["details"]["causes"][0]
    assert cause["field"] == "spec.templateID" and "templateID is immutable" in cause["message"]


def test_unknown_fields_are_pruned_with_a_warning_or_rejected_when_strict(
    http: httpx.Client, ns: str
) -> None:
    group, version, plural = INFRAENV
    path = f"/apis/{group}/{version}/namespaces/{ns}/{plural}"
    body = sample_infraenv("ie")
    body["spec"]["madeUp"] = 1
    body["metadata"]["bogus"] = True
    strict = http.post(f"{path}?fieldValidation=Strict", json=body)
    assert strict.status_code == 400
    assert 'unknown field "spec.madeUp"' in strict.json()["message"]
    warned = http.post(path, json=body)
    assert warned.status_code == 201
    assert "madeUp" not in warned.json()["spec"] and "bogus" not in warned.json()["metadata"]
    assert warned.headers.get_list("warning") == [
        '299 - "unknown field \\"metadata.bogus\\""',
        '299 - "unknown field \\"spec.madeUp\\""',
    ]


def test_nulls_in_non_nullable_fields_are_dropped(custom, ns: str) -> None:
    group, version, plural = CO
    body = sample_cluster_order("o", releaseImage=None)
    created = custom.create_namespaced_custom_object(group, version, ns, plural, body)
    assert "releaseImage" not in created["spec"]


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ({"name": "Upper_Case"}, "metadata.name"),
        ({"name": "ok", "labels": {"bad key!": "v"}}, "metadata.labels"),
        ({"name": "ok", "labels": {"k": "-bad-value-"}}, "metadata.labels"),
        (
            {"name": "ok", "ownerReferences": [{"apiVersion": "v1", "kind": "Secret", "name": "s"}]},
            "metadata.ownerReferences[0].uid",
        ),
        ({}, "metadata.name"),
    ],
)
def test_metadata_is_validated(custom, ns: str, meta: dict[str, Any], field: str) -> None:
    group, version, plural = CO
    body = sample_cluster_order("x")
    body["metadata"] = meta
    with pytest.raises(ApiException) as caught:
        custom.create_namespaced_custom_object(group, version, ns, plural, body)
    assert caught.value.status == 422
    assert field in _fields(api_status(caught.value))


def _without(obj: dict[str, Any], section: str, key: str) -> dict[str, Any]:
    del obj[section][key]
    return obj


def _set(obj: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    node = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return obj
