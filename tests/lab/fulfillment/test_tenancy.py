"""The public API (`/api/fulfillment/v1`): each tenant sees only its own objects, never tenant `system`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from lab.fulfillment.models import BmiState
from lab.fulfillment.testing import bmi_body

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
PUBLIC_BMI = "/api/fulfillment/v1/baremetal_instances"
PUBLIC_TYPES = "/api/fulfillment/v1/bare_metal_instance_types"


def tenant_body(name: str) -> dict[str, Any]:
    return bmi_body(name, catalog_item="bm-general")


def test_tenants_see_only_their_own_bmis(
    admin: httpx.Client, api: Api, tenant_a: httpx.Client, tenant_b: httpx.Client
) -> None:
    system_bmi = api.create("caas-worker-0")
    assert system_bmi["metadata"]["tenant"] == "system"

    created = tenant_a.post(PUBLIC_BMI, json=tenant_body("a-0"))
    assert created.status_code == 200, created.text
    mine = created.json()
    assert mine["metadata"]["tenant"] == "tenant-a"
    assert "hub" not in mine["status"]

    assert [o["id"] for o in tenant_a.get(PUBLIC_BMI).json()["items"]] == [mine["id"]]
    assert tenant_b.get(PUBLIC_BMI).json() == {"size": 0, "total": 0, "items": []}
    # Even a filter that names the system object finds nothing.
    sys_filter = {"filter": f"this.id == '{system_bmi['id']}'"}
    assert tenant_a.get(PUBLIC_BMI, params=sys_filter).json()["total"] == 0

    for client, obj in ((tenant_a, system_bmi), (tenant_b, mine)):
        for response in (
            client.get(f"{PUBLIC_BMI}/{obj['id']}"),
            client.patch(f"{PUBLIC_BMI}/{obj['id']}", json={"metadata": {"labels": {"x": "y"}}}),
            client.delete(f"{PUBLIC_BMI}/{obj['id']}"),
        ):
            assert (response.status_code, response.json()["code"]) == (404, 5)
    assert api.get(system_bmi["id"]).json()["metadata"]["labels"] == {}

    # The admin sees everything on the private API.
    private_ids = {o["id"] for o in admin.get(BMI).json()["items"]}
    assert private_ids == {system_bmi["id"], mine["id"]}

    # The tenant's own lifecycle works on the public API.
    api.wait_state(mine["id"], BmiState.RUNNING)
    labelled = tenant_a.patch(f"{PUBLIC_BMI}/{mine['id']}", json={"metadata": {"labels": {"team": "a"}}})
    assert labelled.json()["metadata"]["labels"] == {"team": "a"}
    assert tenant_a.delete(f"{PUBLIC_BMI}/{mine['id']}").json() == {}
    api.wait_gone(mine["id"])


def test_tenant_creates_stay_in_the_tenant(admin: httpx.Client, tenant_a: httpx.Client) -> None:
    into_other = tenant_body("sneaky")
    into_other["metadata"]["tenant"] = "tenant-b"
    response = tenant_a.post(PUBLIC_BMI, json=into_other)
    assert (response.status_code, response.json()["code"]) == (403, 7)
    system_item = tenant_a.post(PUBLIC_BMI, json=bmi_body("uses-system-item"))
    assert system_item.status_code == 400
    assert system_item.json()["message"].startswith("spec.catalog_item:")
    assert admin.get(BMI).json()["total"] == 0
    # Names are unique per tenant: the same name in tenant-a and in system coexist.
    assert tenant_a.post(PUBLIC_BMI, json=tenant_body("shared-name")).status_code == 200
    assert admin.post(BMI, json=bmi_body("shared-name")).status_code == 200
    dup = tenant_a.post(PUBLIC_BMI, json=tenant_body("shared-name"))
    assert (dup.status_code, dup.json()["code"]) == (409, 6)


def test_public_instance_types_hide_the_host_selector(admin: httpx.Client, tenant_a: httpx.Client) -> None:
    private = admin.get("/api/private/v1/bare_metal_instance_types").json()["items"]
    public = tenant_a.get(PUBLIC_TYPES).json()
    assert public["total"] == len(private) == 2
    assert all("host_label_selector" in t["spec"] for t in private)
    for itype in public["items"]:
        assert "host_label_selector" not in itype["spec"]
        assert itype["spec"]["hardware"]["network_ports"]
        one = tenant_a.get(f"{PUBLIC_TYPES}/{itype['id']}").json()
        assert "host_label_selector" not in one["spec"]
        assert "host_label_selector" not in str(one)
    # The public API lists and gets types; it does not write them.
    assert tenant_a.post(PUBLIC_TYPES, json={}).status_code == 405
