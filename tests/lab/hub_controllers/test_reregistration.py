"""A host still running the discovery image registers again when its Agent is deleted; a host BMaaS
powered off for its wipe (its BMI deleted) never registers again, nor one whose install started.

An absence is shown against a control: a host in discovery whose Agent is deleted right after the
one under test. Agent deletions reach the seam in order, so once the control registered again the
seam has handled the first deletion; any registration it started then is still pending or recorded.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from lab.boot import RecordingBootSeam
from lab.fulfillment.inventory import FABRIC_PORT, MANAGEMENT_PORT
from lab.fulfillment.models import PortRole
from lab.fulfillment.seed import host_labels
from lab.fulfillment.testing import RunningFulfillmentTwin, bmi_body, fulfillment_twin, start_fulfillment_twin
from lab.hub_controllers.agent_boot import BootOutcome, BootRecord, agent_host_id, still_in_discovery
from lab.hub_controllers.constants import HostState
from lab.hub_controllers.faults import AgentFaults, FaultTarget, SlowRegistration
from lab.hub_controllers.resources import AGENTS
from lab.hub_controllers.testing import (
    Lab,
    agent_macs,
    create_infra_env,
    fetch_ignition,
    macs_for,
    wait_agent,
    wait_state,
    wait_until,
)

BMIS = "/api/private/v1/baremetal_instances"
DEADLINE_S = 90.0  # a noisy 2-core machine runs other suites beside this one
RUNNING = "BARE_METAL_INSTANCE_STATE_RUNNING"
Obj = dict[str, Any]
SetFaults = Callable[[AgentFaults], None]


@pytest.fixture(scope="module")
def bmaas(lab: Lab) -> Iterator[RunningFulfillmentTwin]:
    twin = start_fulfillment_twin(hosts=0, boot_seam=lab.boot_seam)
    try:
        # Host ids and MACs of their own: the seam and its records are the whole session's, and
        # other twins' seeded hosts all have the same ones.
        for index in range(8):
            management, fabric = _random_macs(2)
            host = {
                "id": f"rr-host-{index}",
                "labels": host_labels("standard"),
                "nics": [
                    {"name": MANAGEMENT_PORT, "mac": management, "role": PortRole.MANAGEMENT.value},
                    {"name": FABRIC_PORT, "mac": fabric, "role": PortRole.FABRIC.value},
                ],
            }
            httpx.post(
                f"{twin.url}/lab/v1/hosts", json=host, headers=twin.admin_headers, timeout=30
            ).raise_for_status()
        yield twin
    finally:
        twin.stop()


# -- helpers ----------------------------------------------------------------------------------------


def _random_macs(count: int) -> tuple[str, ...]:
    """Locally administered six-byte MACs (`macs_for` gives five bytes, which BMaaS refuses)."""
    return tuple(":".join(f"{b:02x}" for b in (0x02, *secrets.token_bytes(5))) for _ in range(count))


def _records(lab: Lab, host_id: str, since: int) -> list[BootRecord]:
    """The host's boot records written after `since` (the seam is shared by the whole session)."""
    return [r for r in list(lab.boot_seam.records)[since:] if r.host_id == host_id]


def _again(lab: Lab, host_id: str, since: int) -> list[BootRecord]:
    return [r for r in _records(lab, host_id, since) if r.again]


def _registered(lab: Lab, host_id: str, since: int) -> BootRecord:
    return wait_until(
        lambda: next(
            (r for r in _records(lab, host_id, since) if r.outcome is BootOutcome.REGISTERED and not r.again),
            None,
        ),
        f"the registration of {host_id}",
        DEADLINE_S,
    )


