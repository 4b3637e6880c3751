"""create_worker_instance, list_order_instances and resolve_boot_image against the twin."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from contracts.bmaas import (
    ORDER_LABEL,
    ORDER_NAMESPACE_LABEL,
    OWNER_ANNOTATION,
    ApplySecurityGroupsInput,
    BmaasErrorType,
    BmiState,
    FindLostInstancesInput,
    InstanceRef,
    ListOrderInstancesInput,
    LostInstance,
    ResolveBootImageInput,
    WaitInstanceGoneInput,
    WaitInstanceRunningInput,
)
from contracts.refs import OrderRef
from lab.fulfillment.seed import CLUSTER_VERSION_NAME, DISK_IMAGE_NAME, RELEASE_IMAGE, seeded_id
from lab.fulfillment.testing import bmi_body
from tests.activities.conftest import PRIVATE, Harness, wait_for


def _named(kind: str, name: str) -> dict[str, str]:
    """A reference as BMaaS stores it once resolved (the twin's seeded objects)."""
    return {"id": seeded_id(kind, name), "name": name}


async def test_create_builds_the_osac_bmi(harness: Harness) -> None:
    result = await harness.run(harness.acts.create_worker_instance, harness.slot(2))
    assert result.created and result.instance.name == "order1-worker-2"
    assert result.user_data_bytes == len(harness.ignition.ignition.encode())
    assert not result.user_data_size_warning
    assert harness.ignition.calls == [("tenant-ns", "order1-infraenv")]

    bmi = await harness.lab.get_bmi(result.instance.id)
    assert bmi is not None
    meta, spec = bmi["metadata"], bmi["spec"]
    assert meta["tenant"] == "system"
    assert meta["labels"] == {ORDER_LABEL: "order1", ORDER_NAMESPACE_LABEL: "tenant-ns"}
    assert meta["annotations"] == {OWNER_ANNOTATION: "ClusterOrder/order1"}
    assert spec["instance_type"] == "bm-standard"
    assert spec["image"] == {"source_type": "disk_image", "source_ref": harness.disk_image_id}
    assert spec["catalog_item"]["name"] == "caas-system-bmi"
    # The order names Subnet and SecurityGroup CRs: sent by name, stored resolved as `{id, name}`.
    assert spec["network_attachments"] == [
        {
            "subnet": _named("subnet", "subnet-1"),
            "security_groups": [_named("security_group", "sg-1"), _named("security_group", "sg-2")],
            "interface": "data-0",  # the first fabric port of bm-standard
            "primary": True,
        }
    ]
    assert "user_data" not in spec  # the twin never answers it; we never asked for it back


async def test_create_twice_is_one_bmi(harness: Harness) -> None:
    first = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    second = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    assert first.created and not second.created
    assert second.instance.id == first.instance.id
    # The adopting attempt found the BMI before fetching any secret.
    assert len(harness.ignition.calls) == 1
    assert len(await harness.lab.list_bmis(f"this.metadata.name == '{first.instance.name}'")) == 1


async def test_concurrent_creates_make_one_bmi_via_already_exists(harness: Harness) -> None:
    # Both attempts list (nothing there) and fetch the ignition before either posts: one POST must then
    # answer AlreadyExists and that attempt adopts the winner's BMI.
    arrived = 0
    both_listed = asyncio.Event()

    async def barrier() -> None:
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            both_listed.set()
        await asyncio.wait_for(both_listed.wait(), 20)

    harness.ignition.hook = barrier
    results = await asyncio.gather(
        harness.run(harness.acts.create_worker_instance, harness.slot(1)),
        harness.run(harness.acts.create_worker_instance, harness.slot(1)),
    )
    assert sorted(r.created for r in results) == [False, True]
    assert results[0].instance.id == results[1].instance.id
    assert len(await harness.lab.list_bmis("this.metadata.name == 'order1-worker-1'")) == 1
    stats = await harness.lab.stats()
    assert stats["POST /api/private/v1/baremetal_instances"] == 2


@pytest.mark.parametrize("echo", ["quoted", "text"])
async def test_a_refused_create_whose_answer_quotes_the_user_data_keeps_none_of_it(
    harness: Harness, echo: str
) -> None:
    """A server's error may quote the request's user data (the discovery ignition, with the pull
    secret): escaped, or in a plain-text page longer than the bound on messages. None of it reaches
    the error Temporal stores; what the server said around it does."""
    harness.ignition.padding = "port 22 open; " * 40
    route = {"error_rate": 1.0, "error_code": 3, "echo_user_data": echo}
    await harness.lab.faults(routes={f"POST {PRIVATE}/baremetal_instances": route})
    with pytest.raises(ApplicationError) as refused:
        await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    message = refused.value.message
    assert refused.value.type == BmaasErrorType.INVALID_ARGUMENT.value and refused.value.non_retryable
    assert "lab fault: injected error" in message and "<redacted>" in message, message
    ignition = harness.ignition.ignition
    assert len(ignition) > 400
    assert [ignition[i : i + 16] for i in range(len(ignition) - 15) if ignition[i : i + 16] in message] == []


async def test_adopts_on_already_exists(harness: Harness) -> None:
    # Another creator wins the name between our list and our create.
    racer_id: list[str] = []

    async def racer() -> None:
        resp = await harness.lab.post(
            "/baremetal_instances", bmi_body("order1-worker-5", labels={ORDER_LABEL: "order1"})
        )
        assert resp.status_code == 200, resp.text
        racer_id.append(resp.json()["id"])

    harness.ignition.hook = racer
    result = await harness.run(harness.acts.create_worker_instance, harness.slot(5))
    assert not result.created
    assert result.instance.id == racer_id[0]


@pytest.mark.parametrize("race", [False, True], ids=["there-before", "wins-the-race"])
async def test_a_bmi_of_a_same_named_order_in_another_namespace_is_never_adopted(
    harness: Harness, race: bool
) -> None:
    """BMaaS knows orders by name: another namespace's order1 holds the slot's BMI name. Whether
    it was there before or wins the name meanwhile, the create refuses for good and names it."""
    labels = {ORDER_LABEL: "order1", ORDER_NAMESPACE_LABEL: "other-ns"}

    async def other() -> None:
        resp = await harness.lab.post("/baremetal_instances", bmi_body("order1-worker-5", labels=labels))
        assert resp.status_code == 200, resp.text

    if race:
        harness.ignition.hook = other
    else:
        await other()
    with pytest.raises(ApplicationError) as refused:
        await harness.run(harness.acts.create_worker_instance, harness.slot(5))
    assert refused.value.type == BmaasErrorType.ALREADY_EXISTS.value and refused.value.non_retryable
    assert "belongs to ClusterOrder other-ns/order1, not tenant-ns/order1" in refused.value.message
    (bmi,) = [h for h in await harness.lab.hosts() if h["bmi_id"]]  # only the other order's
    untouched = await harness.lab.get_bmi(bmi["bmi_id"])
    assert untouched is not None and untouched["metadata"]["labels"] == labels


async def test_a_bmi_not_of_the_order_holding_the_slot_name_fails_the_call_for_good(
    harness: Harness,
) -> None:
    """A BMI made by hand (no order labels) holds the slot's name: the POST answers AlreadyExists
    and the order has no BMI of that name. Retrying the call could never create the slot, so it
    fails non-retryable with the holder named; the holder is neither adopted nor touched."""
    resp = await harness.lab.post("/baremetal_instances", bmi_body("order1-worker-5"))
    assert resp.status_code == 200, resp.text
    foreign = resp.json()

    with pytest.raises(ApplicationError) as refused:
        await harness.run(harness.acts.create_worker_instance, harness.slot(5))
    assert refused.value.type == BmaasErrorType.ALREADY_EXISTS.value and refused.value.non_retryable
    assert f"BMI order1-worker-5 ({foreign['id']}) is not a worker of order tenant-ns/order1" in (
        refused.value.message
    )
    assert [b["id"] for b in await harness.lab.list_bmis()] == [foreign["id"]]  # nothing else made
    untouched = await harness.lab.get_bmi(foreign["id"])
    assert untouched is not None and untouched["metadata"]["labels"] == {}


async def test_a_name_freed_after_already_exists_is_retried(harness: Harness) -> None:
    """The race: the POST answers AlreadyExists for a BMI not of the order, which is deleted and gone
    before the activity lists who holds the name. Nothing holds it any more, so the conflict stays
    retryable (the next attempt creates the slot). The activity's lists are held (a hang fault on
    the list route, set once its first list is done) while the holder is deleted; clearing the
    fault answers the held list 503, which the client retries."""
    resp = await harness.lab.post("/baremetal_instances", bmi_body("order1-worker-5"))
    assert resp.status_code == 200, resp.text
    foreign_id = resp.json()["id"]
    list_route = "GET /api/private/v1/baremetal_instances"
    post_route = "POST /api/private/v1/baremetal_instances"

    async def hold_lists() -> None:  # between the activity's first list and its POST
        await harness.lab.faults(routes={list_route: {"hang_rate": 1.0}})

    posts_before = (await harness.lab.stats())[post_route]  # the holder's

    async def list_held_after_the_post() -> bool:
        resp = await harness.lab.http.get("/lab/v1/stats")
        resp.raise_for_status()
        sent, in_flight = resp.json()["requests"], resp.json()["in_flight"]
        posted = sent.get(post_route) == posts_before + 1 and not in_flight.get(post_route)
        return posted and bool(in_flight.get(list_route))

    harness.ignition.hook = hold_lists
    create = asyncio.create_task(harness.run(harness.acts.create_worker_instance, harness.slot(5)))
    try:
        await wait_for(list_held_after_the_post, what="the list after the POST held")
        await harness.run(harness.acts.delete_instance, InstanceRef(bmi_id=foreign_id))
        await wait_for(lambda: _gone(harness, foreign_id), what="the holder gone")
    finally:
        await harness.lab.clear_faults()
    with pytest.raises(ApplicationError) as conflict:
        await create
    assert conflict.value.type == BmaasErrorType.CONFLICT.value and not conflict.value.non_retryable
    assert await harness.lab.list_bmis() == []  # the POST made nothing; the next attempt creates it

    again = await harness.run(harness.acts.create_worker_instance, harness.slot(5))
    assert again.created and again.instance.name == "order1-worker-5"


async def _gone(harness: Harness, bmi_id: str) -> bool:
    return await harness.lab.get_bmi(bmi_id) is None


async def test_deleting_bmi_of_the_slot_is_not_adopted(harness: Harness) -> None:
    await harness.lab.timings(wipe_s=30.0)  # keep it DELETING for the test
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    await harness.run(
        harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id)
    )
    await harness.run(harness.acts.delete_instance, InstanceRef(bmi_id=created.instance.id))

    with pytest.raises(ApplicationError) as info:
        await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    assert info.value.type == BmaasErrorType.INSTANCE_DELETING.value
    assert not info.value.non_retryable  # the workflow waits it gone, then retries


