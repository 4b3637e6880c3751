"""find_instances_with_macs against the twin: which other BMI's host owns a MAC an Agent reports."""

from __future__ import annotations

from contracts.activities import BmaasActivity
from contracts.bmaas import FindInstancesWithMacsInput, InstanceRef, WaitInstanceRunningInput
from tests.activities.conftest import Harness


async def _running(harness: Harness, index: int, order: str) -> tuple[str, list[str]]:
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(index, order=order))
    running = await harness.run(
        harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id)
    )
    return running.bmi_id, running.macs


async def test_finds_other_bmis_by_any_nic_mac(harness: Harness) -> None:
    await harness.lab.timings(boot_s=0.05, wipe_s=30.0)  # a deleted BMI stays DELETING for the test
    mine, my_macs = await _running(harness, 0, "alpha")
    other, other_macs = await _running(harness, 0, "beta")  # any order: a NIC belongs to one host
    unknown = "0a:00:00:00:00:01"

    async def find(macs: list[str], exclude: str | None = mine) -> list[str]:
        req = FindInstancesWithMacsInput(macs=macs, exclude_bmi_id=exclude)
        return (await harness.run(harness.acts.find_instances_with_macs, req)).bmi_ids

    # The other host's second NIC, spelled the way an Agent might, among a MAC nobody owns.
    assert await find([other_macs[-1].upper().replace(":", "-"), unknown]) == [other]
    assert await find(my_macs) == []  # the worker's own BMI is excluded
    assert await find(my_macs, exclude=None) == [mine]
    assert await find([unknown]) == []

    # Being wiped, the other BMI's host still holds the NIC.
    await harness.run(harness.acts.delete_instance, InstanceRef(bmi_id=other))
    assert await find([other_macs[0]]) == [other]


def test_registered_under_its_enum_name(harness: Harness) -> None:
    names = {fn.__temporal_activity_definition.name for fn in harness.acts.all()}
    assert BmaasActivity.FIND_INSTANCES_WITH_MACS.value in names
