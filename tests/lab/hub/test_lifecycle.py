"""Deletion: finalizers and deletionTimestamp, owner-reference garbage collection, namespace deletion."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException

from lab.hub.testing import CO, INFRAENV, api_status, sample_cluster_order, sample_infraenv, wait_for

GROUP, VERSION, PLURAL = CO
FINALIZER = "osac.openshift.io/workers"


def _get(custom: Any, ns: str, name: str, kind: tuple[str, str, str] = CO) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(kind[0], kind[1], ns, kind[2], name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _gone(custom: Any, ns: str, name: str, kind: tuple[str, str, str] = CO) -> bool:
    return _get(custom, ns, name, kind) is None


def _owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_finalizers_hold_deletion_until_removed(custom, ns: str) -> None:
    body = sample_cluster_order("o")
    body["metadata"]["finalizers"] = [FINALIZER]
    created = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    rv = created["metadata"]["resourceVersion"]

    pending = custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "o")
    assert pending["metadata"]["deletionTimestamp"] and pending["metadata"]["generation"] == 2
    current = _get(custom, ns, "o")
    assert (
        current is not None
        and current["metadata"]["deletionTimestamp"] == pending["metadata"]["deletionTimestamp"]
    )
    # Deleting again changes nothing; status and spec writes still work meanwhile.
    again = custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "o")
    assert again["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, "o", {"status": {"phase": "Deleting"}}
    )
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "o", {"metadata": {"finalizers": [FINALIZER, "example.com/more"]}}
        )
    assert caught.value.status == 422
    assert api_status(caught.value)["details"]["causes"][0]["reason"] == "FieldValueForbidden"

    custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        "o",
        [{"op": "remove", "path": "/metadata/finalizers"}],
        _content_type="application/json-patch+json",
    )
    assert _gone(custom, ns, "o")
    events = [
        (e["type"], e["raw_object"]["metadata"].get("deletionTimestamp") is not None)
        for e in kubernetes.watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert events == [("MODIFIED", True), ("MODIFIED", True), ("DELETED", True)]


def test_deleting_an_owner_deletes_its_dependents(custom, core, ns: str) -> None:
    owner = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, sample_cluster_order("o"))
    env = sample_infraenv("o-infraenv")
    env["metadata"]["ownerReferences"] = [_owner_ref(owner)]
    env = custom.create_namespaced_custom_object(INFRAENV[0], INFRAENV[1], ns, INFRAENV[2], env)
    # A grandchild: the pull secret belongs to the InfraEnv.
    core.create_namespaced_secret(
        ns, {"metadata": {"name": "pull", "ownerReferences": [_owner_ref(env)]}, "stringData": {"k": "v"}}
    )
    held = sample_infraenv("held")
    held["metadata"]["ownerReferences"] = [_owner_ref(owner)]
    held["metadata"]["finalizers"] = [FINALIZER]
    custom.create_namespaced_custom_object(INFRAENV[0], INFRAENV[1], ns, INFRAENV[2], held)

    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "o")
    wait_for(lambda: _gone(custom, ns, "o-infraenv", INFRAENV), what="the dependent InfraEnv to go")
    wait_for(lambda: not core.list_namespaced_secret(ns).items, what="the grandchild secret to go")
    # A dependent with a finalizer is only marked for deletion.
    marked = wait_for(
        lambda: (_get(custom, ns, "held", INFRAENV) or {}).get("metadata", {}).get("deletionTimestamp"),
        what="the finalized dependent to be marked",
    )
    assert marked


def test_a_dependent_with_a_living_owner_survives(custom, ns: str) -> None:
    first = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, sample_cluster_order("first"))
    second = custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, sample_cluster_order("second")
    )
    env = sample_infraenv("shared")
    env["metadata"]["ownerReferences"] = [_owner_ref(first), dict(_owner_ref(second), controller=False)]
    custom.create_namespaced_custom_object(INFRAENV[0], INFRAENV[1], ns, INFRAENV[2], env)
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "first")

    def owners() -> list[str]:
        current = _get(custom, ns, "shared", INFRAENV)
        assert current is not None, "the dependent of a living owner was deleted"
        return [r["name"] for r in current["metadata"].get("ownerReferences", [])]

    wait_for(lambda: owners() == ["second"], what="the dangling owner reference to be dropped")


def test_orphan_propagation_keeps_dependents(custom, ns: str) -> None:
    owner = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, sample_cluster_order("o"))
    env = sample_infraenv("kept")
    env["metadata"]["ownerReferences"] = [_owner_ref(owner)]
    custom.create_namespaced_custom_object(INFRAENV[0], INFRAENV[1], ns, INFRAENV[2], env)
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "o", propagation_policy="Orphan")
    kept = _get(custom, ns, "kept", INFRAENV)
    assert kept is not None and "ownerReferences" not in kept["metadata"]


def test_an_object_whose_owner_never_existed_is_collected(custom, ns: str) -> None:
    env = sample_infraenv("stray")
    env["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "osac.openshift.io/v1alpha1",
            "kind": "ClusterOrder",
            "name": "ghost",
            "uid": "no-such-uid",
        }
    ]
    custom.create_namespaced_custom_object(INFRAENV[0], INFRAENV[1], ns, INFRAENV[2], env)
    wait_for(lambda: _gone(custom, ns, "stray", INFRAENV), what="the stray object to be collected")


def test_deleting_a_namespace_deletes_its_content(custom, core) -> None:
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_secret("doomed", {"metadata": {"name": "s"}})
    body = sample_cluster_order("o")
    body["metadata"]["finalizers"] = [FINALIZER]
    custom.create_namespaced_custom_object(GROUP, VERSION, "doomed", PLURAL, body)

    core.delete_namespace("doomed")
    namespace = core.read_namespace("doomed")
    assert namespace.status.phase == "Terminating" and namespace.metadata.deletion_timestamp
    wait_for(lambda: not core.list_namespaced_secret("doomed").items, what="the secret to go")
    wait_for(
        lambda: (_get(custom, "doomed", "o") or {}).get("metadata", {}).get("deletionTimestamp"),
        what="the order to be marked",
    )
    assert core.read_namespace("doomed").status.phase == "Terminating"
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_secret("doomed", {"metadata": {"name": "late"}})
    assert caught.value.status == 403
    assert api_status(caught.value)["details"]["causes"][0]["reason"] == "NamespaceTerminating"

    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "doomed", PLURAL, "o", {"metadata": {"finalizers": None}}
    )

    def namespace_gone() -> bool:
        try:
            core.read_namespace("doomed")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(namespace_gone, what="the namespace to go")