def _create_bmi(twin: RunningFulfillmentTwin, name: str, user_data: str) -> str:
    response = httpx.post(
        f"{twin.url}{BMIS}", json=bmi_body(name, user_data=user_data), headers=twin.admin_headers, timeout=30
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def _running_host(twin: RunningFulfillmentTwin, bmi_id: str) -> str:
    """Wait for the BMI to run (its host booted) and return its host's id."""

    def probe() -> str | None:
        bmi = httpx.get(f"{twin.url}{BMIS}/{bmi_id}", headers=twin.admin_headers, timeout=30).json()
        if (bmi.get("status") or {}).get("state") != RUNNING:
            return None
        hosts = httpx.get(f"{twin.url}/lab/v1/hosts", headers=twin.admin_headers, timeout=30).json()["items"]
        return next((str(h["id"]) for h in hosts if h.get("bmi_id") == bmi_id), None)

    return wait_until(probe, f"BMI {bmi_id} running", DEADLINE_S)


def _delete_bmi(twin: RunningFulfillmentTwin, bmi_id: str) -> None:
    """Delete the BMI and wait until it is gone: its host was wiped and released."""
    httpx.delete(f"{twin.url}{BMIS}/{bmi_id}", headers=twin.admin_headers, timeout=30).raise_for_status()
    wait_until(
        lambda: (
            httpx.get(f"{twin.url}{BMIS}/{bmi_id}", headers=twin.admin_headers, timeout=30).status_code == 404
        ),
        f"BMI {bmi_id} wiped and gone",
        DEADLINE_S,
    )


def _discovery_bmi(
    lab: Lab, ns: str, twin: RunningFulfillmentTwin, name: str, ignition: str
) -> tuple[str, str]:
    """A BMI whose host booted the discovery ignition and whose Agent is known-unbound: (BMI, host)."""
    since = len(lab.boot_seam.records)
    bmi_id = _create_bmi(twin, name, ignition)
    host_id = _running_host(twin, bmi_id)
    wait_state(lab.client, ns, agent_host_id(host_id), HostState.KNOWN_UNBOUND, DEADLINE_S)
    _registered(lab, host_id, since)
    return bmi_id, host_id


def _booted(lab: Lab, ns: str, host_id: str, macs: tuple[str, ...], ignition: str) -> Obj:
    """A host booted straight through the seam (no BMI), its Agent known-unbound."""
    since = len(lab.boot_seam.records)
    lab.boot(host_id, macs, ignition)
    _registered(lab, host_id, since)
    return wait_state(lab.client, ns, agent_host_id(host_id), HostState.KNOWN_UNBOUND, DEADLINE_S)


def _delete_and_wait_back(lab: Lab, ns: str, host_id: str, since: int) -> Obj:
    """Delete the host's Agent and wait until the host registered it again."""
    name = agent_host_id(host_id)
    before = lab.client.get(AGENTS, ns, name)
    assert before is not None
    rounds = len(_again(lab, host_id, since))
    lab.client.delete(AGENTS, ns, name)
    back = wait_agent(
        lab.client,
        ns,
        name,
        lambda a: a["metadata"]["uid"] != before["metadata"]["uid"] and bool(agent_macs(a)),
        "registered again",
        DEADLINE_S,
    )
    wait_until(lambda: len(_again(lab, host_id, since)) > rounds, f"{host_id} registering again", DEADLINE_S)
    return back


def _assert_stays_gone(lab: Lab, ns: str, host_id: str, since: int, agent_name: str | None = None) -> None:
    name = agent_name or agent_host_id(host_id)
    assert lab.client.get(AGENTS, ns, name) is None
    assert _again(lab, host_id, since) == []
    assert lab.boot_seam.pending(host_id) == 0


def _records_and_ignition(lab: Lab, ns: str) -> tuple[int, str]:
    """How many boot records there are so far, and the discovery ignition of a new InfraEnv."""
    return len(lab.boot_seam.records), fetch_ignition(lab.client, create_infra_env(lab.client, ns))


def _bind(lab: Lab, ns: str, name: str) -> None:
    cluster = {"name": "c1", "namespace": ns}
    lab.client.patch(AGENTS, ns, name, {"spec": {"approved": True, "clusterDeploymentName": cluster}})


# -- through the fulfillment twin -------------------------------------------------------------------


def test_deleting_the_agent_of_a_host_in_discovery_brings_it_back(
    lab: Lab, ns: str, bmaas: RunningFulfillmentTwin
) -> None:
    since, ignition = _records_and_ignition(lab, ns)
    _, host_id = _discovery_bmi(lab, ns, bmaas, "again-worker", ignition)
    name = agent_host_id(host_id)
    first = lab.client.get(AGENTS, ns, name)
    assert first is not None

    uids = {first["metadata"]["uid"]}
    for _ in range(2):  # deleted again once it is back: it comes back again
        back = _delete_and_wait_back(lab, ns, host_id, since)
        assert back["metadata"]["name"] == name
        assert back["metadata"]["uid"] not in uids
        uids.add(back["metadata"]["uid"])
        assert agent_macs(back) == agent_macs(first)
        wait_state(lab.client, ns, name, HostState.KNOWN_UNBOUND, DEADLINE_S)

    again = _again(lab, host_id, since)
    assert [r.outcome for r in again] == [BootOutcome.REGISTERED] * 2
    assert {r.agent_name for r in again} == {name}
    assert all(set(r.macs) == agent_macs(first) and r.duplicate_of is None for r in again)
    assert [a["metadata"]["name"] for a in lab.client.list(AGENTS, ns)] == [name]


def test_a_host_whose_bmi_was_deleted_does_not_come_back(
    lab: Lab, ns: str, bmaas: RunningFulfillmentTwin
) -> None:
    since, ignition = _records_and_ignition(lab, ns)
    gone_bmi, gone = _discovery_bmi(lab, ns, bmaas, "wiped-worker", ignition)
    _, control = _discovery_bmi(lab, ns, bmaas, "control-worker", ignition)

    _delete_bmi(bmaas, gone_bmi)
    # BMaaS never touches the hub: the Agent of the wiped host stays until someone deletes it.
    assert lab.client.get(AGENTS, ns, agent_host_id(gone)) is not None
    lab.client.delete(AGENTS, ns, agent_host_id(gone))
    _delete_and_wait_back(lab, ns, control, since)

    _assert_stays_gone(lab, ns, gone, since)


def test_a_bmi_deleted_while_its_host_is_registering_never_makes_an_agent(
    lab: Lab, ns: str, bmaas: RunningFulfillmentTwin, faults: SetFaults
) -> None:
    since, ignition = _records_and_ignition(lab, ns)
    faults(AgentFaults(slow_registration=SlowRegistration(rate=1.0, extra_delay_s=3600)))
    bmi_id = _create_bmi(bmaas, "slow-worker", ignition)
    host_id = _running_host(bmaas, bmi_id)
    wait_until(lambda: lab.boot_seam.pending(host_id) == 1, "the host's registration pending", DEADLINE_S)

    _delete_bmi(bmaas, bmi_id)
    wait_until(lambda: lab.boot_seam.pending(host_id) == 0, "the pending registration cancelled", DEADLINE_S)
    assert [r.outcome for r in _records(lab, host_id, since)] == [BootOutcome.HALTED]
    assert lab.client.list(AGENTS, ns) == []


# -- hosts booted straight through the seam ---------------------------------------------------------


def test_an_agent_whose_install_started_does_not_come_back(lab: Lab, ns: str) -> None:
    since, ignition = _records_and_ignition(lab, ns)
    hosts = {
        name: macs_for(i) for i, name in enumerate(("host-rr-installed", "host-rr-released", "host-rr-ctl"))
    }
    for name, macs in hosts.items():
        _booted(lab, ns, name, macs, ignition)
    _bind(lab, ns, "host-rr-installed")
    _bind(lab, ns, "host-rr-released")
    wait_state(lab.client, ns, "host-rr-installed", HostState.ADDED_TO_EXISTING_CLUSTER, DEADLINE_S)
    wait_state(lab.client, ns, "host-rr-released", HostState.ADDED_TO_EXISTING_CLUSTER, DEADLINE_S)
    # Unbound after its install: the host booted its disk and waits to be rebooted into discovery.
    lab.client.patch(AGENTS, ns, "host-rr-released", {"spec": {"clusterDeploymentName": None}})
    wait_state(lab.client, ns, "host-rr-released", HostState.UNBINDING_PENDING_USER_ACTION, DEADLINE_S)

    lab.client.delete(AGENTS, ns, "host-rr-installed")
    lab.client.delete(AGENTS, ns, "host-rr-released")
    _delete_and_wait_back(lab, ns, "host-rr-ctl", since)

    _assert_stays_gone(lab, ns, "host-rr-installed", since)
    _assert_stays_gone(lab, ns, "host-rr-released", since)


def test_the_phantom_agent_of_a_duplicate_mac_is_never_registered_again(
    lab: Lab, ns: str, faults: SetFaults
) -> None:
    since, ignition = _records_and_ignition(lab, ns)
    faults(AgentFaults(duplicate_mac=FaultTarget(agents=["host-rr-twin"])))
    lab.boot("host-rr-twin", macs_for(1), ignition)
    phantom = wait_until(
        lambda: next((r for r in _records(lab, "host-rr-twin", since) if r.duplicate_of), None),
        "the phantom's registration",
        DEADLINE_S,
    )
    assert phantom.agent_name is not None
    wait_state(lab.client, ns, phantom.agent_name, HostState.KNOWN_UNBOUND, DEADLINE_S)
    _booted(lab, ns, "host-rr-twin-ctl", macs_for(2), ignition)

    lab.client.delete(AGENTS, ns, phantom.agent_name)
    _delete_and_wait_back(lab, ns, "host-rr-twin-ctl", since)

    _assert_stays_gone(lab, ns, "host-rr-twin", since, phantom.agent_name)
    assert lab.client.get(AGENTS, ns, "host-rr-twin") is not None  # the real one is untouched


@pytest.mark.parametrize(
    ("state", "again"),
    [
        (None, True),
        *[(s, True) for s in ("discovering-unbound", "known-unbound", "binding", "discovering", "known")],
        *[(s, True) for s in ("insufficient-unbound", "unbinding", "pending-for-input")],
        *[
            (s, False)
            for s in (
                "installing",
                "installing-in-progress",
                "installing-pending-user-action",
                "added-to-existing-cluster",
                "error",
                "unbinding-pending-user-action",
            )
        ],
    ],
)
def test_only_a_host_still_in_discovery_registers_again(state: str | None, again: bool) -> None:
    status: Obj = {"debugInfo": {"state": state}} if state else {}
    assert still_in_discovery({"metadata": {"name": "h"}, "status": status}) is again


# -- the fulfillment twin halts the hosts it wipes ----------------------------------------------------


def test_deleting_a_bmi_halts_its_host() -> None:
    seam = RecordingBootSeam()
    with fulfillment_twin(hosts=1, gpu_hosts=0, boot_seam=seam) as twin:
        bmi_id = _create_bmi(twin, "halted", '{"ignition": {"version": "3.4.0"}}')
        host_id = _running_host(twin, bmi_id)
        assert seam.halted == []
        _delete_bmi(twin, bmi_id)
        assert seam.halted == [host_id]
        audit = httpx.get(
            f"{twin.url}/lab/v1/audit", params={"bmi_id": bmi_id}, headers=twin.admin_headers, timeout=30
        ).json()["records"]
        assert [r["kind"] for r in audit][-3:] == ["WIPE_STARTED", "WIPE_FINISHED", "HOST_RELEASED"]
