"""Host allocation: exclusive under concurrent creates, wiped before reuse, quarantined when a wipe fails."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from lab.fulfillment.audit import AuditKind, AuditRecord, find_violations
from lab.fulfillment.models import BmiState
from lab.fulfillment.testing import bmi_body, fulfillment_twin, wait_until
from lab.fulfillment.timings import Timings

if TYPE_CHECKING:
    from .conftest import Api

BMI = "/api/private/v1/baremetal_instances"
RUNNING, FAILED = BmiState.RUNNING.value, BmiState.FAILED.value


def settled(client: httpx.Client) -> dict[str, str] | None:
    items = client.get(BMI, params={"limit": 1000}).json()["items"]
    states = {o["id"]: o["status"]["state"] for o in items}
    return states if all(s in (RUNNING, FAILED) for s in states.values()) else None


@pytest.mark.parametrize(
    "timings",
    [Timings(), Timings(allocation_s=0.05, image_write_s=0.01, boot_s=0.01, wipe_s=0.02)],
    ids=["zero", "tens-of-ms"],
)
def test_concurrent_creates_never_share_a_host(timings: Timings) -> None:
    with (
        fulfillment_twin(hosts=5, gpu_hosts=0, timings=timings) as twin,
        httpx.Client(base_url=twin.url, headers=twin.admin_headers, timeout=30) as admin,
        # One connection per thread: 20 creates really are in flight at once.
        ThreadPoolExecutor(max_workers=20) as pool,
    ):

        def create(name: str) -> int:
            return httpx.post(
                twin.url + BMI, json=bmi_body(name), headers=twin.admin_headers, timeout=30
            ).status_code

        assert list(pool.map(create, [f"race-{i}" for i in range(20)])) == [200] * 20
        states = wait_until(lambda: settled(admin), what="all BMIs settled")
        assert Counter(states.values()) == {RUNNING: 5, FAILED: 15}
        allocations = admin.get("/lab/v1/audit", params={"kind": "HOST_ALLOCATED"}).json()["records"]
        assert len(allocations) == 5
        assert len({r["host_id"] for r in allocations}) == 5
        assert {r["bmi_id"] for r in allocations} == {i for i, s in states.items() if s == RUNNING}
        failures = admin.get("/lab/v1/audit", params={"kind": "ALLOCATION_FAILED"}).json()["records"]
        assert {r["bmi_id"] for r in failures} == {i for i, s in states.items() if s == FAILED}
        for bmi_id, state in states.items():
            if state == FAILED:
                obj = admin.get(f"{BMI}/{bmi_id}").json()
                ready = next(c for c in obj["status"]["conditions"] if c["type"].endswith("_READY"))
                assert ready["message"] == "No matching hosts available"

        # Delete everything at once, then recreate: hosts come back only after their wipe.
        def delete(bmi_id: str) -> int:
            return httpx.delete(
                f"{twin.url}{BMI}/{bmi_id}", headers=twin.admin_headers, timeout=30
            ).status_code

        assert set(pool.map(delete, list(states))) == {200}
        wait_until(lambda: admin.get(BMI).json()["total"] == 0, what="all deleted")
        assert list(pool.map(create, [f"again-{i}" for i in range(8)])) == [200] * 8
        states = wait_until(lambda: settled(admin), what="second round settled")
        assert Counter(states.values()) == {RUNNING: 5, FAILED: 3}
        assert admin.get("/lab/v1/audit/violations").json() == {"violations": []}
        hosts = admin.get("/lab/v1/hosts").json()["items"]
        assert sorted(h["bmi_id"] for h in hosts) == sorted(i for i, s in states.items() if s == RUNNING)


def test_failed_wipe_quarantines_the_host_for_good(api: Api, admin: httpx.Client) -> None:
    first = api.create("victim")
    running = api.wait_state(first["id"], BmiState.RUNNING)
    host_id = api.audit(bmi_id=first["id"], kind="HOST_ALLOCATED")[0]["host_id"]
    api.faults(wipe_failure_hosts=[host_id])
    api.delete(first["id"])

    def quarantined() -> dict[str, Any] | None:
        obj = api.get(first["id"]).json()
        ready = next(c for c in obj["status"]["conditions"] if c["type"].endswith("_READY"))
        return obj if ready.get("reason") == "HostSanitizationFailed" else None

    stuck = wait_until(quarantined, what="wipe failure visible")
    assert stuck["status"]["state"] == BmiState.DELETING.value
    ready = next(c for c in stuck["status"]["conditions"] if c["type"].endswith("_READY"))
    assert "wipe" in ready["message"] and "quarantined" in ready["message"]
    host = api.hosts()[host_id]
    assert host["state"] == "QUARANTINED"
    assert host["quarantine_reason"]
    kinds = [r["kind"] for r in api.audit(host_id=host_id)]
    assert kinds[-3:] == ["WIPE_STARTED", "WIPE_FAILED", "HOST_QUARANTINED"]
    assert "HOST_RELEASED" not in kinds
    assert running["status"]["hardware"]["nics"]

    # Clearing the fault does not bring the host back: the other 5 standard hosts serve, a 6th BMI fails.
    api.faults()
    standard_free = [
        h
        for h in api.hosts().values()
        if h["state"] == "FREE" and h["labels"]["osac.openshift.io/host-class"] == "standard"
    ]
    assert len(standard_free) == 5

    def final_state(bmi_id: str) -> str | None:
        state = api.get(bmi_id).json()["status"]["state"]
        return state if state in (RUNNING, FAILED) else None

    created = [api.create(f"after-{i}") for i in range(6)]
    states = [wait_until(partial(final_state, b["id"]), what="settled") for b in created]
    assert Counter(states) == {RUNNING: 5, FAILED: 1}
    allocated_hosts = {r["host_id"] for r in api.audit(kind="HOST_ALLOCATED") if r["bmi_id"] != first["id"]}
    assert host_id not in allocated_hosts
    assert api.violations() == []
    # Deleting again changes nothing: the BMI stays DELETING, the host stays quarantined.
    api.delete(first["id"])
    assert api.get(first["id"]).json()["status"]["state"] == BmiState.DELETING.value


def test_violation_checker_catches_double_allocation_and_unwiped_reuse() -> None:
    now = datetime.now(UTC)
    seq = iter(range(1, 100))

    def rec(kind: AuditKind, host: str, bmi: str) -> AuditRecord:
        return AuditRecord(seq=next(seq), time=now, kind=kind, host_id=host, bmi_id=bmi)

    good = [
        rec(AuditKind.HOST_ALLOCATED, "h1", "a"),
        rec(AuditKind.WIPE_STARTED, "h1", "a"),
        rec(AuditKind.WIPE_FINISHED, "h1", "a"),
        rec(AuditKind.HOST_RELEASED, "h1", "a"),
        rec(AuditKind.HOST_ALLOCATED, "h1", "b"),
    ]
    assert find_violations(good) == []
    double = [rec(AuditKind.HOST_ALLOCATED, "h2", "c"), rec(AuditKind.HOST_ALLOCATED, "h2", "d")]
    assert any("while held by c" in v for v in find_violations(double))
    unwiped = [
        rec(AuditKind.HOST_ALLOCATED, "h3", "e"),
        rec(AuditKind.WIPE_STARTED, "h3", "e"),
        rec(AuditKind.HOST_RELEASED, "h3", "e"),
    ]
    assert any("without a finished wipe" in v for v in find_violations(unwiped))
    reused = [
        rec(AuditKind.HOST_ALLOCATED, "h4", "f"),
        rec(AuditKind.WIPE_FAILED, "h4", "f"),
        rec(AuditKind.HOST_QUARANTINED, "h4", "f"),
        rec(AuditKind.HOST_ALLOCATED, "h4", "g"),
    ]
    assert any("quarantined host h4" in v for v in find_violations(reused))
