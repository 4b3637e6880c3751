"""The error taxonomy end to end, token handling, and the secrets promise."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from activities.bmaas import BmaasActivities, BmaasClient, BmiWatcher
from contracts.bmaas import (
    BmaasErrorType,
    FindInstancesWithMacsInput,
    FindLostInstancesInput,
    InstanceRef,
    ListOrderInstancesInput,
    WaitInstanceGoneInput,
    WaitInstanceRunningInput,
)
from contracts.refs import OrderRef
from lab.fulfillment.testing import bmi_body
from tests.activities.conftest import PRIVATE, Harness

ORDER = ListOrderInstancesInput(order=OrderRef(namespace="tenant-ns", name="order1"))
# The Ready workers' check: a refusal is retried (shown on the order), never given up on.
READY_CHECK = FindLostInstancesInput(order=ORDER.order, bmi_ids=["bmi-ready"])
# The sweep after a wipe, which is best effort: a refusal fails it at once.
SWEEP = ListOrderInstancesInput(order=ORDER.order, macs=["0a:00:00:00:00:77"], give_up_on_refusal=True)


async def _error(harness: Harness, fn: object, arg: object) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await harness.run(fn, arg)  # type: ignore[arg-type]
    return info.value


async def test_wrong_token_is_unauthenticated(harness: Harness) -> None:
    harness.token_file.write_text("not-the-admin-token-at-all\n")
    err = await _error(harness, harness.acts.list_order_instances, SWEEP)
    assert err.type == BmaasErrorType.UNAUTHENTICATED.value and err.non_retryable
    assert "not-the-admin-token-at-all" not in err.message
    harness.secrets.append("not-the-admin-token-at-all")


async def test_tenant_token_is_permission_denied(harness: Harness) -> None:
    harness.token_file.write_text(harness.twin.tenant_token)
    harness.secrets.append(harness.twin.tenant_token)
    err = await _error(harness, harness.acts.list_order_instances, SWEEP)
    assert err.type == BmaasErrorType.PERMISSION_DENIED.value and err.non_retryable


@pytest.mark.parametrize("refused", ["wrong-token", "tenant-token"])
async def test_refusals_while_a_host_is_allocated_are_retried_not_fatal(
    harness: Harness, refused: str
) -> None:
    """A 401 (a token rotation the file has not followed yet) or a 403 (a role a rollout forgot)
    while a host is allocated to the attempt: its wait and its NIC check retry instead of failing
    the attempt, which would delete the BMI and wipe a healthy host. Elsewhere a refusal still fails
    at once (test_wrong_token_is_unauthenticated)."""
    token = "not-the-admin-token-at-all" if refused == "wrong-token" else harness.twin.tenant_token
    harness.secrets.append(token)
    harness.token_file.write_text(token + "\n")

    calls = [
        # A BMI the watcher has not seen yet, so the wait asks BMaaS for it.
        (harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id="bmi-not-seen-yet")),
        (harness.acts.find_instances_with_macs, FindInstancesWithMacsInput(macs=["0a:00:00:00:00:77"])),
        # The release: its delete, and its wait for the wipe of a BMI the watcher has not seen.
        (harness.acts.delete_instance, InstanceRef(bmi_id="bmi-leaving")),
        (harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id="bmi-leaving")),
        # A restarted release's look for the slot's BMIs (and the sweep's after the wipe).
        (harness.acts.list_order_instances, ORDER.model_copy(update={"name": "order1-worker-0"})),
        # The order's check of its Ready workers' hosts: given up on, a lost host went unnoticed.
        (harness.acts.find_lost_instances, READY_CHECK),
    ]
    for fn, arg in calls:
        err = await _error(harness, fn, arg)
        assert err.type in {BmaasErrorType.UNAUTHENTICATED.value, BmaasErrorType.PERMISSION_DENIED.value}
        assert not err.non_retryable, (fn, err.message)
    assert token not in err.message
    # The sweep after a wipe is best effort: it gives up on a refusal at once.
    err = await _error(harness, harness.acts.list_order_instances, SWEEP)
    assert err.non_retryable and token not in err.message


async def test_token_rotation_is_picked_up(harness: Harness) -> None:
    await harness.run(harness.acts.list_order_instances, ORDER)
    rotated = "rotated-admin-token-0123456789abcdef"
    harness.secrets.append(rotated)

    async def rotate() -> None:
        harness.twin.lab.config.admin_token = rotated

    harness.twin.call(rotate())
    # The server moved on; until the file follows, calls are refused...
    err = await _error(harness, harness.acts.find_lost_instances, READY_CHECK)
    assert err.type == BmaasErrorType.UNAUTHENTICATED.value
    # ...and once the mounted secret is updated, the same client uses it without a restart.
    harness.token_file.write_text(rotated + "\n")
    listed = await harness.run(harness.acts.list_order_instances, ORDER)
    assert listed.instances == []


async def test_unknown_instance_type_is_invalid_argument(harness: Harness) -> None:
    # With a network attachment the activity looks the type up itself (for the fabric port)...
    err = await _error(harness, harness.acts.create_worker_instance, harness.slot(0, instance_type="bm-nope"))
    assert err.type == BmaasErrorType.INVALID_ARGUMENT.value and err.non_retryable
    assert "bm-nope" in err.message
    assert harness.ignition.calls == []  # refused before any secret was fetched
    # ...without one, BMaaS refuses the create (InvalidArgument from the server, its message kept).
    bare = harness.slot(0, instance_type="bm-nope").model_copy(update={"network_attachment": None})
    err = await _error(harness, harness.acts.create_worker_instance, bare)
    assert err.type == BmaasErrorType.INVALID_ARGUMENT.value and err.non_retryable
    assert "spec.instance_type" in err.message


async def test_no_hosts_is_no_hosts_available(harness: Harness) -> None:
    await harness.lab.faults(no_free_hosts=True)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    err = await _error(
        harness, harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=created.instance.id)
    )
    assert err.type == BmaasErrorType.NO_HOSTS_AVAILABLE.value and err.non_retryable
    assert "No matching hosts available" in err.message


async def test_failed_provisioning_is_bmi_provisioning_failed(harness: Harness) -> None:
    await harness.lab.faults(provisioning_failure_rate=1.0)
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    ref = WaitInstanceRunningInput(bmi_id=created.instance.id)
    err = await _error(harness, harness.acts.wait_instance_running, ref)
    assert err.type == BmaasErrorType.PROVISIONING_FAILED.value and err.non_retryable
    assert "ProvisioningFailed" in err.message
    # The failed BMI is released like any other; its old failure is not mistaken for a stuck wipe.
    await harness.run(harness.acts.delete_instance, ref)
    gone = await harness.run(harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=ref.bmi_id))
    assert not gone.was_stuck


async def test_ignition_too_large_is_refused_before_create(harness: Harness) -> None:
    harness.ignition.secret = "S" * (70 * 1024)
    harness.secrets.append(harness.ignition.secret)
    err = await _error(harness, harness.acts.create_worker_instance, harness.slot(0))
    assert err.type == BmaasErrorType.IGNITION_TOO_LARGE.value and err.non_retryable
    assert await harness.lab.list_bmis() == []


async def test_waiting_on_unknown_or_foreign_bmis(harness: Harness) -> None:
    err = await _error(
        harness, harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id="no-such-bmi")
    )
    assert err.type == BmaasErrorType.NOT_FOUND.value and err.non_retryable
    # A BMI outside the watcher's scope (no order label) would never be woken: refused at once.
    resp = await harness.lab.post("/baremetal_instances", bmi_body("stray-0"))
    err = await _error(
        harness, harness.acts.wait_instance_running, WaitInstanceRunningInput(bmi_id=resp.json()["id"])
    )
    assert err.type == BmaasErrorType.INVALID_ARGUMENT.value and err.non_retryable


async def test_a_not_found_from_a_list_or_create_route_is_retried(harness: Harness) -> None:
    """A gateway not serving the collection route yet (a rollout) answers 404 with code 5: the Ready
    workers' NIC check, a release's list and a create wait it out instead of failing for good, which
    would release and wipe a healthy host."""
    not_found = {"error_rate": 1.0, "error_code": 5}
    await harness.lab.faults(routes={f"GET {PRIVATE}/baremetal_instances": not_found})
    calls = [
        (harness.acts.find_instances_with_macs, FindInstancesWithMacsInput(macs=["0a:00:00:00:00:77"])),
        (harness.acts.list_order_instances, ORDER),
        (harness.acts.find_lost_instances, READY_CHECK),
        (harness.acts.create_worker_instance, harness.slot(0)),  # its look for the slot's BMI
    ]
    for fn, arg in calls:
        err = await _error(harness, fn, arg)
        assert err.type == BmaasErrorType.UNAVAILABLE.value and not err.non_retryable, (fn, err.message)
        assert "route not served" in err.message
    # The create's POST itself.
    await harness.lab.faults(routes={f"POST {PRIVATE}/baremetal_instances": not_found})
    err = await _error(harness, harness.acts.create_worker_instance, harness.slot(0))
    assert err.type == BmaasErrorType.UNAVAILABLE.value and not err.non_retryable, err.message
    assert "POST" in err.message and "route not served" in err.message
    # Served again: the next attempt creates the slot's BMI.
    await harness.lab.clear_faults()
    created = await harness.run(harness.acts.create_worker_instance, harness.slot(0))
    assert created.created


async def test_hanging_calls_time_out_retryably(harness: Harness) -> None:
    client = BmaasClient(harness.twin.url, harness.token_file, timeout=1.0)
    acts = BmaasActivities(client, BmiWatcher(client), harness.ignition)
    try:
        await harness.lab.faults(routes={"GET /api/private/v1/baremetal_instances": {"hang_rate": 1.0}})
        err = await _error(harness, acts.list_order_instances, ORDER)
        assert err.type == BmaasErrorType.TRANSPORT.value and not err.non_retryable
        await harness.lab.faults(routes={"GET /api/private/v1/baremetal_instances": {"error_rate": 1.0}})
        # The harness's client (10 s): a 503 slower than a second on a loaded machine is still one.
        err = await _error(harness, harness.acts.list_order_instances, ORDER)
        assert err.type == BmaasErrorType.UNAVAILABLE.value and not err.non_retryable
        assert "injected error" in err.message  # the server's message is kept
    finally:
        await client.aclose()


async def test_full_life_leaks_no_secret(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await harness.lab.timings(boot_s=0.3, wipe_s=0.3)
    await harness.lab.faults(error_rate=0.2, seed=3)
    created = await harness.run_retrying(harness.acts.create_worker_instance, harness.slot(0))
    ref = WaitInstanceRunningInput(bmi_id=created.instance.id)
    await harness.run_retrying(harness.acts.wait_instance_running, ref)
    await harness.run_retrying(harness.acts.delete_instance, ref)
    await harness.run_retrying(harness.acts.wait_instance_gone, WaitInstanceGoneInput(bmi_id=ref.bmi_id))
    await harness.lab.clear_faults()
    # And the failure paths: a server-side refusal and a bad token.
    bare = harness.slot(1, instance_type="bm-nope").model_copy(update={"network_attachment": None})
    await _error(harness, harness.acts.create_worker_instance, bare)
    harness.token_file.write_text("wrong-token-wrong-token\n")
    await _error(harness, harness.acts.create_worker_instance, harness.slot(2))
    assert harness.heartbeats and harness.results and harness.errors
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert harness.leaked(text) == []


async def test_a_token_that_cannot_see_the_canary_stops_the_worker_at_start(harness: Harness) -> None:
    """Against the twin: its seeded pass-through item is seen, so the worker starts. One the token
    cannot see (named here as if it were the canary) stops it with a message saying why, before any
    NotFound could be taken for a host gone."""
    from types import SimpleNamespace
    from typing import Any, cast

    from worker.main import BackendRejectedCredentials, check_credentials
    from worker.settings import Settings

    settings = Settings(fulfillment_url=harness.twin.url, fulfillment_token_file=harness.token_file)
    for canary, sees in (("caas-system-bmi", True), ("no-such-item", False)):
        client = BmaasClient(harness.twin.url, harness.token_file, visibility_canary=canary)
        try:
            assert await client.sees_system_objects() is sees
            backends = cast(Any, SimpleNamespace(bmaas_client=client))
            if sees:
                await check_credentials(backends, settings)
            else:
                with pytest.raises(BackendRejectedCredentials, match="does not see the system-owned catalog"):
                    await check_credentials(backends, settings)
        finally:
            await client.aclose()


@pytest.mark.parametrize("content", [None, "  \n"], ids=["missing", "empty"])
async def test_a_token_file_missing_or_empty_stops_the_worker_at_start(
    harness: Harness, tmp_path: Path, content: str | None
) -> None:
    """It was logged as "BMaaS is not answering" and the worker started, every call then refused."""
    from types import SimpleNamespace
    from typing import Any, cast

    from worker.main import BackendRejectedCredentials, check_credentials
    from worker.settings import Settings

    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    settings = Settings(fulfillment_url=harness.twin.url, fulfillment_token_file=token_file)
    client = BmaasClient(harness.twin.url, token_file)
    try:
        with pytest.raises(BackendRejectedCredentials) as err:
            await check_credentials(cast(Any, SimpleNamespace(bmaas_client=client)), settings)
        assert str(token_file) in str(err.value) and "OSAC_FULFILLMENT_TOKEN_FILE" in str(err.value)
    finally:
        await client.aclose()
