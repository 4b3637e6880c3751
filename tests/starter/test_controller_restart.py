"""Restart safety: two controllers at once, and a controller restarted around a change, start one
workflow and apply each change once (the workflow's history shows every accepted update)."""

from __future__ import annotations

from tests.starter.harness import (
    bare_metal,
    controller,
    create_order,
    patch_order,
    run_id,
    start_controller,
    update_names,
    wait_condition,
    wait_observed,
    wait_ready,
)
from tests.workflows.stack import Stack


async def test_two_controllers_and_restarts_never_start_a_second_workflow_or_double_apply(
    stack: Stack,
) -> None:
    first = await start_controller(stack)
    second = await start_controller(stack)
    try:
        # Both controllers see the new order at the same moment.
        order = await create_order(stack, bare_metal(bm_standard=1, bm_gpu=1))
        await wait_ready(stack, order, 2)
        await wait_condition(stack, order, "NodeRequestsValid", "True")
        await wait_observed(stack, first, order)
        await wait_observed(stack, second, order)
        original_run = await run_id(stack, order)
        assert await update_names(stack, order) == ["set_node_sets"]

        # A change seen by both.
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=2, bm_gpu=1)}})
        await wait_ready(stack, order, 3)
        await wait_observed(stack, first, order)
        await wait_observed(stack, second, order)
        assert await update_names(stack, order) == ["set_node_sets"] * 2
    finally:
        await first.stop()
        await second.stop()

    # A change made while no controller runs is applied once by the next one to start, however many.
    await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=1, bm_gpu=1)}})
    async with controller(stack) as third, controller(stack) as fourth:
        await wait_ready(stack, order, 2)
        await wait_observed(stack, third, order)
        await wait_observed(stack, fourth, order)
        assert await update_names(stack, order) == ["set_node_sets"] * 3
    # And restarting with nothing changed sends nothing.
    async with controller(stack) as fifth:
        await wait_observed(stack, fifth, order)
        assert fifth.controller.stats.applies == 0
    assert await update_names(stack, order) == ["set_node_sets"] * 3
    assert await run_id(stack, order) == original_run
