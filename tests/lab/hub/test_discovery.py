"""Discovery, openapi, health and authentication, as kubectl and the kubernetes client see them."""

from __future__ import annotations

import httpx
import kubernetes
import pytest

from lab.hub.testing import CO, RunningHub, api_status

CUSTOM_GROUPS = {
    "osac.openshift.io": ("v1alpha1", {"clusterorders"}),
    "agent-install.openshift.io": ("v1beta1", {"agents", "infraenvs"}),
    "hypershift.openshift.io": ("v1beta1", {"nodepools"}),
    "cluster.x-k8s.io": ("v1beta1", {"machines"}),
}


def test_version_and_health_need_no_token(hub: RunningHub) -> None:
    with httpx.Client(base_url=hub.url, verify=hub.verify) as anonymous:
        version = anonymous.get("/version").json()
        assert (version["major"], version["minor"]) == ("1", "32")
        for path in ("/healthz", "/readyz", "/livez"):
            response = anonymous.get(path)
            assert response.status_code == 200 and response.text == "ok"


@pytest.mark.parametrize(
    "path",
    [
        "/api",
        "/apis",
        "/api/v1",
        "/apis/osac.openshift.io/v1alpha1",
        "/openapi/v3",
        "/api/v1/namespaces",
        "/apis/osac.openshift.io/v1alpha1/namespaces/default/clusterorders",
        "/lab/v1/stats",
        "/lab/v1/faults/api",
    ],
)
@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_everything_else_needs_a_valid_bearer_token(hub: RunningHub, path: str, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=hub.url, verify=hub.verify, headers=headers) as client:
        response = client.get(path)
    assert response.status_code == 401
    body = response.json()
    assert body["kind"] == "Status" and body["reason"] == "Unauthorized" and body["code"] == 401


def test_kubernetes_client_with_a_wrong_token_gets_401(hub: RunningHub, tmp_path) -> None:
    client = hub.api_client(hub.write_kubeconfig(tmp_path / "bad.kubeconfig", token="wrong"))
    with pytest.raises(kubernetes.client.ApiException) as caught:
        kubernetes.client.CoreV1Api(client).list_namespace()
    client.close()
    assert caught.value.status == 401
    assert api_status(caught.value)["reason"] == "Unauthorized"


def test_legacy_discovery_lists_every_served_kind(http: httpx.Client) -> None:
    assert http.get("/api").json()["versions"] == ["v1"]
    groups = {g["name"]: g for g in http.get("/apis").json()["groups"]}
    for group, (version, plurals) in CUSTOM_GROUPS.items():
        assert groups[group]["preferredVersion"]["groupVersion"] == f"{group}/{version}"
        assert http.get(f"/apis/{group}").json()["name"] == group
        listed = http.get(f"/apis/{group}/{version}").json()
        assert listed["kind"] == "APIResourceList" and listed["groupVersion"] == f"{group}/{version}"
        names = {r["name"]: r for r in listed["resources"]}
        for plural in plurals:
            resource = names[plural]
            assert resource["namespaced"] is True
            assert resource["singularName"] and resource["kind"]
            assert {"get", "list", "watch", "create", "update", "patch", "delete"} <= set(resource["verbs"])
            assert set(names[f"{plural}/status"]["verbs"]) == {"get", "patch", "update"}
    core = {r["name"]: r for r in http.get("/api/v1").json()["resources"]}
    assert core["namespaces"]["namespaced"] is False and core["namespaces"]["shortNames"] == ["ns"]
    assert core["secrets"]["namespaced"] is True and core["events"]["namespaced"] is True
    assert http.get("/apis/osac.openshift.io/v1alpha1").json()["resources"][0]["shortNames"] == ["cord"]


def test_unknown_paths_answer_a_not_found_status(http: httpx.Client) -> None:
    for path in ("/apis/nope.example.com/v1", "/apis/osac.openshift.io/v1alpha1/widgets", "/nothing/here"):
        response = http.get(path)
        assert response.status_code == 404, path
        assert response.json()["kind"] == "Status"
    assert http.get("/openapi/v2").status_code == 404


def test_openapi_v3_lets_kubectl_leave_validation_to_the_server(http: httpx.Client) -> None:
    root = http.get("/openapi/v3").json()["paths"]
    for group, (version, _) in CUSTOM_GROUPS.items():
        url = root[f"apis/{group}/{version}"]["serverRelativeURL"]
        assert "?hash=" in url
        doc = http.get(url).json()
        assert doc["openapi"].startswith("3.")
        patch_ops = [p["patch"] for p in doc["paths"].values() if "patch" in p]
        kinds = {op["x-kubernetes-group-version-kind"]["kind"] for op in patch_ops}
        assert kinds == {
            s["x-kubernetes-group-version-kind"][0]["kind"]
            for name, s in doc["components"]["schemas"].items()
            if name.startswith(".".join(reversed(group.split(".")))) and not name.endswith("List")
        }
        for op in patch_ops:
            assert op["x-kubernetes-group-version-kind"]["group"] == group
            assert any(p["name"] == "fieldValidation" and p["in"] == "query" for p in op["parameters"])
            # Custom resources take no strategic merge patch, so kubectl apply sends a merge patch.
            assert "application/strategic-merge-patch+json" not in op["requestBody"]["content"]
    core = http.get(root["api/v1"]["serverRelativeURL"]).json()
    secret_patch = core["paths"]["/api/v1/namespaces/{namespace}/secrets/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" in secret_patch["requestBody"]["content"]
    co_schema = http.get(root["apis/osac.openshift.io/v1alpha1"]["serverRelativeURL"]).json()["components"][
        "schemas"
    ]["io.openshift.osac.v1alpha1.ClusterOrder"]
    assert "templateID" in co_schema["properties"]["spec"]["properties"]


def test_list_of_a_kind_via_the_client_carries_a_resource_version(custom, ns: str) -> None:
    listed = custom.list_namespaced_custom_object(CO[0], CO[1], ns, CO[2])
    assert listed["kind"] == "ClusterOrderList"
    assert int(listed["metadata"]["resourceVersion"]) > 0
