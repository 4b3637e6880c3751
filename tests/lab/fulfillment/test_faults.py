"""Every fault knob under /lab/v1/faults, and the request counters under /lab/v1/stats."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from lab.fulfillment.models import BmiState
from lab.fulfillment.testing import RunningFulfillmentTwin, bmi_body, wait_until

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
LIST_ROUTE = "GET /api/private/v1/baremetal_instances"


def test_fault_config_round_trip(admin: httpx.Client) -> None:
    empty = admin.get("/lab/v1/faults").json()
    assert empty["error_rate"] == 0 and empty["routes"] == {} and empty["wipe_failure_hosts"] == []
    put = admin.put("/lab/v1/faults", json={"error_rate": 0.25, "routes": {LIST_ROUTE: {"latency_s": 0.1}}})
    assert put.status_code == 200, put.text
    assert put.json()["routes"][LIST_ROUTE] == {
        "error_rate": 0.0,
        "latency_s": 0.1,
        "hang_rate": 0.0,
        "error_code": 14,
        "echo_user_data": None,
    }
    patched = admin.patch("/lab/v1/faults", json={"no_free_hosts": True}).json()
    assert patched["error_rate"] == 0.25 and patched["no_free_hosts"] is True
    for bad, field in (
        ({"error_rate": 2}, "error_rate"),
        ({"latency_s": -1}, "latency_s"),
        ({"routes": {"FETCH /x": {}}}, "routes"),
        ({"explode": True}, "explode"),
    ):
        response = admin.patch("/lab/v1/faults", json=bad)
        assert response.status_code == 400
        assert response.json()["message"].startswith(field), response.json()
    assert admin.get("/lab/v1/faults").json()["no_free_hosts"] is True  # rejected patches changed nothing
    cleared = admin.delete("/lab/v1/faults").json()
    assert cleared["error_rate"] == 0 and cleared["no_free_hosts"] is False


def test_error_rate_on_all_routes_answers_503_and_changes_nothing(admin: httpx.Client, api: Api) -> None:
    api.faults(error_rate=1.0)
    for method, path, body in (
        ("GET", BMI, None),
        ("POST", BMI, bmi_body("x")),
        ("GET", "/api/fulfillment/v1/baremetal_instances", None),
    ):
        response = admin.request(method, path, json=body)
        assert response.status_code == 503
        assert response.json() == {"code": 14, "message": "lab fault: injected error", "details": []}
    assert admin.get("/lab/v1/hosts").status_code == 200  # lab routes are never faulted
    api.faults()
    assert admin.get(BMI).json()["total"] == 0


def test_error_rate_per_route(admin: httpx.Client, api: Api) -> None:
    api.faults(routes={f"POST {BMI}": {"error_rate": 1.0}})
    assert admin.post(BMI, json=bmi_body("x")).status_code == 503
    assert admin.get(BMI).status_code == 200
    api.faults(routes={BMI: {"error_rate": 1.0}})  # no method: every method of the route
    assert admin.get(BMI).status_code == 503
    assert admin.get("/api/private/v1/disk_images").status_code == 200
    # A route entry replaces the global knobs for that route.
    api.faults(error_rate=1.0, routes={"/api/private/v1/disk_images": {}})
    assert admin.get("/api/private/v1/disk_images").status_code == 200
    assert admin.get("/api/private/v1/cluster_versions").status_code == 503
    # Another gRPC code than Unavailable, for errors a client must not retry.
    api.faults(routes={f"GET {BMI}": {"error_rate": 1.0, "error_code": 7}})
    refused = admin.get(BMI)
    assert refused.status_code == 403 and refused.json()["code"] == 7
    assert admin.patch("/lab/v1/faults", json={"routes": {BMI: {"error_code": 99}}}).status_code == 400


def test_seeded_error_rate_is_repeatable(admin: httpx.Client, api: Api) -> None:
    def run() -> list[int]:
        api.faults(error_rate=0.5, seed=1234)
        return [admin.get(BMI).status_code for _ in range(40)]

    first, second = run(), run()
    assert first == second
    assert set(first) == {200, 503}
    assert api.faults()["seed"] == 1234  # answers show the last seed applied


def test_added_latency(admin: httpx.Client, api: Api) -> None:
    api.faults(routes={LIST_ROUTE: {"latency_s": 0.4}})
    started = time.monotonic()
    assert admin.get(BMI).status_code == 200
    assert time.monotonic() - started >= 0.4


def test_hanging_requests_time_out_then_are_released(
    twin: RunningFulfillmentTwin, admin: httpx.Client, api: Api
) -> None:
    api.faults(routes={LIST_ROUTE: {"hang_rate": 1.0}})
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(twin.url + BMI, headers=twin.admin_headers, timeout=0.5)

    answers: list[httpx.Response] = []
    hung = threading.Thread(target=lambda: answers.append(admin.get(BMI)), daemon=True)
    before = admin.get("/lab/v1/stats").json()["requests"].get(LIST_ROUTE, 0)
    hung.start()
    wait_until(
        lambda: admin.get("/lab/v1/stats").json()["requests"].get(LIST_ROUTE, 0) > before,
        what="request hanging",
    )
    assert admin.post(BMI, json=bmi_body("meanwhile")).status_code == 200  # other routes still answer
    api.faults()  # clearing releases it
    hung.join(20)
    assert [a.status_code for a in answers] == [503]
    assert answers[0].json()["code"] == 14
    assert admin.get(BMI).status_code == 200


def test_provisioning_failure_keeps_the_host_until_deleted(api: Api) -> None:
    api.faults(provisioning_failure_rate=1.0)
    bmi = api.create("doomed")
    failed = api.wait_state(bmi["id"], BmiState.FAILED)
    ready = next(c for c in failed["status"]["conditions"] if c["type"].endswith("_READY"))
    assert ready["message"].startswith("Provisioning failed")
    records = api.audit(bmi_id=bmi["id"])
    assert [r["kind"] for r in records] == ["HOST_ALLOCATED", "PROVISIONING_FAILED"]
    host_id = records[0]["host_id"]
    assert api.hosts()[host_id]["state"] == "ALLOCATED"
    api.faults()
    api.delete(bmi["id"])
    api.wait_gone(bmi["id"])
    assert [r["kind"] for r in api.audit(bmi_id=bmi["id"])][2:] == [
        "WIPE_STARTED",
        "WIPE_FINISHED",
        "HOST_RELEASED",
    ]
    assert api.hosts()[host_id]["state"] == "FREE"


def test_no_free_hosts(api: Api) -> None:
    api.faults(no_free_hosts=True)
    bmi = api.create("starved")
    failed = api.wait_state(bmi["id"], BmiState.FAILED)
    ready = next(c for c in failed["status"]["conditions"] if c["type"].endswith("_READY"))
    assert ready["message"] == "No matching hosts available"
    assert all(h["state"] == "FREE" for h in api.hosts().values())
    api.faults()
    assert api.wait_state(api.create("fed")["id"], BmiState.RUNNING)


def test_wipe_failure_rate(api: Api) -> None:
    api.faults(wipe_failure_rate=1.0)
    bmi = api.create("unlucky")
    api.wait_state(bmi["id"], BmiState.RUNNING)
    api.delete(bmi["id"])
    wait_until(lambda: any(h["state"] == "QUARANTINED" for h in api.hosts().values()), what="quarantine")
    assert api.get(bmi["id"]).json()["status"]["state"] == BmiState.DELETING.value
    assert [r["kind"] for r in api.audit(bmi_id=bmi["id"])][-2:] == ["WIPE_FAILED", "HOST_QUARANTINED"]


def test_stats_count_every_api_call(twin: RunningFulfillmentTwin, admin: httpx.Client, api: Api) -> None:
    admin.delete("/lab/v1/stats")
    bmi = api.create("counted")
    admin.get(f"{BMI}/{bmi['id']}")
    admin.get(f"{BMI}/{bmi['id']}")
    httpx.get(twin.url + BMI, timeout=20)  # unauthenticated calls count too
    api.faults(error_rate=1.0)
    admin.get(BMI)
    api.faults()
    stats = admin.get("/lab/v1/stats").json()
    assert stats["requests"] == {
        f"POST {BMI}": 1,
        f"GET {BMI}/{{id}}": 2,
        f"GET {BMI}": 2,
    }
    assert stats["total"] == 5
    assert stats["watchers"] == 0
