"""Lab routes: request stats by user/verb/resource and API fault injection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import kubernetes
import pytest
from kubernetes.client import ApiException

from lab.hub.testing import AGENT, CO, CONTROLLER_USER, RunningHub, api_status, running_hub, sample_agent


@pytest.fixture
def lab_hub(tmp_path) -> Iterator[RunningHub]:
    """A hub of its own: counters and faults are global to a hub."""
    with running_hub(tmp_path, fault_seed=7) as running:
        yield running


@pytest.fixture
def lab_http(lab_hub: RunningHub) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lab_hub.url, headers=lab_hub.headers(), timeout=30) as client:
        yield client


@pytest.fixture
def lab_custom(lab_hub: RunningHub) -> Iterator[Any]:
    client = lab_hub.api_client()
    yield kubernetes.client.CustomObjectsApi(client)
    client.close()


def _agents_path(ns: str = "default") -> str:
    return f"/apis/{AGENT[0]}/{AGENT[1]}/namespaces/{ns}/agents"


def test_stats_count_requests_by_user_verb_and_resource(lab_hub: RunningHub, lab_http, lab_custom) -> None:
    lab_http.delete("/lab/v1/stats")
    group, version, plural = AGENT
    lab_custom.create_namespaced_custom_object(group, version, "default", plural, sample_agent("a"))
    lab_custom.get_namespaced_custom_object(group, version, "default", plural, "a")
    lab_custom.get_namespaced_custom_object(group, version, "default", plural, "a")
    lab_custom.patch_namespaced_custom_object_status(
        group, version, "default", plural, "a", {"status": {"debugInfo": {"state": "known-unbound"}}}
    )
    with httpx.Client(base_url=lab_hub.url, headers=lab_hub.headers(lab_hub.controller_token)) as controller:
        controller.get(_agents_path())
    stats = lab_http.get("/lab/v1/stats").json()
    rows = {(r["user"], r["verb"], r["resource"], r["subresource"]): r["count"] for r in stats["requests"]}
    resource = "agents.agent-install.openshift.io"
    assert rows == {
        ("admin", "create", resource, ""): 1,
        ("admin", "get", resource, ""): 2,
        ("admin", "patch", resource, "status"): 1,
        (CONTROLLER_USER, "list", resource, ""): 1,
    }
    assert stats["total"] == 5 and stats["byUser"] == {"admin": 4, CONTROLLER_USER: 1}
    orchestrator_only = lab_http.get("/lab/v1/stats", params={"excludeUser": CONTROLLER_USER}).json()
    assert orchestrator_only["total"] == 4 and CONTROLLER_USER not in orchestrator_only["byUser"]
    assert lab_http.delete("/lab/v1/stats").json()["total"] == 0


def test_injected_errors_hit_only_the_chosen_verbs_and_resources(lab_http, lab_custom) -> None:
    group, version, plural = AGENT
    config = {
        "seed": 1,
        "errors": [
            {"code": 500, "verbs": ["create"], "resources": ["agents"], "rate": 1.0, "limit": 2},
            {"code": 409, "verbs": ["patch"], "resources": ["agents.agent-install.openshift.io/status"]},
        ],
    }
    assert lab_http.put("/lab/v1/faults/api", json=config).status_code == 200
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            lab_custom.create_namespaced_custom_object(group, version, "default", plural, sample_agent("a"))
        assert caught.value.status == 500 and api_status(caught.value)["reason"] == "InternalError"
    lab_custom.create_namespaced_custom_object(
        group, version, "default", plural, sample_agent("a")
    )  # limit reached
    lab_custom.create_namespaced_custom_object(
        CO[0],
        CO[1],
        "default",
        CO[2],
        {
            "apiVersion": "osac.openshift.io/v1alpha1",
            "kind": "ClusterOrder",
            "metadata": {"name": "o"},
            "spec": {"templateID": "t"},
        },
    )
    lab_custom.patch_namespaced_custom_object(
        group, version, "default", plural, "a", {"metadata": {"labels": {"x": "1"}}}
    )
    with pytest.raises(ApiException) as caught:
        lab_custom.patch_namespaced_custom_object_status(
            group, version, "default", plural, "a", {"status": {}}
        )
    assert caught.value.status == 409 and api_status(caught.value)["reason"] == "Conflict"
    status = lab_http.get("/lab/v1/faults/api").json()
    assert status["injectedErrors"] == [2, 1]
    assert lab_http.delete("/lab/v1/faults/api").json()["config"]["errors"] == []
    lab_custom.patch_namespaced_custom_object_status(group, version, "default", plural, "a", {"status": {}})


def test_injected_refusals_and_a_404_page(lab_http, lab_custom) -> None:
    """401 and 403 answer a Status like the apiserver's; 404 a plain-text page with no Status (a
    proxy's, or the apiserver's for a path it does not serve), unlike an object's own NotFound."""
    group, version, plural = AGENT
    lab_custom.create_namespaced_custom_object(group, version, "default", plural, sample_agent("a"))
    for code, reason in ((401, "Unauthorized"), (403, "Forbidden")):
        lab_http.put("/lab/v1/faults/api", json={"errors": [{"code": code, "verbs": ["get"], "limit": 1}]})
        with pytest.raises(ApiException) as caught:
            lab_custom.get_namespaced_custom_object(group, version, "default", plural, "a")
        assert caught.value.status == code and api_status(caught.value)["reason"] == reason
    assert api_status(caught.value)["details"] == {"name": "a", "kind": plural, "group": group}
    lab_http.put("/lab/v1/faults/api", json={"errors": [{"code": 404, "verbs": ["get"], "limit": 1}]})
    page = lab_http.get(f"{_agents_path()}/a")
    assert page.status_code == 404 and page.text == "404 page not found\n"
    assert page.headers["content-type"].startswith("text/plain")
    assert lab_http.get(f"{_agents_path()}/a").status_code == 200  # limit reached
    missing = lab_http.get(f"{_agents_path()}/nope").json()  # an object's own NotFound names it
    assert missing["reason"] == "NotFound"
    assert missing["details"] == {"name": "nope", "kind": plural, "group": group}
    lab_http.delete("/lab/v1/faults/api")


def test_error_rates_are_repeatable_for_a_seed(lab_http) -> None:
    def pattern() -> list[int]:
        lab_http.put(
            "/lab/v1/faults/api",
            json={"seed": 42, "errors": [{"code": 500, "verbs": ["list"], "rate": 0.5, "users": ["admin"]}]},
        )
        return [lab_http.get(_agents_path()).status_code for _ in range(20)]

    first, second = pattern(), pattern()
    assert first == second
    assert set(first) == {200, 500}
    lab_http.delete("/lab/v1/faults/api")


def test_fault_config_is_validated(lab_http) -> None:
    assert lab_http.put("/lab/v1/faults/api", json={"errors": [{"code": 418}]}).status_code == 422
    assert lab_http.put("/lab/v1/faults/api", json={"errors": [{"rate": 2}]}).status_code == 422
    assert lab_http.put("/lab/v1/faults/api", json={"nonsense": True}).status_code == 422
