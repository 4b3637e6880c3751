"""Restart safety: two controllers at once, and a controller restarted around a change, start one
workflow and apply each change once (the workflow's history shows every accepted update)."""

from __future__ import annotations

from typing import Any, cast

from contracts.refs import OrderRef
from starter.api import WorkersApi
from tests.starter.harness import (
    bare_metal,
    condition,
    controller,
    create_order,
    get_order,
    patch_order,
    run_id,
    start_controller,
    update_names,
    wait_condition,
    wait_observed,
    wait_ready,
)
from tests.workflows.stack import Stack, eventually

NEW_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHr0ks3jOM2Yz0gK1cM9Yc9l7Wq9d4m2b0F5tJd4Vx0f edit@race"


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


class _EditedDuringApply:
    """The library API, except that as the controller's apply of generation 2 returns, the tenant
    edits the order again (generation 3), before the controller writes its condition."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self.edited = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack.api, name)

    async def apply(self, order: OrderRef, *args: Any, **kwargs: Any) -> Any:
        result = await self._stack.api.apply(order, *args, **kwargs)
        if kwargs.get("order_generation") == 2 and not self.edited:
            self.edited = True
            await patch_order(self._stack, order, {"spec": {"sshPublicKey": NEW_KEY}})
        return result


async def test_an_edit_made_while_the_previous_one_is_applied_is_applied_too(stack: Stack) -> None:
    """The condition written after an apply names the generation applied, not the order's
    generation at the time of the write: an edit in between is still to be applied, and it is."""
    api = _EditedDuringApply(stack)
    async with controller(stack, api=cast(WorkersApi, api), resync_seconds=2.0):
        order = await create_order(stack, bare_metal(bm_standard=1))
        await wait_ready(stack, order, 1)
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=2)}})

        async def both_applied() -> bool:
            status = await stack.api.status(order)
            return api.edited and status.order_generation == 3

        await eventually(both_applied, "generation 3 (the edit made during the apply of 2) applied")
        await eventually(lambda: _key_in_infraenv(stack, order), "the new SSH key in the InfraEnv")
        await wait_ready(stack, order, 2)
        accepted = condition(await get_order(stack, order), "NodeRequestsValid") or {}
        assert accepted.get("observedGeneration") == 3


async def _key_in_infraenv(stack: Stack, order: OrderRef) -> bool:
    return (await stack.infraenv_inputs(order))[1] == NEW_KEY