async def test_slot_is_recreated_after_the_old_bmi_is_gone(harness: Harness) -> None:
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(3))
    await harness.run(harness.acts.delete_instance, InstanceRef(bmi_id=created.instance.id))
    gone = await harness.run(
        harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=created.instance.id)
    )
    assert gone.bmi_id == created.instance.id
    again = await harness.run_retrying(harness.acts.create_worker_instance, harness.slot(3))
    assert again.created and again.instance.id != created.instance.id


async def test_list_order_instances(harness: Harness) -> None:
    for index in (1, 0):
        await harness.run(harness.acts.create_worker_instance, harness.slot(index, order="alpha"))
    await harness.run(harness.acts.create_worker_instance, harness.slot(0, order="beta"))
    # A system BMI without the order label must not be listed.
    resp = await harness.lab.post("/baremetal_instances", bmi_body("alpha-worker-9"))
    assert resp.status_code == 200, resp.text

    listed = await harness.run(
        harness.acts.list_order_instances,
        ListOrderInstancesInput(order=OrderRef(namespace="tenant-ns", name="alpha")),
    )
    assert [i.name for i in listed.instances] == ["alpha-worker-0", "alpha-worker-1"]
    assert all(i.order_name == "alpha" and i.instance_type == "bm-standard" for i in listed.instances)
    assert all(i.state in set(BmiState) for i in listed.instances)
    # Each with its NICs' MACs (a released slot's Agent registrations are found by them).
    assert all(i.macs and i.macs == sorted(i.macs) for i in listed.instances)
    one = await harness.run(
        harness.acts.list_order_instances,
        ListOrderInstancesInput(order=OrderRef(namespace="tenant-ns", name="alpha"), name="alpha-worker-1"),
    )
    assert [i.name for i in one.instances] == ["alpha-worker-1"]
    # By the MACs of a host (in any spelling): the BMI holding it, and when the list was asked for.
    before = datetime.now(UTC)
    spelled = [mac.upper().replace(":", "-") for mac in one.instances[0].macs[:1]]
    holder = await harness.run(
        harness.acts.list_order_instances,
        ListOrderInstancesInput(order=OrderRef(namespace="tenant-ns", name="alpha"), macs=spelled),
    )
    assert [i.name for i in holder.instances] == ["alpha-worker-1"]
    assert holder.listed_at is not None and before <= holder.listed_at <= datetime.now(UTC)


