"""Lab-only routes: the host inventory and the timings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from lab.fulfillment.models import BmiState
from lab.fulfillment.testing import bmi_body

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
TYPES = "/api/private/v1/bare_metal_instance_types"


def test_added_hosts_serve_a_new_instance_type(admin: httpx.Client, api: Api) -> None:
    selector = {"osac.openshift.io/host-class": "arm"}
    itype = {
        "metadata": {"name": "bm-arm"},
        "spec": {
            "host_label_selector": {"match_labels": selector},
            "hardware": {
                "network_ports": [{"name": "data-0", "role": "fabric"}, {"name": "bmc", "role": "lifecycle"}]
            },
        },
    }
    assert admin.post(TYPES, json=itype).status_code == 200
    generated = admin.post("/lab/v1/hosts", json={"labels": selector})
    assert generated.status_code == 200, generated.text
    host = generated.json()
    assert host["id"] == "host-009" and host["state"] == "FREE"
    assert [n["role"] for n in host["nics"]] == ["management", "fabric"]
    explicit = admin.post(
        "/lab/v1/hosts",
        json={
            "id": "arm-2",
            "labels": selector,
            "nics": [{"name": "data-0", "mac": "AA-BB-CC-DD-EE-01", "role": "fabric"}],
        },
    ).json()
    assert explicit["nics"][0]["mac"] == "aa:bb:cc:dd:ee:01"

    clash = admin.post(
        "/lab/v1/hosts", json={"labels": {}, "nics": [{"name": "x", "mac": "aa:bb:cc:dd:ee:01"}]}
    )
    assert (clash.status_code, clash.json()["code"]) == (409, 6)
    again = admin.post("/lab/v1/hosts", json={"id": "arm-2", "labels": {}})
    assert again.status_code == 409
    bad_mac = admin.post("/lab/v1/hosts", json={"nics": [{"name": "x", "mac": "nope"}]})
    assert bad_mac.status_code == 400 and bad_mac.json()["message"].startswith("nics[0].mac:")
    no_fabric = admin.post(
        "/lab/v1/hosts", json={"nics": [{"name": "x", "mac": "aa:bb:cc:dd:ee:09", "role": "management"}]}
    )
    assert no_fabric.status_code == 400 and no_fabric.json()["message"].startswith("nics:")
    assert admin.get("/lab/v1/hosts/nope").status_code == 404
    assert len(api.hosts()) == 10

    lifecycle_port = bmi_body(
        "arm-x", instance_type="bm-arm", network_attachments=[{"interface": "bmc", "primary": True}]
    )
    refused = admin.post(BMI, json=lifecycle_port)
    assert refused.status_code == 400
    assert refused.json()["message"].startswith("spec.network_attachments[0].interface:")

    arms = [api.create(f"arm-{i}", instance_type="bm-arm") for i in range(3)]
    states = [
        api.wait_state(b["id"], BmiState.RUNNING if i < 2 else BmiState.FAILED) for i, b in enumerate(arms)
    ]
    hosts_used = {r["host_id"] for r in api.audit(kind="HOST_ALLOCATED")}
    assert hosts_used == {"host-009", "arm-2"}
    assert states[1]["status"]["hardware"]["nics"] == [{"mac": "aa:bb:cc:dd:ee:01"}]
    added = [r["host_id"] for r in api.audit(kind="HOST_ADDED")]
    assert added[-2:] == ["host-009", "arm-2"]


def test_timings_profiles_and_overrides(admin: httpx.Client) -> None:
    zero = admin.get("/lab/v1/timings").json()
    assert zero == {
        "allocation_s": 0.0,
        "image_write_s": 0.0,
        "boot_s": 0.0,
        "wipe_s": 0.0,
        "deprovision_s": 0.0,
    }
    demo = admin.put("/lab/v1/timings", json={}).json()
    assert all(0 < v <= 2.0 for v in demo.values())
    realistic = admin.put("/lab/v1/timings", json={"profile": "realistic", "wipe_s": 30}).json()
    assert realistic["wipe_s"] == 30
    assert realistic["image_write_s"] + realistic["boot_s"] >= 120  # provisioning takes minutes
    patched = admin.patch("/lab/v1/timings", json={"boot_s": 0.5}).json()
    assert patched == {**realistic, "boot_s": 0.5}
    for bad, field in (({"boot_s": -1}, "boot_s"), ({"profile": "warp"}, "profile"), ({"nap_s": 1}, "nap_s")):
        response = admin.put("/lab/v1/timings", json=bad)
        assert response.status_code == 400
        assert response.json()["message"].startswith(field)
    assert admin.patch("/lab/v1/timings", json={"boot_s": "slow"}).status_code == 400
    assert admin.get("/lab/v1/timings").json() == patched
    zeroed = admin.put("/lab/v1/timings", json={"profile": "zero"}).json()
    assert set(zeroed.values()) == {0.0}
