"""Restart safety: two controllers at once, and a controller restarted around a change, start one
workflow and apply each change once (the workflow's history shows every accepted update); a start
racing another controller's finalization, drift a resync must heal although its update id was
used before, and a stopped run purged by retention while its workers hold their hosts."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, cast

import pytest

from contracts.refs import OrderRef
from contracts.workflows import cluster_workflow_id
from starter.api import ChangedMeanwhile, CommandError, WorkersApi, WorkflowState
from tests.starter.harness import (
    FINALIZER,
    OSAC_FINALIZER,
    bare_metal,
    controller,
    create_order,
    delete_order,
    finalizers,
    get_order,
    order_name,
    patch_order,
    purge_cluster_workflow,
    release_hosts,
    remove_condition,
    run_id,
    runs_of,
    start_controller,
    terminate_cluster_workflow,
    update_names,
    wait_observed,
    wait_ready,
    workflow_state,
)
from tests.workflows.stack import Stack, condition, eventually, wait_condition

# The apply timeout of controllers whose apply a test holds at a gate or slows down: the hold is
# inside the timeout, and on a loaded machine the other controller's work may outlast 30 s.
GATED = 600.0

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
    """The library API, except that as the controller's apply of generation 2 of order `name`
    returns, the tenant edits the order again (generation 3), before the controller writes its
    condition. (The controller also looks at every earlier test's orders.)"""

    def __init__(self, stack: Stack, name: str) -> None:
        self._stack = stack
        self._name = name
        self.edited = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack.api, name)

    async def apply(self, order: OrderRef, *args: Any, **kwargs: Any) -> Any:
        result = await self._stack.api.apply(order, *args, **kwargs)
        if order.name == self._name and kwargs.get("order_generation") == 2 and not self.edited:
            self.edited = True
            await patch_order(self._stack, order, {"spec": {"sshPublicKey": NEW_KEY}})
        return result


async def test_an_edit_made_while_the_previous_one_is_applied_is_applied_too(stack: Stack) -> None:
    """The condition written after an apply names the generation applied, not the order's
    generation at the time of the write: an edit in between is still to be applied, and it is."""
    name = order_name()
    api = _EditedDuringApply(stack, name)
    async with controller(stack, api=cast(WorkersApi, api), resync_seconds=2.0):
        order = await create_order(stack, bare_metal(bm_standard=1), name=name)
        await wait_ready(stack, order, 1)
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=2)}})

        async def both_applied() -> bool:
            status = await stack.api.status(order)
            return api.edited and status.order_generation == 3

        await eventually(both_applied, "generation 3 (the edit made during the apply of 2) applied")
        await eventually(lambda: _key_in_infraenv(stack, order), "the new SSH key in the InfraEnv")
        await wait_ready(stack, order, 2)

        async def accepted_at_3() -> bool:
            # Written by the controller just after the apply returns: waited for, not raced.
            accepted = condition(await get_order(stack, order), "NodeRequestsValid") or {}
            return accepted.get("observedGeneration") == 3 and accepted.get("status") == "True"

        await eventually(accepted_at_3, "NodeRequestsValid=True naming generation 3")


async def _key_in_infraenv(stack: Stack, order: OrderRef) -> bool:
    return (await stack.infraenv_inputs(order))[1] == NEW_KEY


class _GatedApply:
    """The library API, except that an apply of order `name` waits at a gate: a controller that has
    added its finalizer and is about to start the workflow."""

    def __init__(self, stack: Stack, name: str) -> None:
        self._stack = stack
        self._name = name
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack.api, name)

    async def apply(self, order: OrderRef, *args: Any, **kwargs: Any) -> Any:
        if order.name == self._name:
            self.entered.set()
            await self.gate.wait()
        return await self._stack.api.apply(order, *args, **kwargs)