async def test_find_lost_instances_names_failed_deleted_and_gone_bmis_only(harness: Harness) -> None:
    order = OrderRef(namespace="tenant-ns", name="lost")
    ids = [
        (await harness.run(harness.acts.create_worker_instance, harness.slot(i, order="lost"))).instance.id
        for i in range(4)
    ]
    broken, deleted, relabelled, _healthy = ids
    resp = await harness.lab.http.post(f"/lab/v1/baremetal_instances/{broken}/break")
    assert resp.status_code == 200, resp.text
    await harness.run(harness.acts.delete_instance, InstanceRef(bmi_id=deleted))
    # An admin dropped its labels: no longer in the order's list, yet its host runs.
    resp = await harness.lab.http.patch(
        f"/api/private/v1/baremetal_instances/{relabelled}",
        params={"update_mask": "metadata.labels"},
        json={"metadata": {"labels": {"note": "moved by hand"}}},
    )
    assert resp.status_code == 200, resp.text
    listed = await harness.run(harness.acts.list_order_instances, ListOrderInstancesInput(order=order))
    assert relabelled not in {i.id for i in listed.instances}
    never = "00000000-0000-4000-8000-000000000000"

    found = await harness.run(
        harness.acts.find_lost_instances, FindLostInstancesInput(order=order, bmi_ids=[*ids, never])
    )
    lost = {item.bmi_id: item.state for item in found.lost}
    assert lost.keys() == {broken, deleted, never}
    assert lost[broken] == BmiState.FAILED
    assert lost[deleted] in (BmiState.DELETING, None)  # being wiped, or wiped and gone
    assert lost[never] is None
    assert "is gone" in LostInstance(bmi_id=never).describe()

    with pytest.raises(ValueError):
        FindLostInstancesInput(order=order, bmi_ids=[])


