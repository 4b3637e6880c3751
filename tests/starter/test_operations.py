"""The library behind `scale-down` (`OrderOperations` over `WorkersApi`) against a stack with a
running controller: the ClusterOrder and the workflow keep agreeing, and only the named worker goes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contracts.refs import OrderRef
from starter.api import CommandError
from starter.operations import OrderOperations
from starter.orders import HubOrders
from starter.validation import InstanceTypeCatalog
from tests.starter.harness import (
    UNMANAGED,
    RunningController,
    bare_metal,
    create_order,
    get_order,
    patch_order,
    wait_observed,
    wait_ready,
)
from tests.workflows.stack import Stack, eventually


def operations(stack: Stack, ctl: RunningController) -> OrderOperations:
    return OrderOperations(stack.api, HubOrders(ctl.kube), InstanceTypeCatalog(ctl.bmaas))


def count_of(obj: dict[str, Any] | None, instance_type: str) -> int:
    for request in (obj or {})["spec"]["nodeRequests"]:
        if (request.get("bareMetal") or {}).get("instanceType") == instance_type:
            return int(request["numberOfNodes"])
    raise AssertionError(f"no node request {instance_type}")


async def only_workers(stack: Stack, ref: OrderRef, names: set[str]) -> None:
    async def probe() -> bool:
        status = await stack.api.status(ref)
        return {w.name for w in status.workers} == names and status.ready_workers == len(names)

    await eventually(probe, f"exactly {sorted(names)} Ready", timeout=120)


async def test_a_named_scale_down_repeated_at_once_releases_no_other_worker(
    stack: Stack, ctl: RunningController
) -> None:
    """The same command again (a retry, a second operator) while the worker is still leaving is
    refused: lowering the count once more would make the workflow release a Ready worker nobody named.
    Two operators at the same moment: exactly one is told the worker leaves, and lowers the count
    (with a signal, both could be told it was already leaving, the order left unlowered, and the
    controller would then bring a replacement)."""
    ref = await create_order(stack, bare_metal(bm_standard=3))
    await wait_ready(stack, ref, 3)
    ops = operations(stack, ctl)
    w0, w1, w2 = (ref.worker_name(i) for i in range(3))

    # BMaaS refuses the release's DELETE until the faults are cleared: the worker stays leaving
    # (released in a moment, a third call would find it gone rather than leaving).
    await stack.set_bmaas_faults(
        routes={"DELETE /api/private/v1/baremetal_instances/{id}": {"error_rate": 1.0}}
    )
    try:
        outcomes = await asyncio.gather(
            ops.scale_down_worker(ref, w2), ops.scale_down_worker(ref, w2), return_exceptions=True
        )
        [first] = [o for o in outcomes if not isinstance(o, BaseException)]
        [refused] = [o for o in outcomes if isinstance(o, BaseException)]
        assert isinstance(refused, CommandError) and "is already leaving" in str(refused), refused
        assert (first.name, first.count) == ("bm-standard", 2)
        with pytest.raises(CommandError, match=f"{w2} of order {ref.key} is already leaving"):
            await ops.scale_down_worker(ref, w2)
    finally:
        await stack.clear_bmaas_faults()
    assert count_of(await get_order(stack, ref), "bm-standard") == 2  # lowered once

    await wait_ready(stack, ref, 2)
    await wait_observed(stack, ctl, ref)
    status = await stack.api.status(ref)
    assert {w.name for w in status.workers} == {w0, w1}
    assert [(n.name, n.count) for n in status.node_sets] == [("bm-standard", 2)]


async def test_a_named_scale_down_lowers_the_count_the_order_asks_for_now(
    stack: Stack, ctl: RunningController
) -> None:
    """A tenant's edit the workflow has not taken yet (3 -> 5) is kept: the order goes to 4, not to
    the workflow's 3 - 1. (The controller leaves an unmanaged order alone, so the edit stays untaken.)"""
    ref = await create_order(stack, bare_metal(bm_standard=3))
    await wait_ready(stack, ref, 3)
    await patch_order(stack, ref, {"metadata": {"annotations": UNMANAGED}})
    await patch_order(stack, ref, {"spec": {"nodeRequests": bare_metal(bm_standard=5)}})
    await wait_observed(stack, ctl, ref)
    assert [(n.name, n.count) for n in (await stack.api.status(ref)).node_sets] == [("bm-standard", 3)]

    lowered = await operations(stack, ctl).scale_down_worker(ref, ref.worker_name(2))
    assert (lowered.name, lowered.count) == ("bm-standard", 4)
    assert count_of(await get_order(stack, ref), "bm-standard") == 4
    await only_workers(stack, ref, {ref.worker_name(0), ref.worker_name(1)})


async def test_a_named_scale_down_whose_order_write_fails_says_the_worker_is_released(
    stack: Stack, ctl: RunningController
) -> None:
    """The worker leaves, but the hub refuses the lower count: the operator is told both, and what to
    do, instead of only the hub's error (which read as if nothing had happened)."""
    ref = await create_order(stack, bare_metal(bm_standard=2))
    await wait_ready(stack, ref, 2)
    refused = {"errors": [{"code": 500, "verbs": ["update", "patch"], "resources": ["clusterorders"]}]}
    (await stack.hub_http.put("/lab/v1/faults/api", json=refused)).raise_for_status()
    try:
        with pytest.raises(CommandError) as err:
            await operations(stack, ctl).scale_down_worker(ref, ref.worker_name(1))
    finally:
        (await stack.hub_http.delete("/lab/v1/faults/api")).raise_for_status()
    message = str(err.value)
    assert f"worker {ref.worker_name(1)} is released" in message
    assert "check its bm-standard node request (it asked for 2 before) and lower it by one" in message
    await only_workers(stack, ref, {ref.worker_name(0)})
    # What the operator then does: the order and the workflow agree again.
    await patch_order(stack, ref, {"spec": {"nodeRequests": bare_metal(bm_standard=1)}})
    await wait_observed(stack, ctl, ref)
    await only_workers(stack, ref, {ref.worker_name(0)})