async def test_a_start_landing_after_another_controller_finalized_the_order_is_decommissioned(
    stack: Stack,
) -> None:
    """Controller A adds the finalizer and is about to start the workflow; the tenant deletes the
    order; controller B finds no workflow and no host, and removes the finalizer; the order goes.
    Then A's start lands: A itself must decommission what it started (no event will come)."""
    name = order_name()
    api = _GatedApply(stack, name)
    first = await start_controller(stack, api=cast(WorkersApi, api), apply_timeout_seconds=GATED)
    try:
        order = await create_order(stack, bare_metal(bm_standard=1), finalizers=[OSAC_FINALIZER], name=name)

        async def starting() -> bool:
            return api.entered.is_set()

        await eventually(starting, "controller A about to start the workflow")
        assert FINALIZER in finalizers(await get_order(stack, order))
        await delete_order(stack, order)
        async with controller(stack):

            async def dropped() -> bool:
                return FINALIZER not in finalizers(await get_order(stack, order))

            await eventually(dropped, "controller B removing the finalizer")
        await patch_order(stack, order, {"metadata": {"finalizers": []}})

        async def gone() -> bool:
            return await get_order(stack, order) is None

        await eventually(gone, f"{order.key} gone")
        assert await workflow_state(stack, order) == WorkflowState.ABSENT
        api.gate.set()

        async def decommissioned() -> bool:
            return await workflow_state(stack, order) == WorkflowState.COMPLETED

        await eventually(decommissioned, f"the workflow of the deleted {order.key} decommissioned", 120)
        assert await stack.bmis(order) == []
    finally:
        api.gate.set()
        await first.stop()


class _HeldApply:
    """The library API, except that the apply of one generation of order `name` waits at a gate: a
    controller that decided on it and is slow to send it (a rolling update's old replica, say)."""

    def __init__(self, stack: Stack, generation: int, name: str) -> None:
        self._stack = stack
        self._generation = generation
        self._name = name
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack.api, name)

    async def apply(self, order: OrderRef, *args: Any, **kwargs: Any) -> Any:
        held = order.name == self._name and kwargs.get("order_generation") == self._generation
        if held and not self.gate.is_set():
            self.entered.set()
            await self.gate.wait()
        try:
            return await self._stack.api.apply(order, *args, **kwargs)
        except ChangedMeanwhile:
            if order.name == self._name:
                self.refused += 1
            raise


async def test_an_older_generation_sent_late_does_not_undo_a_newer_one(stack: Stack) -> None:
    """Controller A decided on generation 2 and is slow to send it; controller B applies generation
    3 meanwhile. A's late change is refused by the workflow (it was decided on node sets that are
    gone), A looks again and finds 3 applied: the workflow keeps 3, and the order says 3."""
    name = order_name()
    held = _HeldApply(stack, generation=2, name=name)
    slow = await start_controller(stack, api=cast(WorkersApi, held), apply_timeout_seconds=GATED)
    try:
        order = await create_order(stack, bare_metal(bm_standard=1), name=name)
        await wait_condition(stack, order, "NodeRequestsValid", "True")
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=2)}})
        await held.entered.wait()
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=3)}})
        async with controller(stack):

            async def applied_3() -> bool:
                return (await stack.api.status(order)).order_generation == 3

            await eventually(applied_3, "controller B applying generation 3")
        held.gate.set()

        async def refused_and_accepted() -> bool:
            accepted = condition(await get_order(stack, order), "NodeRequestsValid") or {}
            return held.refused >= 1 and accepted.get("observedGeneration") == 3

        await eventually(refused_and_accepted, "A's late change refused, and the order saying 3")
        status = await stack.api.status(order)
        assert (status.desired_workers, status.order_generation) == (3, 3)
        # Generation 1 (A) and 3 (B): A's late change never entered the history.
        assert await update_names(stack, order) == ["set_node_sets"] * 2
        await wait_ready(stack, order, 3)
    finally:
        held.gate.set()
        await slow.stop()


