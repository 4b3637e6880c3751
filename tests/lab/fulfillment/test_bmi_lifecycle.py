"""A BMI's whole life: PROVISIONING → RUNNING (host booted, MACs) → DELETING → wiped → gone."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from lab.boot import BootedHost, RecordingBootSeam
from lab.fulfillment.models import BmiState
from lab.fulfillment.testing import bmi_body, fulfillment_twin, wait_until

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
TRUE = "CONDITION_STATUS_TRUE"


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        c["type"].removeprefix("BARE_METAL_INSTANCE_CONDITION_TYPE_"): c for c in obj["status"]["conditions"]
    }


def kinds(records: list[dict[str, Any]]) -> list[str]:
    return [r["kind"] for r in records]


async def _boots(seam: RecordingBootSeam) -> list[tuple[BootedHost, int]]:
    return list(seam.boots)


def test_whole_life_of_a_bmi() -> None:
    seam = RecordingBootSeam()
    secret = '{"ignition": {"config": "pull-secret-AAAA"}}'
    with (
        fulfillment_twin(hosts=2, gpu_hosts=0, boot_seam=seam) as twin,
        httpx.Client(base_url=twin.url, headers=twin.admin_headers, timeout=20) as admin,
    ):
        created = admin.post(
            BMI, json=bmi_body("life-0", user_data=secret, labels={"osac.openshift.io/cluster-order": "o1"})
        )
        assert created.status_code == 200, created.text
        bmi = created.json()
        assert bmi["status"]["state"] == BmiState.PROVISIONING.value
        assert bmi["metadata"]["tenant"] == "system"
        assert bmi["metadata"]["version"] == 1
        assert "user_data" not in bmi["spec"]

        running = wait_until(
            lambda: (
                (o := admin.get(f"{BMI}/{bmi['id']}").json())["status"]["state"] == BmiState.RUNNING.value
                and o
            ),
            what="RUNNING",
        )
        assert {name: c["status"] for name, c in conditions(running).items()} == {
            "PROVISIONED": TRUE,
            "CONFIGURATION_APPLIED": TRUE,
            "READY": TRUE,
        }
        assert running["metadata"]["version"] > 1
        macs = [n["mac"] for n in running["status"]["hardware"]["nics"]]
        boots = twin.call(_boots(seam))
        assert len(boots) == 1
        booted, size = boots[0]
        assert size == len(secret.encode())
        assert list(booted.macs) == macs
        host = admin.get(f"/lab/v1/hosts/{booted.host_id}").json()
        assert (host["state"], host["bmi_id"]) == ("ALLOCATED", bmi["id"])
        assert [n["mac"] for n in host["nics"]] == macs

        # A long wipe keeps the BMI visibly DELETING; shortening the timing finishes the wipe in progress.
        assert admin.patch("/lab/v1/timings", json={"wipe_s": 120}).status_code == 200
        assert admin.delete(f"{BMI}/{bmi['id']}").json() == {}
        deleting = admin.get(f"{BMI}/{bmi['id']}").json()
        assert deleting["status"]["state"] == BmiState.DELETING.value
        assert deleting["metadata"]["deletion_timestamp"]
        assert admin.get(f"/lab/v1/hosts/{booted.host_id}").json()["state"] == "WIPING"
        assert admin.delete(f"{BMI}/{bmi['id']}").json() == {}  # deleting again is harmless
        assert admin.patch("/lab/v1/timings", json={"wipe_s": 0}).status_code == 200
        wait_until(lambda: admin.get(f"{BMI}/{bmi['id']}").status_code == 404, what="BMI gone")
        assert admin.get(f"/lab/v1/hosts/{booted.host_id}").json()["state"] == "FREE"

        records = admin.get("/lab/v1/audit", params={"bmi_id": bmi["id"]}).json()["records"]
        assert kinds(records) == [
            "HOST_ALLOCATED",
            "HOST_BOOTED",
            "WIPE_STARTED",
            "WIPE_FINISHED",
            "HOST_RELEASED",
        ]
        assert {r["host_id"] for r in records} == {booted.host_id}
        seqs = [r["seq"] for r in records]
        assert seqs == sorted(seqs)
        assert records[1]["user_data_bytes"] == len(secret.encode())
        assert "pull-secret-AAAA" not in admin.get("/lab/v1/audit").text
        assert admin.get("/lab/v1/audit/violations").json() == {"violations": []}

        # The wiped host serves the next BMI.
        again = admin.post(BMI, json=bmi_body("life-1")).json()
        wait_until(
            lambda: admin.get(f"{BMI}/{again['id']}").json()["status"]["state"] == BmiState.RUNNING.value,
            what="second BMI RUNNING",
        )
        assert admin.get("/lab/v1/audit", params={"bmi_id": again["id"]}).json()["records"][0]["host_id"] == (
            booted.host_id
        )


def test_no_matching_host_fails_with_a_clear_message(api: Api) -> None:
    # 2 GPU hosts in the default twin of 8.
    held = [api.create(f"gpu-{i}", instance_type="bm-gpu") for i in range(3)]
    states = [
        api.wait_state(b["id"], BmiState.RUNNING if i < 2 else BmiState.FAILED) for i, b in enumerate(held)
    ]
    failed = states[2]
    message = conditions(failed)["READY"]["message"]
    assert message == "No matching hosts available"
    assert conditions(failed)["PROVISIONED"]["status"] == "CONDITION_STATUS_FALSE"
    assert "hardware" not in failed["status"]
    assert kinds(api.audit(bmi_id=failed["id"])) == ["ALLOCATION_FAILED"]
    # A FAILED BMI that never got a host goes away without a wipe.
    api.delete(failed["id"])
    api.wait_gone(failed["id"])
    assert kinds(api.audit(bmi_id=failed["id"])) == ["ALLOCATION_FAILED"]


def test_delete_before_allocation_never_allocates(api: Api) -> None:
    api.timings(allocation_s=120)
    bmi = api.create("early")
    api.delete(bmi["id"])
    api.wait_gone(bmi["id"])
    assert api.audit(bmi_id=bmi["id"]) == []
    assert all(h["state"] == "FREE" for h in api.hosts().values())


@dataclass
class StuckBootSeam:
    """A host that never finishes booting: the BMI stays PROVISIONING with its host allocated."""

    started: list[str] = field(default_factory=list)

    async def boot(self, host: BootedHost, user_data: str) -> None:
        self.started.append(host.host_id)
        await asyncio.Event().wait()

    def halt(self, host_id: str) -> None:
        pass


def test_delete_while_provisioning_wipes_the_allocated_host() -> None:
    seam = StuckBootSeam()
    with (
        fulfillment_twin(hosts=1, gpu_hosts=0, boot_seam=seam) as twin,
        httpx.Client(base_url=twin.url, headers=twin.admin_headers, timeout=20) as admin,
    ):
        bmi = admin.post(BMI, json=bmi_body("stuck")).json()
        wait_until(lambda: seam.started, what="boot started")
        assert admin.get(f"{BMI}/{bmi['id']}").json()["status"]["state"] == BmiState.PROVISIONING.value
        assert admin.get("/lab/v1/hosts/host-001").json()["state"] == "ALLOCATED"
        assert admin.delete(f"{BMI}/{bmi['id']}").json() == {}
        wait_until(lambda: admin.get(f"{BMI}/{bmi['id']}").status_code == 404, what="BMI gone")
        records = admin.get("/lab/v1/audit", params={"bmi_id": bmi["id"]}).json()["records"]
        assert kinds(records) == ["HOST_ALLOCATED", "WIPE_STARTED", "WIPE_FINISHED", "HOST_RELEASED"]
        assert admin.get("/lab/v1/hosts/host-001").json()["state"] == "FREE"
        assert admin.get("/lab/v1/audit/violations").json() == {"violations": []}


def test_boot_seam_errors_fail_the_bmi_and_keep_the_host_until_deleted() -> None:
    class BrokenSeam:
        async def boot(self, host: BootedHost, user_data: str) -> None:
            raise RuntimeError(f"could not boot with {user_data}")

        def halt(self, host_id: str) -> None:
            pass

    with (
        fulfillment_twin(hosts=1, gpu_hosts=0, boot_seam=BrokenSeam()) as twin,
        httpx.Client(base_url=twin.url, headers=twin.admin_headers, timeout=20) as admin,
    ):
        bmi = admin.post(BMI, json=bmi_body("broken", user_data="top-secret-ignition")).json()
        failed = wait_until(
            lambda: (
                (o := admin.get(f"{BMI}/{bmi['id']}").json())["status"]["state"] == BmiState.FAILED.value
                and o
            ),
            what="FAILED",
        )
        assert conditions(failed)["READY"]["message"].startswith("Provisioning failed")
        assert "top-secret-ignition" not in admin.get("/lab/v1/audit").text
        assert admin.get("/lab/v1/hosts/host-001").json()["state"] == "ALLOCATED"
        admin.delete(f"{BMI}/{bmi['id']}")
        wait_until(lambda: admin.get(f"{BMI}/{bmi['id']}").status_code == 404, what="BMI gone")
        assert admin.get("/lab/v1/hosts/host-001").json()["state"] == "FREE"
        assert admin.get("/lab/v1/audit/violations").json() == {"violations": []}
