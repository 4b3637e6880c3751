"""The two twins meet: a BMI whose user data is the discovery ignition becomes an Agent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from lab.fulfillment.testing import RunningFulfillmentTwin, bmi_body, start_fulfillment_twin
from lab.hub_controllers.agent_boot import BootOutcome, agent_host_id
from lab.hub_controllers.constants import HostState
from lab.hub_controllers.resources import AGENTS
from lab.hub_controllers.testing import (
    Lab,
    agent_macs,
    create_infra_env,
    fetch_ignition,
    wait_state,
    wait_until,
)

BMIS = "/api/private/v1/baremetal_instances"


@pytest.fixture(scope="module")
def bmaas(lab: Lab) -> Iterator[RunningFulfillmentTwin]:
    twin = start_fulfillment_twin(hosts=4, boot_seam=lab.boot_seam)
    try:
        yield twin
    finally:
        twin.stop()


def _create_bmi(twin: RunningFulfillmentTwin, name: str, user_data: str) -> dict[str, Any]:
    response = httpx.post(
        f"{twin.url}{BMIS}", json=bmi_body(name, user_data=user_data), headers=twin.admin_headers
    )
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


def _running_bmi(twin: RunningFulfillmentTwin, bmi_id: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        bmi: dict[str, Any] = httpx.get(f"{twin.url}{BMIS}/{bmi_id}", headers=twin.admin_headers).json()
        nics = (bmi.get("status") or {}).get("hardware", {}).get("nics") or []
        return bmi if nics and bmi["status"].get("state") == "BARE_METAL_INSTANCE_STATE_RUNNING" else None

    return wait_until(probe, f"BMI {bmi_id} running with NICs")


def test_bmi_booting_the_ignition_registers_an_agent_with_its_macs(
    lab: Lab, ns: str, bmaas: RunningFulfillmentTwin
) -> None:
    infra_env = create_infra_env(lab.client, ns)
    bmi = _running_bmi(bmaas, _create_bmi(bmaas, "o1-worker-0", fetch_ignition(lab.client, infra_env))["id"])
    bmi_macs = {nic["mac"] for nic in bmi["status"]["hardware"]["nics"]}

    def registered() -> dict[str, Any] | None:
        agents = lab.client.list(AGENTS, ns)
        return agents[0] if agents else None

    agent = wait_until(registered, "the Agent of the BMI's host")
    agent = wait_state(lab.client, ns, agent["metadata"]["name"], HostState.KNOWN_UNBOUND)
    assert agent_macs(agent) == bmi_macs
    records = [r for r in list(lab.boot_seam.records) if r.agent_name == agent["metadata"]["name"]]
    assert records and agent["metadata"]["name"] == agent_host_id(records[0].host_id)


def test_bmi_with_other_user_data_registers_nothing(lab: Lab, ns: str, bmaas: RunningFulfillmentTwin) -> None:
    infra_env = create_infra_env(lab.client, ns)
    plain = _running_bmi(
        bmaas, _create_bmi(bmaas, "plain-worker", '{"ignition": {"version": "3.4.0"}}')["id"]
    )
    plain_macs = tuple(nic["mac"] for nic in plain["status"]["hardware"]["nics"])
    # A discovery BMI booted after it registers; the plain one never does.
    real = _running_bmi(bmaas, _create_bmi(bmaas, "o2-worker-0", fetch_ignition(lab.client, infra_env))["id"])
    real_macs = {nic["mac"] for nic in real["status"]["hardware"]["nics"]}
    # The Agent is created first and gets its inventory in a status write right after.
    agents = wait_until(
        lambda: [a for a in lab.client.list(AGENTS, ns) if agent_macs(a)], "the discovery BMI's Agent"
    )
    assert agent_macs(agents[0]) == real_macs
    plain_records = wait_until(
        lambda: [r for r in list(lab.boot_seam.records) if set(r.macs) == set(plain_macs)], "the plain boot"
    )
    assert [r.outcome for r in plain_records] == [BootOutcome.NOT_DISCOVERY]
    assert len(lab.client.list(AGENTS, ns)) == 1