async def test_a_first_start_sent_late_does_not_undo_the_one_that_started_the_run(stack: Stack) -> None:
    """Controller A saw no workflow for generation 1 and is slow to start it; controller B starts
    the run with generation 2. A's late start reaches B's run (conflict policy USE_EXISTING): it was
    decided on a workflow with no node sets, so it is refused, and A finds generation 2 applied."""
    name = order_name()
    held = _HeldApply(stack, generation=1, name=name)
    slow = await start_controller(stack, api=cast(WorkersApi, held), apply_timeout_seconds=GATED)
    try:
        order = await create_order(stack, bare_metal(bm_standard=1), name=name)
        await held.entered.wait()
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=2)}})
        async with controller(stack):

            async def applied_2() -> bool:
                try:
                    return (await stack.api.status(order)).order_generation == 2
                except CommandError:
                    return False  # no run yet

            await eventually(applied_2, "controller B starting the run with generation 2")
        held.gate.set()

        async def refused_and_accepted() -> bool:
            accepted = condition(await get_order(stack, order), "NodeRequestsValid") or {}
            return held.refused >= 1 and accepted.get("observedGeneration") == 2

        await eventually(refused_and_accepted, "A's late start refused, and the order saying 2")
        status = await stack.api.status(order)
        assert (status.desired_workers, status.order_generation) == (2, 2)
        await wait_ready(stack, order, 2)
    finally:
        held.gate.set()
        await slow.stop()


class _TerminatedAfterStatus:
    """The library API, except that once armed, an operator terminates the order's run right after
    the controller read its status: the controller decided on a running workflow that is closed by
    the time its change goes out."""

    def __init__(self, stack: Stack, name: str) -> None:
        self._stack = stack
        self._name = name
        self.armed = False
        self.terminated = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack.api, name)

    async def status(self, order: OrderRef, *args: Any, **kwargs: Any) -> Any:
        result = await self._stack.api.status(order, *args, **kwargs)
        # Only the test's order: the controller's resyncs look at every earlier test's orders too.
        if self.armed and order.name == self._name:
            self.armed = False
            await terminate_cluster_workflow(self._stack, order)
            self.terminated = True
        return result


async def test_a_run_terminated_while_a_change_goes_out_is_not_replaced(stack: Stack) -> None:
    """A run terminated between the controller's look and its update-with-start stays stopped: a
    new run would number its slots from 0 and tell the stopped run's worker, which holds its host,
    to leave. The order says WorkersWorkflowStopped, as for a run terminated at any other time."""
    name = order_name()
    api = _TerminatedAfterStatus(stack, name)
    async with controller(
        stack, api=cast(WorkersApi, api), resync_seconds=2.0, apply_timeout_seconds=GATED
    ) as running:
        order = await create_order(stack, bare_metal(bm_standard=1), name=name)
        await wait_ready(stack, order, 1)
        await wait_condition(stack, order, "NodeRequestsValid", "True")
        original_run = await run_id(stack, order)
        held = [bmi["id"] for bmi in await stack.bmis(order)]
        assert len(held) == 1
        api.armed = True
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=2)}})

        async def terminated_and_looked_at_again() -> bool:
            return api.terminated and running.controller.stats.reconciles >= reconciles + 3

        reconciles = running.controller.stats.reconciles
        await eventually(terminated_and_looked_at_again, "the run terminated and 3 more reconciles")
        state = await workflow_state(stack, order)
        assert state == WorkflowState.TERMINATED, f"a new run was started:\n{await runs_of(stack, order)}"
        assert await run_id(stack, order) == original_run
        stopped = await wait_condition(stack, order, "WorkersWorkflowStopped", "True")
        assert stopped["reason"] == WorkflowState.TERMINATED.value
        assert [bmi["id"] for bmi in await stack.bmis(order)] == held
        await release_hosts(stack, order)


