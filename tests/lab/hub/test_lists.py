"""Listing: label selectors (equality and set based), field selectors, limit/continue."""

from __future__ import annotations

import httpx
import pytest
from kubernetes.client import ApiException

from lab.hub.selectors import from_label_selector_object, parse_field_selector, parse_label_selector
from lab.hub.testing import AGENT, api_status, sample_agent

LABELS = {
    "a1": {"pool": "gpu", "zone": "z1", "ready": "true"},
    "a2": {"pool": "gpu", "zone": "z2"},
    "a3": {"pool": "cpu", "zone": "z1"},
    "a4": {},
}


@pytest.fixture
def agents(custom, ns: str) -> str:
    group, version, plural = AGENT
    for name, labels in LABELS.items():
        custom.create_namespaced_custom_object(group, version, ns, plural, sample_agent(name, labels))
    return ns


def _names(custom, ns: str | None, **kwargs) -> list[str]:
    group, version, plural = AGENT
    if ns is None:
        listed = custom.list_cluster_custom_object(group, version, plural, **kwargs)
    else:
        listed = custom.list_namespaced_custom_object(group, version, ns, plural, **kwargs)
    return [o["metadata"]["name"] for o in listed["items"]]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("pool=gpu", ["a1", "a2"]),
        ("pool==gpu", ["a1", "a2"]),
        ("pool!=gpu", ["a3", "a4"]),
        ("pool in (gpu, cpu)", ["a1", "a2", "a3"]),
        ("zone notin (z1)", ["a2", "a4"]),
        ("ready", ["a1"]),
        ("!ready", ["a2", "a3", "a4"]),
        ("pool=gpu,zone=z1", ["a1"]),
        ("pool in (gpu),!ready,zone", ["a2"]),
        ("", ["a1", "a2", "a3", "a4"]),
    ],
)
def test_label_selectors(custom, agents: str, selector: str, expected: list[str]) -> None:
    assert _names(custom, agents, label_selector=selector) == expected


def test_bad_label_selector_is_a_bad_request(custom, agents: str) -> None:
    for selector in ("pool in gpu", "pool=(", "=x", "pool in (a,"):
        with pytest.raises(ApiException) as caught:
            _names(custom, agents, label_selector=selector)
        assert caught.value.status == 400, selector
        assert api_status(caught.value)["reason"] == "BadRequest"


def test_field_selectors(custom, core, agents: str) -> None:
    assert _names(custom, agents, field_selector="metadata.name=a2") == ["a2"]
    assert _names(custom, agents, field_selector="metadata.name!=a2") == ["a1", "a3", "a4"]
    assert _names(custom, None, field_selector=f"metadata.namespace={agents}") == ["a1", "a2", "a3", "a4"]
    assert _names(custom, None, field_selector=f"metadata.namespace={agents},metadata.name==a3") == ["a3"]
    with pytest.raises(ApiException) as caught:
        _names(custom, agents, field_selector="spec.role=worker")
    assert caught.value.status == 400
    assert "field label not supported" in api_status(caught.value)["message"]
    for name, reason in (("e1", "WorkerCreated"), ("e2", "WorkerReady")):
        core.create_namespaced_event(
            agents,
            {"metadata": {"name": name}, "involvedObject": {"kind": "Agent", "name": "a1"}, "reason": reason},
        )
    events = core.list_namespaced_event(agents, field_selector="involvedObject.name=a1,reason=WorkerReady")
    assert [e.metadata.name for e in events.items] == ["e2"]


def test_limit_and_continue_page_through_everything(custom, agents: str) -> None:
    group, version, plural = AGENT
    seen: list[str] = []
    token = None
    pages = 0
    first_rv = None
    while True:
        kwargs = {"limit": 3}
        if token:
            kwargs["_continue"] = token
        page = custom.list_namespaced_custom_object(group, version, agents, plural, **kwargs)
        pages += 1
        first_rv = first_rv or page["metadata"]["resourceVersion"]
        assert page["metadata"]["resourceVersion"] == first_rv  # every page reports the first list's version
        seen.extend(o["metadata"]["name"] for o in page["items"])
        token = page["metadata"].get("continue")
        if not token:
            break
        assert page["metadata"]["remainingItemCount"] == 4 - len(seen)
    assert seen == ["a1", "a2", "a3", "a4"] and pages == 2


def test_a_bad_continue_token_is_rejected(http: httpx.Client, agents: str) -> None:
    response = http.get(f"/apis/{AGENT[0]}/{AGENT[1]}/namespaces/{agents}/agents?limit=1&continue=garbage")
    assert response.status_code == 400


def test_metadata_only_lists_and_reads(http: httpx.Client, custom, agents: str) -> None:
    """What client-go's metadata client asks for: each object reduced to its metadata, at the
    version a full list reports; a client that cannot take it gets whole objects."""
    path = f"/apis/{AGENT[0]}/{AGENT[1]}/namespaces/{agents}/agents"
    accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
    listed = http.get(path, params={"labelSelector": "pool=gpu"}, headers={"Accept": accept}).json()
    full = _names(custom, agents, label_selector="pool=gpu")
    assert listed["kind"] == "PartialObjectMetadataList" and listed["apiVersion"] == "meta.k8s.io/v1"
    assert [item["metadata"]["name"] for item in listed["items"]] == full == ["a1", "a2"]
    assert all(set(item) == {"kind", "apiVersion", "metadata"} for item in listed["items"])
    group, version, plural = AGENT
    whole = custom.get_namespaced_custom_object(group, version, agents, plural, "a1")
    assert listed["items"][0]["metadata"] == whole["metadata"]

    one = http.get(
        f"{path}/a1", headers={"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}
    ).json()
    assert one == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": whole["metadata"],
    }
    assert http.get(path, headers={"Accept": "application/json"}).json()["items"][0]["spec"]


def test_label_selector_parsing_units() -> None:
    selector = parse_label_selector("a=1, b != 2, c in (x,y), d notin (z), e, !f, g>3")
    assert selector.matches({"a": "1", "c": "x", "e": "", "g": "4"})
    assert not selector.matches({"a": "1", "c": "x", "e": "", "g": "3"})
    assert not selector.matches({"a": "1", "b": "2", "c": "x", "e": "", "g": "4"})
    assert not selector.matches({"a": "1", "c": "x", "e": "", "f": "", "g": "4"})
    assert parse_label_selector("k=").matches({"k": ""})
    assert from_label_selector_object(
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}
    ).matches({"a": "1"})
    fields = parse_field_selector("metadata.name=x", {"metadata.name": "metadata.name"})
    assert fields.matches({"metadata": {"name": "x"}}) and not fields.matches({"metadata": {"name": "y"}})
