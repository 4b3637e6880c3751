"""Create and update rules of BareMetalInstances: errors name the field, nothing changes on a rejection."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from lab.fulfillment.testing import bmi_body

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGxhYg lab@example"


def body_with(name: str = "w-0", **changes: Any) -> dict[str, Any]:
    """`spec__user_data="x"` sets a nested field; the value `...` removes it."""
    body = bmi_body(name)
    for path, value in changes.items():
        target = body
        *parents, leaf = path.split("__")
        for part in parents:
            target = target.setdefault(part, {})
        if value is ...:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return body


def expect_invalid(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, response.text
    answer = response.json()
    assert answer["code"] == 3
    assert answer["details"] == []
    assert answer["message"].startswith(f"{field}:"), answer["message"]


INVALID_CREATES: list[tuple[dict[str, Any], str]] = [
    ({"spec__catalog_item": ...}, "spec.catalog_item"),
    ({"spec__catalog_item": {}}, "spec.catalog_item"),
    ({"spec__catalog_item": {"name": "no-such-item"}}, "spec.catalog_item"),
    ({"spec__instance_type": ...}, "spec.instance_type"),
    ({"spec__instance_type": "bm-huge"}, "spec.instance_type"),
    ({"spec__user_data": "x" * 65_537}, "spec.user_data"),
    ({"spec__user_data": "é" * 32_769}, "spec.user_data"),  # 65,538 bytes in UTF-8
    ({"metadata__name": ""}, "metadata.name"),
    ({"metadata__name": "Upper"}, "metadata.name"),
    ({"metadata__name": "under_score"}, "metadata.name"),
    ({"metadata__name": "-leading"}, "metadata.name"),
    ({"metadata__name": "a" * 64}, "metadata.name"),
    ({"spec__image": {"source_type": "disk_image", "source_ref": "rhcos-9"}}, "spec.image.source_ref"),
    ({"spec__image": {"source_ref": "rhcos-4.18"}}, "spec.image.source_type"),
    ({"spec__image": ..., "spec__disk_image": "rhcos-9"}, "spec.disk_image"),
    (
        {"spec__network_attachments": [{"interface": "data-0"}, {"interface": "mgmt-0"}]},
        "spec.network_attachments",
    ),
    (
        {"spec__network_attachments": [{"interface": "data-0", "primary": True}, {"primary": True}]},
        "spec.network_attachments",
    ),
    (
        {"spec__network_attachments": [{"interface": "eth9", "primary": True}]},
        "spec.network_attachments[0].interface",
    ),
    ({"spec__network_attachments": [{"primary": "maybe"}]}, "spec.network_attachments[0].primary"),
    ({"spec__network_attachments": [{"subnet": {"name": "no-such"}}]}, "spec.network_attachments[0].subnet"),
    ({"spec__network_attachments": [{"subnet": {}}]}, "spec.network_attachments[0].subnet"),
    # A name is no id: the order's CR names are sent as names.
    ({"spec__network_attachments": [{"subnet": {"id": "subnet-a"}}]}, "spec.network_attachments[0].subnet"),
    (
        {"spec__network_attachments": [{"security_groups": [{"name": "sg-1"}, {"name": "sg-nope"}]}]},
        "spec.network_attachments[0].security_groups[1]",
    ),
    ({"spec__bogus": 1}, "spec.bogus"),
    ({"spec__run_strategy": "SOMETIMES"}, "spec.run_strategy"),
    ({"spec__ssh_public_key": "not a key"}, "spec.ssh_public_key"),
    ({"metadata__labels": {"a": 1}}, "metadata.labels.a"),
]


def test_invalid_creates_name_the_field_and_create_nothing(admin: httpx.Client) -> None:
    for changes, field in INVALID_CREATES:
        expect_invalid(admin.post(BMI, json=body_with(**changes)), field)
    expect_invalid(admin.post(BMI, content=b"{not json"), "body")
    expect_invalid(admin.post(BMI, content=b"[1, 2]"), "body")
    assert admin.get(BMI).json()["total"] == 0


@pytest.mark.parametrize(
    "changes",
    [
        {"spec__user_data": "x" * 65_536},
        {"spec__user_data": "é" * 32_768},
        {"spec__catalog_item": "caas-system-bmi"},  # the older proto's plain string
        {"spec__image": ..., "spec__disk_image": "rhcos-4.18"},
        {"spec__image": ..., "spec__disk_image": ...},
        {"spec__network_attachments": [{"interface": "data-0", "primary": True}, {"interface": "mgmt-0"}]},
        {"spec__ssh_public_key": SSH_KEY, "spec__run_strategy": "BARE_METAL_INSTANCE_RUN_STRATEGY_ALWAYS"},
        {"spec__restart_trigger": "7", "spec__template_parameters": {"k": "v"}},
    ],
)
def test_valid_variants_are_accepted(admin: httpx.Client, changes: dict[str, Any]) -> None:
    response = admin.post(BMI, json=body_with(**changes))
    assert response.status_code == 200, response.text
    assert "user_data" not in response.json()["spec"]


def test_catalog_item_by_id_and_disk_image_by_id(admin: httpx.Client) -> None:
    items = admin.get("/api/private/v1/baremetal_instance_catalog_items").json()["items"]
    item = next(i for i in items if i["metadata"]["name"] == "caas-system-bmi")
    image = admin.get("/api/private/v1/disk_images").json()["items"][0]
    body = body_with(spec__catalog_item={"id": item["id"]}, spec__image=..., spec__disk_image=image["id"])
    created = admin.post(BMI, json=body)
    assert created.status_code == 200, created.text
    assert created.json()["spec"]["catalog_item"] == {"id": item["id"], "name": "caas-system-bmi"}
    both = body_with(
        "w-1",
        spec__image={"source_type": "disk_image", "source_ref": image["id"]},
        spec__disk_image="rhcos-4.18",
    )
    assert admin.post(BMI, json=both).status_code == 200


def test_network_references_resolve_by_id_or_name_and_are_stored_with_both(admin: httpx.Client) -> None:
    subnet = next(
        s for s in admin.get("/api/private/v1/subnets").json()["items"] if s["metadata"]["name"] == "subnet-a"
    )
    groups = {
        g["metadata"]["name"]: g["id"] for g in admin.get("/api/private/v1/security_groups").json()["items"]
    }
    attachment = {
        "subnet": {"name": "subnet-a"},
        "security_groups": [{"id": groups["sg-open"]}, {"id": groups["sg-1"], "name": "sg-1"}],
    }
    created = admin.post(BMI, json=body_with(spec__network_attachments=[attachment]))
    assert created.status_code == 200, created.text
    stored = created.json()["spec"]["network_attachments"][0]
    assert stored["subnet"] == {"id": subnet["id"], "name": "subnet-a"}
    assert stored["security_groups"] == [
        {"id": groups["sg-open"], "name": "sg-open"},
        {"id": groups["sg-1"], "name": "sg-1"},
    ]
    # A name two tenants both use names no one object: its id does.
    other = admin.post(
        "/api/private/v1/subnets", json={"metadata": {"name": "subnet-a", "tenant": "tenant-b"}, "spec": {}}
    )
    assert other.status_code == 200, other.text
    expect_invalid(
        admin.post(BMI, json=body_with("w-2", spec__network_attachments=[{"subnet": {"name": "subnet-a"}}])),
        "spec.network_attachments[0].subnet",
    )
    by_id = {"subnet": {"id": subnet["id"], "name": "subnet-a"}}
    assert admin.post(BMI, json=body_with("w-3", spec__network_attachments=[by_id])).status_code == 200
    # An id and a name of two different objects name nothing.
    mixed = {"security_groups": [{"id": groups["sg-open"], "name": "sg-1"}]}
    expect_invalid(
        admin.post(BMI, json=body_with("w-1", spec__network_attachments=[mixed])),
        "spec.network_attachments[0].security_groups[0]",
    )


def test_names_are_unique_per_tenant_and_project(admin: httpx.Client) -> None:
    assert admin.post(BMI, json=body_with("dup")).status_code == 200
    second = admin.post(BMI, json=body_with("dup"))
    assert second.status_code == 409
    assert second.json()["code"] == 6
    assert "dup" in second.json()["message"]
    other_project = body_with("dup", metadata__project="team-b")
    assert admin.post(BMI, json=other_project).status_code == 200
    other_tenant = body_with("dup", metadata__tenant="tenant-a", spec__catalog_item={"name": "bm-general"})
    assert admin.post(BMI, json=other_tenant).status_code == 200
    assert admin.get(BMI).json()["total"] == 3


def test_secrets_are_never_echoed(admin: httpx.Client, api: Api) -> None:
    secret = "SECRET-" + "k" * 40
    bmi = api.create("quiet", user_data=secret)
    for text in (
        admin.get(f"{BMI}/{bmi['id']}").text,
        admin.get(BMI).text,
        admin.patch(f"{BMI}/{bmi['id']}", json={"metadata": {"labels": {"x": "y"}}}).text,
        admin.patch(f"{BMI}/{bmi['id']}", json={"spec": {"user_data": secret + "!"}}).text,
        admin.get("/lab/v1/audit").text,
    ):
        assert secret not in text


# ------------------------------------------------------------------------------------------- updates


def test_update_merges_maps_whole_and_bumps_the_version(admin: httpx.Client, api: Api) -> None:
    bmi = api.create("upd", labels={"a": "1", "b": "2"})
    version = bmi["metadata"]["version"]
    patched = admin.patch(f"{BMI}/{bmi['id']}", json={"metadata": {"labels": {"c": "3"}}})
    assert patched.status_code == 200, patched.text
    obj = patched.json()
    assert obj["metadata"]["labels"] == {"c": "3"}
    assert obj["metadata"]["version"] > version
    assert obj["metadata"]["creation_timestamp"] == bmi["metadata"]["creation_timestamp"]
    assert obj["spec"]["instance_type"] == "bm-standard"
    # Status, id and server-owned metadata are output only: what a client sends there is ignored.
    echoed = copy.deepcopy(obj)
    echoed["status"]["state"] = "BARE_METAL_INSTANCE_STATE_FAILED"
    echoed["metadata"]["creator"] = "someone"
    echoed["id"] = "other-id"
    again = admin.patch(f"{BMI}/{bmi['id']}", json=echoed).json()
    assert again["status"]["state"] != "BARE_METAL_INSTANCE_STATE_FAILED"
    assert (again["id"], again["metadata"]["creator"]) == (bmi["id"], "admin")
    mutable = admin.patch(
        f"{BMI}/{bmi['id']}", json={"spec": {"run_strategy": "BARE_METAL_INSTANCE_RUN_STRATEGY_HALTED"}}
    )
    assert mutable.json()["spec"]["run_strategy"] == "BARE_METAL_INSTANCE_RUN_STRATEGY_HALTED"


IMMUTABLE_CHANGES = [
    ("catalog_item", {"name": "bm-general"}),
    ("ssh_public_key", "ssh-ed25519 AAAAOTHER other@example"),
    ("user_data", "different"),
    ("template_parameters", {"k": "other"}),
    ("image", {"source_type": "disk_image", "source_ref": "rhcos-4.19"}),
    ("auto_external_ip_attachment", True),
]


def test_immutable_fields_are_refused_by_name(admin: httpx.Client) -> None:
    images = "/api/private/v1/disk_images"
    admin.post(images, json={"metadata": {"name": "rhcos-4.19"}, "spec": {"source_ref": "q/r:4.19"}})
    body = body_with(
        "imm",
        spec__ssh_public_key=SSH_KEY,
        spec__template_parameters={"k": "v"},
        spec__auto_external_ip_attachment=False,
    )
    created = admin.post(BMI, json=body).json()
    for field, value in IMMUTABLE_CHANGES:
        response = admin.patch(f"{BMI}/{created['id']}", json={"spec": {field: value}})
        expect_invalid(response, f"spec.{field}")
    tenant_move = admin.patch(f"{BMI}/{created['id']}", json={"metadata": {"tenant": "tenant-a"}})
    expect_invalid(tenant_move, "metadata.tenant")
    # Resending the same values (another spelling of the same catalog item and image) is no change.
    same = {
        "spec": {
            "catalog_item": {"name": "caas-system-bmi"},
            "ssh_public_key": SSH_KEY,
            "user_data": body["spec"]["user_data"],
            "template_parameters": {"k": "v"},
            "disk_image": "rhcos-4.18",
            "auto_external_ip_attachment": False,
        }
    }
    assert admin.patch(f"{BMI}/{created['id']}", json=same).status_code == 200
    current = admin.get(f"{BMI}/{created['id']}").json()
    assert current["spec"]["ssh_public_key"] == SSH_KEY
    assert current["spec"]["template_parameters"] == {"k": "v"}


def test_update_mask_limits_what_changes(admin: httpx.Client, api: Api) -> None:
    bmi = api.create("masked", labels={"a": "1"})
    body = {"metadata": {"labels": {"b": "2"}, "annotations": {"x": "y"}}, "spec": {"user_data": "changed"}}
    response = admin.patch(f"{BMI}/{bmi['id']}", params={"update_mask": "metadata.labels"}, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["metadata"]["labels"] == {"b": "2"}
    assert response.json()["metadata"]["annotations"] == {}
    cleared = admin.patch(f"{BMI}/{bmi['id']}", params={"update_mask": "metadata.labels"}, json={})
    assert cleared.json()["metadata"]["labels"] == {}
    expect_invalid(
        admin.patch(f"{BMI}/{bmi['id']}", params={"update_mask": "status.state"}, json={}), "update_mask"
    )


def test_optimistic_lock(admin: httpx.Client, api: Api) -> None:
    bmi = api.create("locked")
    current = admin.get(f"{BMI}/{bmi['id']}").json()
    version = current["metadata"]["version"]
    stale = {"metadata": {"version": version - 1, "labels": {"x": "1"}}}
    conflict = admin.patch(f"{BMI}/{bmi['id']}", params={"lock": "true"}, json=stale)
    assert (conflict.status_code, conflict.json()["code"]) == (409, 10)
    assert conflict.json()["message"].startswith("metadata.version:")
    expect_invalid(admin.patch(f"{BMI}/{bmi['id']}", params={"lock": "true"}, json={}), "metadata.version")
    fresh = {"metadata": {"version": str(version), "labels": {"x": "2"}}}  # int32 as a number or a string
    ok = admin.patch(f"{BMI}/{bmi['id']}", params={"lock": "true"}, json=fresh)
    assert ok.status_code == 200, ok.text
    assert ok.json()["metadata"]["labels"] == {"x": "2"}
    assert ok.json()["metadata"]["version"] == version + 1
    # Without lock the version sent is ignored.
    assert admin.patch(f"{BMI}/{bmi['id']}", json=stale).status_code == 200


def test_rename_into_an_existing_name_is_already_exists(admin: httpx.Client, api: Api) -> None:
    api.create("first")
    second = api.create("second")
    response = admin.patch(f"{BMI}/{second['id']}", json={"metadata": {"name": "first"}})
    assert (response.status_code, response.json()["code"]) == (409, 6)
    expect_invalid(
        admin.patch(f"{BMI}/{second['id']}", json={"metadata": {"name": "Bad Name"}}), "metadata.name"
    )
    missing = admin.patch(f"{BMI}/no-such-id", json={})
    assert (missing.status_code, missing.json()["code"]) == (404, 5)
    assert admin.delete(f"{BMI}/no-such-id").status_code == 404
