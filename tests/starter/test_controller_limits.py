"""A controller whose configuration changed since an order's workflow started (no controller runs in
this module but the ones a test starts)."""

from __future__ import annotations

from starter.api import WorkersApi
from starter.operations import OrderOperations
from starter.orders import HubOrders
from starter.validation import InstanceTypeCatalog
from tests.starter.harness import bare_metal, create_order, patch_order, start_controller
from tests.workflows.stack import Stack, eventually


async def test_a_lowered_maximum_does_not_refuse_a_live_order_started_under_the_old_one(stack: Stack) -> None:
    """OSAC_MAX_WORKERS_PER_ORDER lowered: a running workflow keeps the maximum it was started with
    (README), so its order may still change, here from 4 workers to 3 and back to 4. The
    controller's own check of a live order's change, and the `scale` command's, refused it with the
    new maximum (2)."""
    first = await start_controller(stack)
    try:
        order = await create_order(stack, bare_metal(bm_standard=4))

        async def started_with_four() -> bool:
            try:
                return [(n.name, n.count) for n in (await stack.api.status(order)).node_sets] == [
                    ("bm-standard", 4)
                ]
            except Exception:  # not started yet
                return False

        await eventually(started_with_four, "the order's workflow started with 4 workers")
    finally:
        await first.stop()
    lowered = WorkersApi(
        stack.client,
        task_queue=stack.api.task_queue,
        bmaas_task_queue=stack.api.bmaas_task_queue,
        policy=stack.api.policy,
        max_workers_per_order=2,
    )
    second = await start_controller(stack, api=lowered)
    try:
        written = await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=3)}})
        gen = written["metadata"]["generation"]

        async def judged() -> dict | None:
            cond = await stack.order_condition(order, "NodeRequestsValid")
            return cond if cond is not None and cond.get("observedGeneration") == gen else None

        cond = await eventually(judged, "the controller's verdict on the change")
        assert cond["status"] == "True", cond
        assert [(n.name, n.count) for n in (await stack.api.status(order)).node_sets] == [("bm-standard", 3)]
        # `osac-workers scale` under the lowered maximum too: its own check refused 4 (over 2).
        ops = OrderOperations(lowered, HubOrders(second.kube), InstanceTypeCatalog(second.bmaas))
        taken = await ops.scale(order, "bm-standard", 4, timeout=60)
        assert [(n.name, n.count) for n in taken.node_sets] == [("bm-standard", 4)]
    finally:
        await second.stop()
    await stack.decommission_and_wait(order)
