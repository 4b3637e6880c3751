"""The default seed and CRUD of the admin-managed kinds (types, disk images, versions, catalog items)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import httpx

from lab.fulfillment.inventory import MAC
from lab.fulfillment.testing import fulfillment_twin

if TYPE_CHECKING:
    from .conftest import Api

PRIVATE = "/api/private/v1"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def by_name(admin: httpx.Client, kind: str) -> dict[str, dict[str, Any]]:
    answer = admin.get(f"{PRIVATE}/{kind}").json()
    assert answer["size"] == answer["total"] == len(answer["items"])
    return {o["metadata"]["name"]: o for o in answer["items"]}


def test_default_seed_is_ready_for_caas(admin: httpx.Client, api: Api) -> None:
    types = by_name(admin, "bare_metal_instance_types")
    assert set(types) == {"bm-standard", "bm-gpu"}
    selectors = {}
    for name, itype in types.items():
        assert set(itype) == {"id", "metadata", "spec", "status"}
        assert RFC3339.match(itype["metadata"]["creation_timestamp"])
        selectors[name] = itype["spec"]["host_label_selector"]["match_labels"]
        assert selectors[name]
        ports = itype["spec"]["hardware"]["network_ports"]
        assert [p["role"] for p in ports].count("fabric") == 1
        # int64 travels as a string
        assert isinstance(itype["spec"]["hardware"]["memory"]["total_gb"], str)
    assert selectors["bm-standard"] != selectors["bm-gpu"]

    images = by_name(admin, "disk_images")
    assert images["rhcos-4.18"]["spec"]["source_type"] == "SOURCE_TYPE_REGISTRY"
    versions = by_name(admin, "cluster_versions")
    version = versions["4.18.0"]
    assert version["spec"]["image"] == "quay.io/openshift-release-dev/ocp-release:4.18.0-x86_64"
    assert version["spec"]["version"] == "4.18.0"
    assert version["spec"]["disk_image"] == images["rhcos-4.18"]["id"]
    items = by_name(admin, "baremetal_instance_catalog_items")
    assert items["caas-system-bmi"]["metadata"]["tenant"] == "system"

    # 8 hosts: 6 standard + 2 GPU, each matching exactly one type, two NICs with one fabric port.
    hosts = api.hosts()
    assert len(hosts) == 8
    matches = {"bm-standard": 0, "bm-gpu": 0}
    macs = []
    for host in hosts.values():
        fitting = [
            n for n, sel in selectors.items() if all(host["labels"].get(k) == v for k, v in sel.items())
        ]
        assert len(fitting) == 1
        matches[fitting[0]] += 1
        assert len(host["nics"]) == 2
        assert [n["role"] for n in host["nics"]].count("fabric") == 1
        macs += [n["mac"] for n in host["nics"]]
        assert host["state"] == "FREE"
    assert matches == {"bm-standard": 6, "bm-gpu": 2}
    assert all(MAC.match(m) for m in macs)
    assert len(set(macs)) == len(macs)


def test_host_split_follows_the_count() -> None:
    with fulfillment_twin(hosts=5, gpu_hosts=0) as twin:
        classes = [h.labels["osac.openshift.io/host-class"] for h in twin.lab.inventory.all()]
        assert classes == ["standard"] * 5
    with fulfillment_twin(hosts=3) as twin:
        classes = [h.labels["osac.openshift.io/host-class"] for h in twin.lab.inventory.all()]
        assert classes == ["standard"] * 3  # 3 // 4 == 0 GPU hosts


def test_instance_type_crud(admin: httpx.Client) -> None:
    path = f"{PRIVATE}/bare_metal_instance_types"
    body: dict[str, Any] = {
        "metadata": {"name": "bm-tiny"},
        "spec": {
            "description": "small",
            "host_label_selector": {"match_labels": {"osac.openshift.io/host-class": "tiny"}},
            "hardware": {
                "network_ports": [{"name": "data-0", "role": "fabric", "type": "Ethernet", "speed": "10Gbps"}]
            },
        },
    }
    created = admin.post(path, json=body)
    assert created.status_code == 200, created.text
    tiny = created.json()
    assert tiny["metadata"]["version"] == 1
    again = admin.post(path, json=body)
    assert (again.status_code, again.json()["code"]) == (409, 6)

    no_selector = admin.post(path, json={"metadata": {"name": "bm-bad"}, "spec": {}})
    assert no_selector.status_code == 400
    assert no_selector.json()["message"].startswith("spec.host_label_selector.match_labels:")
    bad_role = admin.post(
        path,
        json={
            "metadata": {"name": "bm-bad"},
            "spec": {
                "host_label_selector": {"match_labels": {"a": "b"}},
                "hardware": {"network_ports": [{"name": "x", "role": "uplink"}]},
            },
        },
    )
    assert bad_role.status_code == 400
    assert bad_role.json()["message"].startswith("spec.hardware.network_ports[0].role:")

    updated = admin.patch(f"{path}/{tiny['id']}", json={"spec": {"description": "smaller"}})
    assert updated.status_code == 200, updated.text
    assert updated.json()["spec"]["description"] == "smaller"
    assert updated.json()["spec"]["host_label_selector"] == body["spec"]["host_label_selector"]
    assert updated.json()["metadata"]["version"] == 2

    assert admin.delete(f"{path}/{tiny['id']}").json() == {}
    assert admin.get(f"{path}/{tiny['id']}").status_code == 404


def test_cluster_version_links_an_existing_disk_image(admin: httpx.Client) -> None:
    images = f"{PRIVATE}/disk_images"
    versions = f"{PRIVATE}/cluster_versions"
    image = admin.post(
        images,
        json={
            "metadata": {"name": "rhcos-4.19"},
            "spec": {"source_type": "SOURCE_TYPE_REGISTRY", "source_ref": "q/r:4.19"},
        },
    ).json()
    missing = admin.post(
        versions,
        json={"spec": {"image": "quay.io/x:4.19.0", "version": "4.19.0", "disk_image": "no-such-image"}},
    )
    assert missing.status_code == 400
    assert missing.json()["message"].startswith("spec.disk_image:")

    created = admin.post(
        versions,
        json={"spec": {"image": "quay.io/x:4.19.0", "version": "4.19.0", "disk_image": "rhcos-4.19"}},
    )
    assert created.status_code == 200, created.text
    version = created.json()
    assert version["metadata"]["name"] == "4-19-0"  # generated from spec.version
    assert version["spec"]["disk_image"] == image["id"]

    immutable = admin.patch(f"{versions}/{version['id']}", json={"spec": {"image": "quay.io/x:other"}})
    assert immutable.status_code == 400
    assert immutable.json()["message"].startswith("spec.image:")

    in_use = admin.delete(f"{images}/{image['id']}")
    assert (in_use.status_code, in_use.json()["code"]) == (400, 9)
    assert admin.delete(f"{versions}/{version['id']}").json() == {}
    assert admin.delete(f"{images}/{image['id']}").json() == {}


def test_catalog_items_and_types_in_use_cannot_be_deleted(admin: httpx.Client, api: Api) -> None:
    bmi = api.create("holder")
    types = by_name(admin, "bare_metal_instance_types")
    items = by_name(admin, "baremetal_instance_catalog_items")
    for path in (
        f"{PRIVATE}/bare_metal_instance_types/{types['bm-standard']['id']}",
        f"{PRIVATE}/baremetal_instance_catalog_items/{items['caas-system-bmi']['id']}",
    ):
        response = admin.delete(path)
        assert (response.status_code, response.json()["code"]) == (400, 9), response.text
    api.delete(bmi["id"])
    api.wait_gone(bmi["id"])
    created = admin.post(
        f"{PRIVATE}/baremetal_instance_catalog_items",
        json={"metadata": {"name": "extra"}, "spec": {"title": "Extra", "published": True}},
    )
    assert created.status_code == 200, created.text
    assert admin.delete(f"{PRIVATE}/baremetal_instance_catalog_items/{created.json()['id']}").json() == {}