async def test_apply_security_groups_changes_only_the_groups_of_the_orders_live_bmis(
    harness: Harness,
) -> None:
    order = OrderRef(namespace="tenant-ns", name="groups")
    ids = [
        (await harness.run(harness.acts.create_worker_instance, harness.slot(i, order="groups"))).instance.id
        for i in range(3)
    ]
    live, broken, deleting = ids
    other = (
        await harness.run(harness.acts.create_worker_instance, harness.slot(0, order="bystander"))
    ).instance.id
    resp = await harness.lab.http.post(f"/lab/v1/baremetal_instances/{broken}/break")
    assert resp.status_code == 200, resp.text
    await harness.run(harness.acts.delete_instance, InstanceRef(bmi_id=deleting))

    def groups(bmi: dict[str, Any] | None) -> list[Any]:
        assert bmi is not None
        return [a["security_groups"] for a in bmi["spec"]["network_attachments"]]

    before = await harness.lab.get_bmi(live)
    applied = await harness.run(
        harness.acts.apply_security_groups, ApplySecurityGroupsInput(order=order, security_groups=("sg-3",))
    )
    assert applied.bmi_ids == [live]
    after = await harness.lab.get_bmi(live)
    assert after is not None and before is not None
    assert groups(after) == [[_named("security_group", "sg-3")]]
    # Nothing else of the attachment moved: the subnet, the fabric port, the primary flag.
    assert [
        {k: v for k, v in a.items() if k != "security_groups"} for a in after["spec"]["network_attachments"]
    ] == [
        {k: v for k, v in a.items() if k != "security_groups"} for a in before["spec"]["network_attachments"]
    ]
    first = [_named("security_group", "sg-1"), _named("security_group", "sg-2")]
    assert groups(await harness.lab.get_bmi(broken)) == [first]
    assert groups(await harness.lab.get_bmi(other)) == [first]

    again = await harness.run(
        harness.acts.apply_security_groups, ApplySecurityGroupsInput(order=order, security_groups=("sg-3",))
    )
    # Idempotent: a retry or the next check changes nothing (the stored groups carry ids as well as
    # the names asked for).
    assert again.bmi_ids == []
    cleared = await harness.run(harness.acts.apply_security_groups, ApplySecurityGroupsInput(order=order))
    assert cleared.bmi_ids == [live]
    assert groups(await harness.lab.get_bmi(live)) == [[]]


async def test_resolve_boot_image(harness: Harness) -> None:
    image = await harness.run(
        harness.acts.resolve_boot_image, ResolveBootImageInput(release_image=RELEASE_IMAGE)
    )
    assert image.disk_image_id == seeded_id("disk_image", DISK_IMAGE_NAME)
    assert image.disk_image_name == DISK_IMAGE_NAME
    assert image.cluster_version == seeded_id("cluster_version", CLUSTER_VERSION_NAME)