async def test_a_change_no_worker_takes_does_not_hold_the_other_orders_back(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """No worker polls the controller's task queue: a new order's update-with-start would wait for
    good in the only reconcile slot. It gives up after its timeout (a failed, counted reconcile,
    retried, whose log says what to look at), so the next order is still looked at and its bad
    input said on it."""
    caplog.set_level(logging.WARNING, logger="osac.controller")
    unpolled = WorkersApi(
        stack.client,
        task_queue=f"unpolled-{uuid.uuid4().hex[:8]}",
        bmaas_task_queue=stack.api.bmaas_task_queue,
        policy=stack.api.policy,
    )
    async with controller(stack, api=unpolled, concurrency=1, apply_timeout_seconds=3.0) as running:
        waiting = await create_order(stack, bare_metal(bm_standard=1))

        async def started() -> bool:
            return await workflow_state(stack, waiting) == WorkflowState.RUNNING

        await eventually(started, f"the workflow of {waiting.key} started, with no worker to take it")
        invalid = await create_order(stack, bare_metal(bm_nope=1))
        refused = await wait_condition(stack, invalid, "NodeRequestsValid", "False")
        assert "'bm-nope'" in refused["message"]
        assert running.controller.stats.errors >= 1
    unanswered = [r.getMessage() for r in caplog.records if "failed (ChangeUnanswered" in r.getMessage()]
    assert unanswered, [r.getMessage() for r in caplog.records]
    assert "no worker took the change within 3s" in unanswered[0]
    assert repr(unpolled.task_queue) in unanswered[0]
    await stack.client.get_workflow_handle(cluster_workflow_id(waiting)).terminate(reason="test: no worker")
    for order in (waiting, invalid):
        await patch_order(stack, order, {"metadata": {"finalizers": []}})
        await delete_order(stack, order)


class _HeldDecommission:
    """The library API, except that a decommission waits at a gate before it goes out: a worker
    that answered the controller's status query and then stopped taking updates."""

    def __init__(self, stack: Stack, name: str) -> None:
        self._stack = stack
        self._name = name
        self.gate = asyncio.Event()
        self.held = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stack.api, name)

    async def decommission(self, order: OrderRef, *args: Any, **kwargs: Any) -> Any:
        if order.name == self._name:
            self.held += 1
            await self.gate.wait()
        return await self._stack.api.decommission(order, *args, **kwargs)


async def test_a_decommission_no_worker_takes_does_not_hold_the_other_orders_back(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A deleted order's decommission is unanswered: it gives up after the apply timeout (a failed,
    counted reconcile, retried) like a change, so the next order is still looked at; once a worker
    takes it, the order's finalizer goes."""
    caplog.set_level(logging.WARNING, logger="osac.controller")
    name = order_name()
    api = _HeldDecommission(stack, name)
    async with controller(stack, api=cast(WorkersApi, api), concurrency=1, apply_timeout_seconds=2.0):
        leaving = await create_order(stack, bare_metal(bm_standard=0), name=name)
        await wait_condition(stack, leaving, "NodeRequestsValid", "True")
        await delete_order(stack, leaving)
        await eventually(lambda: _at_least(api, 2), "the decommission sent twice (the first given up)")
        invalid = await create_order(stack, bare_metal(bm_nope=1))
        refused = await wait_condition(stack, invalid, "NodeRequestsValid", "False")
        assert "'bm-nope'" in refused["message"]
        unanswered = [r.getMessage() for r in caplog.records if "failed (ChangeUnanswered" in r.getMessage()]
        # (The order's first change may have been given up once too, on a loaded machine.)
        assert any("no worker took the decommission within 2s" in m for m in unanswered), unanswered
        api.gate.set()

        async def finalized() -> bool:
            return await get_order(stack, leaving) is None

        await eventually(finalized, f"{leaving.key} decommissioned and its finalizer removed")
    await patch_order(stack, invalid, {"metadata": {"finalizers": []}})
    await delete_order(stack, invalid)


async def _at_least(api: _HeldDecommission, count: int) -> bool:
    return api.held >= count


