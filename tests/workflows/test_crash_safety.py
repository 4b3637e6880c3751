"""Crash safety: the worker is a real process, SIGKILLed mid-provisioning and mid-deprovisioning.

After each restart every slot ends with exactly one BMI, no host is allocated twice and no host is
released unwiped (the fulfillment twin's audit proves both). The orders' policy gives the
activities short timeouts, so the killed worker's calls and waits move to the next one within
seconds instead of OSAC's 60 s and 30 s; every scheduled activity carries them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import certifi
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from contracts.refs import OrderRef
from lab.fulfillment.timings import Timings
from tests.workflows.stack import Stack, eventually, fast_policy, running_stack

# Slow enough that a kill lands inside allocation, boot and wipe.
SLOW_BMAAS = Timings(allocation_s=0.5, image_write_s=0.5, boot_s=1.0, wipe_s=2.0, deprovision_s=0.5)
CALL_TIMEOUT = timedelta(seconds=10)
WAIT_HEARTBEAT_TIMEOUT = timedelta(seconds=5)


@pytest.fixture(scope="module")
async def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    workdir = tmp_path_factory.mktemp("crash")
    policy = fast_policy(call_timeout=CALL_TIMEOUT, wait_heartbeat_timeout=WAIT_HEARTBEAT_TIMEOUT)
    async with running_stack(
        temporal_env.client, workdir, policy=policy, bmaas_timings=SLOW_BMAAS, in_process_worker=False
    ) as running:
        yield running


@contextmanager
def worker_process(
    stack: Stack, log: Path, extra_env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    s = stack.settings
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": stack.client.namespace,
        "OSAC_FULFILLMENT_URL": s.fulfillment_url,
        "OSAC_FULFILLMENT_TOKEN_FILE": str(s.fulfillment_token_file),
        "KUBECONFIG": str(s.kubeconfig),
        "OSAC_TASK_QUEUE": s.task_queue,
        "OSAC_BMAAS_TASK_QUEUE": s.bmaas_task_queue,
        "OSAC_GRACEFUL_SHUTDOWN_SECONDS": "1",
        # A task that reaches a killed worker's sticky queue waits this long for it (see Settings).
        "OSAC_STICKY_QUEUE_TIMEOUT_SECONDS": "5",
        **(extra_env or {}),
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "osac-workers"), "worker"], env=env, stdout=out, stderr=out
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


async def _assert_the_policy_timed_every_activity(stack: Stack, order: OrderRef) -> None:
    """Calls end by the policy's call timeout, waits by its heartbeat timeout (never OSAC's)."""
    calls: set[str] = set()
    waits: set[str] = set()
    for history in await stack.histories(order):
        for event in history.events:
            if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                continue
            attrs = event.activity_task_scheduled_event_attributes
            name = attrs.activity_type.name
            if attrs.heartbeat_timeout.ToTimedelta():
                assert attrs.heartbeat_timeout.ToTimedelta() == WAIT_HEARTBEAT_TIMEOUT, name
                waits.add(name)
            else:
                assert attrs.start_to_close_timeout.ToTimedelta() == CALL_TIMEOUT, name
                calls.add(name)
    assert "create_worker_instance" in calls and "wait_instance_gone" in waits, (calls, waits)


async def _assert_one_bmi_per_slot_and_clean_audit(stack: Stack, bmis: list[dict]) -> None:
    per_name = Counter(b["metadata"]["name"] for b in bmis)
    assert all(count == 1 for count in per_name.values()), per_name
    assert await stack.audit_violations() == []


async def test_worker_killed_mid_provisioning_and_mid_deprovisioning(stack: Stack, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    order = await stack.create_order({"bm-standard": 3})

    with worker_process(stack, log) as first:
        await stack.apply(order, {"bm-standard": 3})

        async def provisioning_under_way() -> bool:
            bmis = await stack.bmis(order)
            return any(b["status"].get("state", "").endswith("PROVISIONING") for b in bmis)

        await eventually(provisioning_under_way, "a BMI being provisioned")
        kill(first)

    with worker_process(stack, log) as second:
        status = await stack.wait_ready(order, 3, timeout=180)
        bmis = await stack.bmis(order)
        assert len(bmis) == 3
        await _assert_one_bmi_per_slot_and_clean_audit(stack, bmis)
        assert {b["id"] for b in bmis} == {w.resource_id for w in status.workers}
        await stack.api.decommission(order)

        async def deprovisioning_under_way() -> bool:
            bmis = await stack.bmis(order)
            return any(b["status"].get("state", "").endswith("DELETING") for b in bmis)

        await eventually(deprovisioning_under_way, "a host being wiped")
        kill(second)

    with worker_process(stack, log):
        final = await asyncio.wait_for(stack.api.wait_finished(order), 180)
    assert final.finished and final.workers == []
    assert await stack.bmis(order) == []
    assert await stack.agents(order.namespace) == []
    assert await stack.audit_violations() == []
    audit = await stack.audit()
    ours = [r for r in audit if r.get("bmi_name", "").startswith(order.name)]
    allocated = {r["bmi_id"] for r in ours if r["kind"] == "HOST_ALLOCATED"}
    wiped = {r["bmi_id"] for r in audit if r["kind"] == "WIPE_FINISHED"}
    assert allocated and allocated <= wiped
    await _assert_the_policy_timed_every_activity(stack, order)
    # Nothing secret in what the worker logged along the way (ignition URLs carry a token).
    logged = log.read_text(errors="replace")
    for secret in ("api_key=", "PULL_SECRET_TOKEN", stack.fulfillment.admin_token, stack.lab.hub.token):
        assert secret not in logged


def _write_bundle(path: Path, extra: str = "") -> None:
    path.write_text(Path(certifi.where()).read_text() + extra)


async def test_a_rotated_ca_bundle_restarts_the_worker_after_a_graceful_stop(
    stack: Stack, tmp_path: Path
) -> None:
    """TLS material read only at start (the BMaaS CA bundle here; Temporal's mTLS files the same
    way): once the file changes the worker drains and exits with ROTATED_EXIT_CODE, for its
    supervisor to start it again with the new material."""
    from worker.rotation import ROTATED_EXIT_CODE

    bundle = tmp_path / "ca.pem"
    _write_bundle(bundle)
    log = tmp_path / "worker.log"
    with worker_process(stack, log, {"OSAC_FULFILLMENT_CA_FILE": str(bundle)}) as worker:

        async def running() -> bool:
            assert worker.poll() is None, log.read_text()
            return "worker running on task queues" in log.read_text()

        await eventually(running, "the worker running", timeout=120)
        _write_bundle(bundle, "\n")  # cert-manager renewed it

        async def exited() -> bool:
            return worker.poll() is not None

        await eventually(exited, "the worker stopped for the rotated bundle", timeout=120)
        assert worker.returncode == ROTATED_EXIT_CODE, log.read_text()
        text = log.read_text()
        assert "ca.pem changed (a rotated certificate or key)" in text
        assert "stopping: finishing in-flight work" in text
