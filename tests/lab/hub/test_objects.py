"""Object semantics through the official kubernetes client: CRUD, conflicts, patches, status, generation."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import kubernetes
import pytest
from kubernetes.client import ApiException

from lab.hub.testing import (
    AGENT,
    AGENTMACHINE,
    CO,
    INFRAENV,
    MACHINE,
    NODEPOOL,
    api_status,
    sample_agent,
    sample_agent_machine,
    sample_cluster_order,
    sample_infraenv,
    sample_machine,
    sample_nodepool,
)

SAMPLES = {
    CO: sample_cluster_order,
    AGENT: sample_agent,
    INFRAENV: sample_infraenv,
    NODEPOOL: sample_nodepool,
    MACHINE: sample_machine,
    AGENTMACHINE: sample_agent_machine,
}


def _create(custom: Any, kind: tuple[str, str, str], ns: str, body: dict[str, Any]) -> dict[str, Any]:
    group, version, plural = kind
    created: dict[str, Any] = custom.create_namespaced_custom_object(group, version, ns, plural, body)
    return created


@pytest.mark.parametrize("kind", list(SAMPLES), ids=[k[2] for k in SAMPLES])
def test_every_custom_kind_round_trips(custom, ns: str, kind: tuple[str, str, str]) -> None:
    group, version, plural = kind
    created = _create(custom, kind, ns, SAMPLES[kind]("one"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1 and meta["namespace"] == ns
    assert int(meta["resourceVersion"]) > 0
    assert custom.get_namespaced_custom_object(group, version, ns, plural, "one") == created
    assert [
        o["metadata"]["name"]
        for o in custom.list_namespaced_custom_object(group, version, ns, plural)["items"]
    ] == ["one"]
    everywhere = custom.list_cluster_custom_object(group, version, plural)["items"]
    assert any(o["metadata"]["uid"] == meta["uid"] for o in everywhere)
    patched = custom.patch_namespaced_custom_object(
        group, version, ns, plural, "one", {"metadata": {"labels": {"touched": "yes"}}}
    )
    assert patched["metadata"]["labels"]["touched"] == "yes"
    assert int(patched["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert patched["metadata"]["generation"] == 1  # metadata is not spec
    custom.delete_namespaced_custom_object(group, version, ns, plural, "one")
    with pytest.raises(ApiException) as caught:
        custom.get_namespaced_custom_object(group, version, ns, plural, "one")
    body = api_status(caught.value)
    assert body["reason"] == "NotFound"
    assert body["message"] == f'{plural}.{group} "one" not found'
    assert body["details"] == {"name": "one", "group": group, "kind": plural}


def test_generate_name_and_already_exists(custom, ns: str) -> None:
    body = sample_cluster_order("")
    body["metadata"] = {"generateName": "order-"}
    first = _create(custom, CO, ns, body)
    second = _create(custom, CO, ns, body)
    for made in (first, second):
        assert (
            made["metadata"]["name"].startswith("order-")
            and len(made["metadata"]["name"]) == len("order-") + 5
        )
    assert first["metadata"]["name"] != second["metadata"]["name"]
    with pytest.raises(ApiException) as caught:
        _create(custom, CO, ns, sample_cluster_order(first["metadata"]["name"]))
    assert caught.value.status == 409
    assert api_status(caught.value)["reason"] == "AlreadyExists"


def test_create_in_a_missing_namespace_is_not_found(custom, core) -> None:
    with pytest.raises(ApiException) as caught:
        _create(custom, CO, "no-such-namespace", sample_cluster_order("x"))
    body = api_status(caught.value)
    assert caught.value.status == 404
    assert body["message"] == 'namespaces "no-such-namespace" not found'
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_secret("no-such-namespace", {"metadata": {"name": "s"}})
    assert caught.value.status == 404


def test_update_with_a_stale_resource_version_conflicts(custom, ns: str) -> None:
    group, version, plural = CO
    created = _create(custom, CO, ns, sample_cluster_order("o"))
    fresh = dict(created, spec={**created["spec"], "releaseImage": "quay.io/x/y:1"})
    updated = custom.replace_namespaced_custom_object(group, version, ns, plural, "o", fresh)
    assert updated["metadata"]["generation"] == 2
    stale = dict(created, spec={**created["spec"], "releaseImage": "quay.io/x/y:2"})
    with pytest.raises(ApiException) as caught:
        custom.replace_namespaced_custom_object(group, version, ns, plural, "o", stale)
    body = api_status(caught.value)
    assert caught.value.status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]
    # A merge patch carrying the stale version is a conditional write too.
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(
            group,
            version,
            ns,
            plural,
            "o",
            {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}},
        )
    assert caught.value.status == 409


def test_custom_resources_need_a_resource_version_to_update_and_an_existing_object(custom, ns: str) -> None:
    group, version, plural = CO
    created = _create(custom, CO, ns, sample_cluster_order("o"))
    unconditional = dict(
        created, metadata={k: v for k, v in created["metadata"].items() if k != "resourceVersion"}
    )
    with pytest.raises(ApiException) as caught:
        custom.replace_namespaced_custom_object(group, version, ns, plural, "o", unconditional)
    assert caught.value.status == 422
    assert api_status(caught.value)["details"]["causes"][0]["field"] == "metadata.resourceVersion"
    with pytest.raises(ApiException) as caught:
        custom.replace_namespaced_custom_object(
            group, version, ns, plural, "ghost", sample_cluster_order("ghost")
        )
    assert caught.value.status == 404


def test_secrets_allow_unconditional_updates_and_encode_string_data(core, ns: str) -> None:
    secret = core.create_namespaced_secret(
        ns,
        kubernetes.client.V1Secret(metadata=kubernetes.client.V1ObjectMeta(name="s"), string_data={"a": "b"}),
    )
    assert secret.data == {"a": base64.b64encode(b"b").decode()} and secret.type == "Opaque"
    assert secret.string_data is None
    replaced = core.replace_namespaced_secret(
        "s", ns, {"metadata": {"name": "s"}, "data": {"c": base64.b64encode(b"d").decode()}}
    )
    assert replaced.data == {"c": base64.b64encode(b"d").decode()}


def test_merge_and_json_patches(custom, ns: str, http: httpx.Client) -> None:
    group, version, plural = CO
    _create(custom, CO, ns, sample_cluster_order("o"))
    path = f"/apis/{group}/{version}/namespaces/{ns}/{plural}/o"
    merged = http.patch(
        path,
        content=json.dumps({"spec": {"releaseImage": "quay.io/a/b:1", "nodeRequests": None}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert merged.status_code == 200, merged.text
    assert merged.json()["spec"] == {"templateID": "ocp_4_17_small", "releaseImage": "quay.io/a/b:1"}
    ops = [
        {"op": "test", "path": "/spec/releaseImage", "value": "quay.io/a/b:1"},
        {"op": "add", "path": "/spec/nodeRequests", "value": [{"numberOfNodes": 1}]},
        {"op": "add", "path": "/spec/nodeRequests/-", "value": {"numberOfNodes": 4}},
        {"op": "replace", "path": "/spec/nodeRequests/0/numberOfNodes", "value": 3},
        {"op": "remove", "path": "/spec/releaseImage"},
    ]
    patched = http.patch(
        path, content=json.dumps(ops), headers={"Content-Type": "application/json-patch+json"}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["spec"]["nodeRequests"] == [{"numberOfNodes": 3}, {"numberOfNodes": 4}]
    assert "releaseImage" not in patched.json()["spec"]
    failed = http.patch(
        path,
        content=json.dumps([{"op": "test", "path": "/spec/templateID", "value": "other"}]),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert failed.status_code == 422 and failed.json()["kind"] == "Status"
    missing = http.patch(
        path,
        content=json.dumps([{"op": "remove", "path": "/spec/nothing"}]),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert missing.status_code == 422


def test_strategic_merge_patch_is_unsupported_on_custom_resources_only(
    custom, core, ns: str, http: httpx.Client
) -> None:
    group, version, plural = CO
    _create(custom, CO, ns, sample_cluster_order("o"))
    response = http.patch(
        f"/apis/{group}/{version}/namespaces/{ns}/{plural}/o",
        content=json.dumps({"spec": {"templateParameters": "{}"}}),
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert response.status_code == 415
    assert response.json()["reason"] == "UnsupportedMediaType"
    core.create_namespaced_secret(
        ns, {"metadata": {"name": "s", "labels": {"a": "1"}}, "stringData": {"k": "v"}}
    )
    response = http.patch(
        f"/api/v1/namespaces/{ns}/secrets/s",
        content=json.dumps({"metadata": {"labels": {"b": "2"}}}),
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert response.status_code == 200
    assert response.json()["metadata"]["labels"] == {"a": "1", "b": "2"}


def test_status_subresource_splits_spec_and_status(custom, ns: str) -> None:
    group, version, plural = CO
    body = sample_cluster_order("o")
    body["status"] = {"phase": "Ready"}
    created = _create(custom, CO, ns, body)
    assert "status" not in created  # a create cannot set status
    rv = created["metadata"]["resourceVersion"]

    written = custom.patch_namespaced_custom_object_status(
        group,
        version,
        ns,
        plural,
        "o",
        {
            "status": {"phase": "Progressing", "desiredWorkers": 2},
            "spec": {"templateParameters": "ignored"},
            "metadata": {"labels": {"ignored": "yes"}},
        },
    )
    assert written["status"] == {"phase": "Progressing", "desiredWorkers": 2}
    assert "templateParameters" not in written["spec"] and "labels" not in written["metadata"]
    assert written["metadata"]["generation"] == 1  # status is not spec
    assert int(written["metadata"]["resourceVersion"]) > int(rv)

    main = custom.patch_namespaced_custom_object(
        group, version, ns, plural, "o", {"status": {"phase": "Failed"}, "spec": {"templateParameters": "{}"}}
    )
    assert main["status"] == {"phase": "Progressing", "desiredWorkers": 2}
    assert main["spec"]["templateParameters"] == "{}" and main["metadata"]["generation"] == 2

    current = custom.get_namespaced_custom_object_status(group, version, ns, plural, "o")
    current["status"]["readyWorkers"] = 1
    replaced = custom.replace_namespaced_custom_object_status(group, version, ns, plural, "o", current)
    assert replaced["status"]["readyWorkers"] == 1 and replaced["metadata"]["generation"] == 2


def test_a_write_that_changes_nothing_keeps_the_resource_version(custom, ns: str) -> None:
    group, version, plural = CO
    created = _create(custom, CO, ns, sample_cluster_order("o"))
    again = custom.patch_namespaced_custom_object(
        group, version, ns, plural, "o", {"spec": {"templateID": created["spec"]["templateID"]}}
    )
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    replaced = custom.replace_namespaced_custom_object(group, version, ns, plural, "o", created)
    assert replaced["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_server_managed_metadata_cannot_be_overwritten(custom, ns: str) -> None:
    group, version, plural = CO
    created = _create(custom, CO, ns, sample_cluster_order("o"))
    patched = custom.patch_namespaced_custom_object(
        group,
        version,
        ns,
        plural,
        "o",
        {"metadata": {"creationTimestamp": "2001-01-01T00:00:00Z", "generation": 42}},
    )
    assert patched["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]
    assert patched["metadata"]["generation"] == 1
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(group, version, ns, plural, "o", {"metadata": {"uid": "other"}})
    assert caught.value.status == 422


def test_schema_defaults_are_applied(custom, ns: str) -> None:
    created = _create(custom, INFRAENV, ns, sample_infraenv("ie"))
    assert created["spec"]["cpuArchitecture"] == "x86_64"  # both CRDs default it


def test_namespaces_secrets_and_events(core, ns: str) -> None:
    namespace = core.read_namespace(ns)
    assert namespace.status.phase == "Active" and namespace.spec.finalizers == ["kubernetes"]
    assert namespace.metadata.labels["kubernetes.io/metadata.name"] == ns
    event = core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "o.1"},
            "involvedObject": {"kind": "ClusterOrder", "name": "o", "namespace": ns},
            "reason": "WorkerCreated",
            "message": "worker created",
            "type": "Normal",
        },
    )
    assert event.reason == "WorkerCreated"
    assert [e.metadata.name for e in core.list_namespaced_event(ns).items] == ["o.1"]
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_event(ns, {"metadata": {"name": "o.2"}, "involvedObject": {}, "type": "Bad"})
    assert caught.value.status == 422
    assert api_status(caught.value)["details"]["causes"][0]["field"] == "type"
    # Events are created by PUT too (as client-go's recorder may do).
    put = core.replace_namespaced_event(
        "o.3", ns, {"metadata": {"name": "o.3"}, "involvedObject": {"name": "o"}, "reason": "X"}
    )
    assert put.metadata.resource_version


def test_kind_and_namespace_mismatches_are_bad_requests(custom, core, ns: str) -> None:
    body = sample_cluster_order("o")
    body.pop("kind")
    with pytest.raises(ApiException) as caught:
        _create(custom, CO, ns, body)
    assert caught.value.status == 400
    body = sample_cluster_order("o")
    body["metadata"]["namespace"] = "elsewhere"
    with pytest.raises(ApiException) as caught:
        _create(custom, CO, ns, body)
    assert caught.value.status == 400
    with pytest.raises(ApiException) as caught:
        _create(custom, CO, ns, dict(sample_cluster_order("o"), kind="Agent"))
    assert caught.value.status == 400


def test_dry_run_writes_nothing(http: httpx.Client, custom, ns: str) -> None:
    group, version, plural = CO
    response = http.post(
        f"/apis/{group}/{version}/namespaces/{ns}/{plural}?dryRun=All", json=sample_cluster_order("dry")
    )
    assert response.status_code == 201
    assert custom.list_namespaced_custom_object(group, version, ns, plural)["items"] == []


def test_nodepool_scale_subresource(custom, ns: str, http: httpx.Client) -> None:
    group, version, plural = NODEPOOL
    created = _create(custom, NODEPOOL, ns, sample_nodepool("np", replicas=1))
    scale = custom.get_namespaced_custom_object_scale(group, version, ns, plural, "np")
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 1} and scale["status"] == {"replicas": 0}
    scaled = custom.patch_namespaced_custom_object_scale(
        group, version, ns, plural, "np", {"spec": {"replicas": 3}}
    )
    assert scaled["spec"]["replicas"] == 3
    pool = custom.get_namespaced_custom_object(group, version, ns, plural, "np")
    assert pool["spec"]["replicas"] == 3 and pool["metadata"]["generation"] == 2
    stale = dict(scale, spec={"replicas": 5})
    with pytest.raises(ApiException) as caught:
        custom.replace_namespaced_custom_object_scale(group, version, ns, plural, "np", stale)
    assert caught.value.status == 409
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object_scale(
            group, version, ns, plural, "np", {"spec": {"replicas": -1}}
        )
    assert caught.value.status == 422
    assert created["metadata"]["uid"] == scaled["metadata"]["uid"]
    listed = {r["name"]: r for r in http.get(f"/apis/{group}/{version}").json()["resources"]}
    assert (
        listed["nodepools/scale"]["kind"] == "Scale" and listed["nodepools/scale"]["group"] == "autoscaling"
    )