async def test_a_resync_heals_drift_back_to_a_state_seen_earlier_in_the_generation(stack: Stack) -> None:
    """The generation's apply came from 1 worker; a named scale-down whose order write was lost
    takes the workflow back to 1. The resync's update id is the one the server completed for that
    apply: it must still bring the workflow to the order's count."""
    async with controller(stack, resync_seconds=2.0):
        order = await create_order(stack, bare_metal(bm_standard=1))
        await wait_ready(stack, order, 1)
        await patch_order(stack, order, {"spec": {"nodeRequests": bare_metal(bm_standard=2)}})
        await wait_ready(stack, order, 2)
        named = f"{order.name}-worker-1"
        await stack.api.scale_down_worker(order, named)  # and no order write

        async def healed() -> bool:
            status = await stack.api.status(order)
            names = [w.name for w in status.workers]
            settled = status.ready_workers == 2 == status.current_workers == len(names)
            return settled and status.desired_workers == 2 and named not in names

        await eventually(healed, "the workflow back at the order's 2 workers, without the named one", 120)
        accepted = condition(await get_order(stack, order), "NodeRequestsValid") or {}
        assert accepted.get("status") == "True" and accepted.get("observedGeneration") == 2


async def test_a_stopped_run_purged_by_retention_is_not_replaced_while_its_workers_hold_hosts(
    stack: Stack,
) -> None:
    """A resync finds no workflow for a live order whose run was terminated and then purged, while
    its abandoned worker still holds its host: a new run would number its slots from 0 again and
    allocate a second set. Nothing starts until an operator removed the condition, nor while BMaaS
    lists a BMI of the order; once the hosts are released, the order starts afresh."""
    async with controller(stack, resync_seconds=2.0) as running:
        order = await create_order(stack, bare_metal(bm_standard=1))
        await wait_ready(stack, order, 1)
        await wait_condition(stack, order, "NodeRequestsValid", "True")
        await terminate_cluster_workflow(stack, order)
        stopped = await wait_condition(stack, order, "WorkersWorkflowStopped", "True")
        assert stopped["reason"] == WorkflowState.TERMINATED.value
        assert "temporal workflow reset" in stopped["message"]
        await purge_cluster_workflow(stack, order)
        held = [bmi["id"] for bmi in await stack.bmis(order)]
        assert len(held) == 1

        async def resyncs_pass(count: int = 3) -> None:
            start = running.controller.stats.reconciles

            async def passed() -> bool:
                return running.controller.stats.reconciles >= start + count

            await eventually(passed, f"{count} more reconciles of {order.key}")

        async def nothing_started() -> None:
            assert await workflow_state(stack, order) == WorkflowState.ABSENT, "a new run was started"
            assert [bmi["id"] for bmi in await stack.bmis(order)] == held

        await resyncs_pass()
        await nothing_started()
        cond = condition(await get_order(stack, order), "WorkersWorkflowStopped") or {}
        assert cond.get("reason") == WorkflowState.TERMINATED.value

        # The operator looked and removed the condition, but the abandoned worker holds its host.
        await remove_condition(stack, order, "WorkersWorkflowStopped")
        allocated = await wait_condition(stack, order, "WorkersWorkflowStopped", "True")
        assert allocated["reason"] == "HostsStillAllocated"
        await resyncs_pass()
        await nothing_started()

        # Released: the order starts afresh, on a new host, and the condition goes.
        await release_hosts(stack, order)
        await wait_ready(stack, order, 1)

        async def cleared() -> bool:
            return condition(await get_order(stack, order), "WorkersWorkflowStopped") is None

        await eventually(cleared, "WorkersWorkflowStopped cleared once the order runs again")
        assert [bmi["id"] for bmi in await stack.bmis(order)] != held


async def test_a_live_order_decommissioned_outside_twice_in_one_generation_starts_again_each_time(
    stack: Stack,
) -> None:
    """`decommission --force` on a live order: the controller starts it afresh once the run is done.
    The second time in the same generation, the situation (and so the update id) is the same as the
    first: the server must not answer it from the first run's completed update and start nothing."""
    async with controller(stack, resync_seconds=2.0):
        order = await create_order(stack, bare_metal(bm_standard=1))
        await wait_ready(stack, order, 1)
        runs = {await run_id(stack, order)}
        for _ in range(2):
            await stack.api.decommission(order)

            async def started_again() -> bool:
                if await workflow_state(stack, order) != WorkflowState.RUNNING:
                    return False
                return await run_id(stack, order) not in runs

            await eventually(started_again, f"a new run of {order.key} after the decommission", 120)
            runs.add(await run_id(stack, order))
            await wait_ready(stack, order, 1)
