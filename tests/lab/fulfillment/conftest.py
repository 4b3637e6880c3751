"""Fixtures for the fulfillment twin tests: a fresh seeded twin per test, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from lab.fulfillment.models import BmiState
from lab.fulfillment.testing import RunningFulfillmentTwin, bmi_body, fulfillment_twin, wait_until

BMI = "/api/private/v1/baremetal_instances"
PUBLIC_BMI = "/api/fulfillment/v1/baremetal_instances"
TIMEOUT = 20.0  # generous: the machine running the tests may be slow and noisy


@dataclass
class Api:
    """A thin admin-side client with the waits every test needs."""

    client: httpx.Client

    def create(self, name: str, **kwargs: Any) -> dict[str, Any]:
        response = self.client.post(BMI, json=bmi_body(name, **kwargs))
        assert response.status_code == 200, response.text
        created: dict[str, Any] = response.json()
        return created

    def get(self, bmi_id: str) -> httpx.Response:
        return self.client.get(f"{BMI}/{bmi_id}")

    def wait_state(self, bmi_id: str, state: BmiState, timeout: float = TIMEOUT) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            response = self.get(bmi_id)
            assert response.status_code == 200, response.text
            obj: dict[str, Any] = response.json()
            return obj if obj["status"]["state"] == state.value else None

        return wait_until(probe, timeout=timeout, what=f"BMI {bmi_id} in {state.name}")

    def wait_gone(self, bmi_id: str, timeout: float = TIMEOUT) -> None:
        wait_until(lambda: self.get(bmi_id).status_code == 404, timeout=timeout, what=f"BMI {bmi_id} gone")

    def delete(self, bmi_id: str) -> None:
        response = self.client.delete(f"{BMI}/{bmi_id}")
        assert response.status_code == 200, response.text
        assert response.json() == {}

    def audit(self, **params: Any) -> list[dict[str, Any]]:
        response = self.client.get("/lab/v1/audit", params=params)
        assert response.status_code == 200, response.text
        records: list[dict[str, Any]] = response.json()["records"]
        return records

    def violations(self) -> list[str]:
        found: list[str] = self.client.get("/lab/v1/audit/violations").json()["violations"]
        return found

    def hosts(self) -> dict[str, dict[str, Any]]:
        return {h["id"]: h for h in self.client.get("/lab/v1/hosts").json()["items"]}

    def faults(self, **config: Any) -> dict[str, Any]:
        response = self.client.put("/lab/v1/faults", json=config)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def timings(self, **timings: float) -> None:
        response = self.client.patch("/lab/v1/timings", json=timings)
        assert response.status_code == 200, response.text


@pytest.fixture
def twin() -> Iterator[RunningFulfillmentTwin]:
    # Zero timings: every step happens as soon as the loop gets to it.
    with fulfillment_twin(hosts=8, tenants=("tenant-a", "tenant-b")) as running:
        yield running


@pytest.fixture
def admin(twin: RunningFulfillmentTwin) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=twin.url, headers=twin.admin_headers, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
def api(admin: httpx.Client) -> Api:
    return Api(admin)


@pytest.fixture
def tenant_a(twin: RunningFulfillmentTwin) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=twin.url, headers=twin.headers_for("tenant-a"), timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
def tenant_b(twin: RunningFulfillmentTwin) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=twin.url, headers=twin.headers_for("tenant-b"), timeout=TIMEOUT) as client:
        yield client
