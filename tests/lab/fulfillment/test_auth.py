"""Bearer-token auth: admin token for private and lab routes, tenant tokens for the public API."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from lab.fulfillment.testing import RunningFulfillmentTwin, bmi_body

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
PUBLIC_BMI = "/api/fulfillment/v1/baremetal_instances"

PRIVATE_ROUTES = [
    ("GET", BMI),
    ("GET", "/api/private/v1/bare_metal_instance_types"),
    ("GET", "/api/private/v1/disk_images"),
    ("GET", "/api/private/v1/cluster_versions"),
    ("GET", "/api/private/v1/baremetal_instance_catalog_items"),
    ("GET", "/api/private/v1/events/watch"),
    ("GET", "/lab/v1/hosts"),
    ("GET", "/lab/v1/faults"),
    ("GET", "/lab/v1/audit"),
    ("GET", "/lab/v1/stats"),
    ("GET", "/lab/v1/timings"),
]


BAD_HEADERS = [
    {},
    {"Authorization": "Bearer wrong-token"},
    {"Authorization": "Basic abc"},
    {"Authorization": "Bearer"},
]


def test_missing_or_wrong_token_is_unauthenticated(twin: RunningFulfillmentTwin) -> None:
    for method, path in PRIVATE_ROUTES:
        for headers in BAD_HEADERS:
            response = httpx.request(method, twin.url + path, headers=headers, timeout=20)
            assert response.status_code == 401, (method, path, headers)
            assert response.json() == {
                "code": 16,
                "message": "missing or invalid bearer token",
                "details": [],
            }


def test_public_api_needs_a_tenant_token(twin: RunningFulfillmentTwin) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = httpx.get(twin.url + PUBLIC_BMI, headers=headers, timeout=20)
        assert response.status_code == 401
        assert response.json()["code"] == 16
    # The admin service account is not a tenant; a tenant is not the admin.
    response = httpx.get(twin.url + PUBLIC_BMI, headers=twin.admin_headers, timeout=20)
    assert (response.status_code, response.json()["code"]) == (403, 7)
    for path in (BMI, "/lab/v1/hosts"):
        response = httpx.get(twin.url + path, headers=twin.tenant_headers, timeout=20)
        assert (response.status_code, response.json()["code"]) == (403, 7)


def test_rejected_writes_change_nothing(twin: RunningFulfillmentTwin, admin: httpx.Client, api: Api) -> None:
    bad = {"Authorization": "Bearer wrong-token"}
    created = api.create("keep-me")
    assert httpx.post(twin.url + BMI, json=bmi_body("intruder"), headers=bad, timeout=20).status_code == 401
    assert httpx.delete(f"{twin.url}{BMI}/{created['id']}", headers=bad, timeout=20).status_code == 401
    patch = {"metadata": {"labels": {"owned": "yes"}}}
    assert (
        httpx.patch(f"{twin.url}{BMI}/{created['id']}", json=patch, headers=bad, timeout=20).status_code
        == 401
    )
    assert (
        httpx.put(twin.url + "/lab/v1/faults", json={"error_rate": 1}, headers=bad, timeout=20).status_code
        == 401
    )
    tenant_write = httpx.post(
        twin.url + BMI, json=bmi_body("tenant"), headers=twin.tenant_headers, timeout=20
    )
    assert tenant_write.status_code == 403

    items = admin.get(BMI).json()["items"]
    assert [i["metadata"]["name"] for i in items] == ["keep-me"]
    assert items[0]["metadata"]["labels"] == {}
    assert items[0]["metadata"].get("deletion_timestamp") is None
    assert admin.get("/lab/v1/faults").json()["error_rate"] == 0