async def test_resolve_boot_image_missing(harness: Harness) -> None:
    with pytest.raises(ApplicationError) as info:
        await harness.run(
            harness.acts.resolve_boot_image,
            ResolveBootImageInput(release_image="quay.io/x/ocp-release:9.9.9"),
        )
    assert info.value.type == BmaasErrorType.RHCOS_IMAGE_NOT_FOUND.value and info.value.non_retryable

    # A ClusterVersion that links no disk image.
    unlinked = "quay.io/openshift-release-dev/ocp-release:4.19.0-x86_64"
    resp = await harness.lab.post(
        "/cluster_versions",
        {"metadata": {"name": "4.19.0"}, "spec": {"image": unlinked, "version": "4.19.0"}},
    )
    assert resp.status_code == 200, resp.text
    with pytest.raises(ApplicationError) as info:
        await harness.run(harness.acts.resolve_boot_image, ResolveBootImageInput(release_image=unlinked))
    assert info.value.type == BmaasErrorType.RHCOS_IMAGE_NOT_FOUND.value and info.value.non_retryable
    assert "links no disk image" in info.value.message


async def test_wait_sees_bmis_created_before_the_watcher(harness: Harness) -> None:
    # A BMI that exists before the worker started is known through the gap-closing list.
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(7))
    await harness.watcher.stop()
    harness.watcher.start()
    await harness.watcher.wait_streaming(20.0)
    assert await wait_for(lambda: _known(harness, created.instance.id), what="BMI listed")


async def _known(harness: Harness, bmi_id: str) -> bool:
    return harness.watcher.observed(bmi_id) is not None


async def test_workers_resolving_at_once_share_one_lookup(harness: Harness) -> None:
    """A scale-up's workers resolve the same release at the same moment: one ClusterVersion list
    and one DiskImage read serve them all."""
    before = await harness.lab.stats()
    images = await asyncio.gather(
        *(
            harness.run(harness.acts.resolve_boot_image, ResolveBootImageInput(release_image=RELEASE_IMAGE))
            for _ in range(5)
        )
    )
    assert {i.disk_image_id for i in images} == {seeded_id("disk_image", DISK_IMAGE_NAME)}
    after = await harness.lab.stats()
    sent = {
        route: after[route] - before.get(route, 0) for route in after if after[route] != before.get(route, 0)
    }
    assert sent == {
        "GET /api/private/v1/cluster_versions": 1,
        "GET /api/private/v1/disk_images/{id}": 1,
    }


async def test_a_create_posts_only_within_its_attempt(harness: Harness) -> None:
    """Once a create's attempt timed out, the workflow looks for the slot's BMI (a scale-down then
    ends the worker): a POST sent or answered after that would leave a BMI nobody owns, allocated
    for good. So the POST keeps to what is left of the attempt, less a margin."""
    short = harness.env()
    short.info = dataclasses.replace(short.info, start_to_close_timeout=timedelta(seconds=2))

    async def slow_steps() -> None:  # the lookups before the POST take most of the attempt
        await asyncio.sleep(1.2)

    harness.ignition.hook = slow_steps
    with pytest.raises(ApplicationError) as late:
        await harness.run(harness.acts.create_worker_instance, harness.slot(3), env=short)
    assert late.value.type == BmaasErrorType.UNAVAILABLE.value and not late.value.non_retryable
    names = {b["metadata"]["name"] for b in await harness.lab.list_bmis()}
    assert "order1-worker-3" not in names  # never sent

    # A POST still unanswered near the attempt's end is given up as a retryable error; the next
    # attempt adopts the BMI if the service made it after all.
    harness.ignition.hook = None
    slow = harness.env()
    # Seconds for the lookups before the POST, so the POST is sent even on a loaded machine.
    slow.info = dataclasses.replace(slow.info, start_to_close_timeout=timedelta(seconds=5))
    await harness.lab.faults(routes={"POST /api/private/v1/baremetal_instances": {"latency_s": 6.0}})
    try:
        with pytest.raises(ApplicationError) as unanswered:
            await harness.run(harness.acts.create_worker_instance, harness.slot(4), env=slow)
        assert unanswered.value.type == BmaasErrorType.TRANSPORT.value and not unanswered.value.non_retryable
    finally:
        await harness.lab.clear_faults()
    again = await harness.run(harness.acts.create_worker_instance, harness.slot(4))
    assert again.instance.name == "order1-worker-4"
