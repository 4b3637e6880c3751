"""Operator commands that keep the ClusterOrder (the source of truth) and the workflow in agreement.

`WorkersApi` talks to Temporal only; these also read and write the order on the hub:
- `scale`: checks the new count with the workflow validator's rules, writes `numberOfNodes` on the
  ClusterOrder, then waits until the controller has made the workflow take it (or rejected it);
- `scale_down_worker`: checks the name (a worker already leaving is refused), signals the workflow
  (which lowers that node set's count and releases exactly that worker), then lowers the order's own
  `numberOfNodes` by one so both agree. In this order, because a lower count arriving first would
  make the workflow pick a victim itself;
- `decommission`: refuses while the order still asks for workers (the controller would provision
  them again) unless forced: deleting the order is the way to decommission a managed one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from activities.hub import order_facts
from activities.kube import HubApiError
from contracts.hub import ConditionStatus, OrderFacts
from contracts.refs import OrderRef
from contracts.workflows import (
    CONFIRM_SCALE_DOWN_ANNOTATION,
    ClusterWorkersStatus,
    NodeSetRequest,
    node_set_problem,
)
from starter.api import CommandError, OrderNotFound, StatusUnanswered, WorkersApi, stopped_run_text
from starter.orders import (
    FINALIZER,
    ControllerCondition,
    HubOrders,
    OrderChangeError,
    condition_of,
    confirmed,
    finalizers,
    generation,
)
from starter.validation import InstanceTypeCatalog, desired_node_sets, order_problem

DEFAULT_SCALE_TIMEOUT = 120.0


def facts_confirmed(obj: dict[str, Any] | None) -> bool:
    return obj is not None and confirmed(obj)


class OrderOperations:
    def __init__(
        self,
        api: WorkersApi,
        orders: HubOrders,
        catalog: InstanceTypeCatalog | None = None,
        *,
        warn: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.api = api
        self.orders = orders
        self.catalog = catalog
        self._warn = warn

    async def facts(self, order: OrderRef) -> OrderFacts:
        return order_facts(order, await self._read(order))

    async def _read(self, order: OrderRef) -> dict[str, Any]:
        obj = await self.orders.get(order)
        if obj is None:
            raise OrderNotFound(f"order {order.key}: no ClusterOrder of that name on the hub")
        return obj

    async def _instance_types(self) -> list[str]:
        if self.catalog is None:
            return []
        try:
            return await self.catalog.names()
        except Exception as err:  # the workflow's validator still checks them
            self._warn(
                f"could not read the instance types from BMaaS ({type(err).__name__}); not checked here"
            )
            return []

    async def scale(
        self,
        order: OrderRef,
        node_set: str,
        count: int,
        *,
        timeout: float = DEFAULT_SCALE_TIMEOUT,
        confirm_scale_down: bool = False,
    ) -> ClusterWorkersStatus:
        """Validate, write the count on the order, wait until the workflow took it.

        `confirm_scale_down` lets a mass scale-down through the workflow's guard: the order carries
        the confirmation annotation while the change is applied, and loses it again afterwards."""
        before = await self._read(order)
        facts = order_facts(order, before)
        if facts.unmanaged:
            raise CommandError(f"order {order.key} is annotated unmanaged: the controller does not act on it")
        if facts.deleting:
            raise CommandError(f"order {order.key} is being deleted")
        problem = order_problem(facts)
        if problem is not None:
            raise CommandError(f"order {order.key} has invalid node requests: {problem}")
        current = desired_node_sets(facts)
        names = [n.name for n in current]
        if node_set not in names:
            raise CommandError(
                f"node_set: order {order.key} has no bare-metal node set {node_set!r}"
                f" (known: {', '.join(sorted(names)) or 'none'})"
            )
        # model_construct: a negative count must reach the validator's rule, not pydantic's.
        wanted = [
            NodeSetRequest.model_construct(name=n.name, instance_type=n.instance_type, count=count)
            if n.name == node_set
            else n
            for n in current
        ]
        try:
            status = await self.api.status(order)
            # A running workflow keeps the maximum it was started with.
            held, maximum = status.node_sets, status.max_workers_per_order
        except OrderNotFound:
            held, maximum = [], self.api.max_workers_per_order  # no workflow yet: nothing to scale down
        problem = node_set_problem(
            wanted,
            await self._instance_types(),
            maximum,
            current=held,
            confirm_scale_down=confirm_scale_down,
            order=order,
        )
        if problem is not None:
            raise CommandError(problem)
        stopped = (await self.api.latest_run(order)).state
        if stopped.closed_abnormally:
            # The controller applies nothing to such an order: a count written now would only wait.
            raise CommandError(f"node_set: {stopped_run_text(order, stopped)}")
        annotate = confirm_scale_down and not facts_confirmed(before)
        written = await self.orders.set_node_count(
            order, node_set, count, annotations={CONFIRM_SCALE_DOWN_ANNOTATION: "true"} if annotate else None
        )
        # A refusal already on the order (the same generation when only the confirmation was added)
        # is not the answer to this write.
        judged = condition_of(before, ControllerCondition.NODE_REQUESTS_VALID)
        try:
            return await self._wait_taken(order, node_set, count, generation(written), timeout, judged)
        finally:
            if annotate:  # a one-off confirmation: the guard protects the next change again
                await self.orders.remove_annotation(order, CONFIRM_SCALE_DOWN_ANNOTATION)

    async def _wait_taken(
        self,
        order: OrderRef,
        node_set: str,
        count: int,
        gen: int | None,
        timeout: float,
        judged_before: dict[str, Any] | None,
    ) -> ClusterWorkersStatus:
        deadline = time.monotonic() + timeout
        while True:
            obj = await self.orders.get(order)
            cond = condition_of(obj, ControllerCondition.NODE_REQUESTS_VALID) if obj is not None else None
            observed = cond.get("observedGeneration") if cond else None
            refused = (
                cond is not None
                and gen is not None
                and isinstance(observed, int)
                and observed >= gen
                and cond.get("status") == ConditionStatus.FALSE.value
            )
            # A refusal already there before the write is the answer only once the wait is over
            # (the controller may judge the write the same way and leave the condition as it was).
            if cond is not None and refused and (cond != judged_before or time.monotonic() > deadline):
                # Written before the workflow judged it: the order keeps asking for it.
                raise CommandError(
                    f"order {order.key}: rejected: {cond.get('message')} (the order's {node_set}"
                    f" node request now asks for {count}, which was refused: correct it or set it"
                    " back)"
                )
            try:
                status = await self.api.status(order)
            except (OrderNotFound, StatusUnanswered):  # asked again until the deadline
                status = None
            if status is not None and any(n.name == node_set and n.count == count for n in status.node_sets):
                return status
            if time.monotonic() > deadline:
                raise CommandError(
                    f"order {order.key}: the workflow has not taken {node_set}={count} within {timeout:.0f}s"
                    " (is `osac-workers controller` running?)"
                )
            await asyncio.sleep(0.5)

    async def scale_down_worker(self, order: OrderRef, worker: str) -> NodeSetRequest:
        """Release one named worker and lower its node set's count on the order to match.

        A worker already leaving is refused (by `WorkersApi.scale_down_worker`) before the order is
        touched: lowering the count for it would make the workflow release another worker."""
        obj = await self.orders.get(order)
        if obj is not None and order_facts(order, obj).deleting:
            raise CommandError(f"order {order.key} is being deleted")
        lowered = await self.api.scale_down_worker(order, worker)
        if obj is None:
            self._warn(f"no ClusterOrder {order.key} on the hub: only the workflow's count was lowered")
            return lowered
        return await self._lower_order_count(order, lowered, worker)

    async def _lower_order_count(
        self, order: OrderRef, lowered: NodeSetRequest, worker: str
    ) -> NodeSetRequest:
        """One fewer than the order asks for now, not the workflow's count: a tenant's edit the
        controller has not applied yet (3 -> 5) must become 4, not be overwritten with 2. The worker
        is released either way: if the hub refuses, the error says so and what the order asked (a
        write whose answer was lost may have landed)."""
        asked: int | None = None
        try:
            obj = await self.orders.get(order)
            asks = (
                next((n for n in order_facts(order, obj).node_sets if n.name == lowered.name), None)
                if obj is not None
                else None
            )
            if asks is None:
                self._warn(
                    f"ClusterOrder {order.key} no longer asks for node set {lowered.name}:"
                    " only the workflow's count was lowered"
                )
                return lowered
            asked = asks.count
            # Lowered inside the compare-and-swap: an edit landing between the read above and the
            # write is lowered too, not overwritten.
            written = await self.orders.set_node_count(order, lowered.name, lambda now: max(now - 1, 0))
        except (OrderChangeError, HubApiError) as err:
            was = f" (it asked for {asked} before)" if asked is not None else ""
            raise CommandError(
                f"worker {worker} is released (it leaves and BMaaS wipes its host), but ClusterOrder"
                f" {order.key} could not be lowered to match ({err}): check its {lowered.name}"
                f" node request{was} and lower it by one if it still asks as many, or the controller"
                " provisions a replacement"
            ) from err
        count = next(n.count for n in order_facts(order, written).node_sets if n.name == lowered.name)
        return lowered.model_copy(update={"count": count})

    async def decommission(self, order: OrderRef, *, force: bool = False) -> ClusterWorkersStatus:
        if not force:
            obj = await self.orders.get(order)
            if obj is not None:
                facts = order_facts(order, obj)
                asks = sum(n.count for n in facts.node_sets)
                if not facts.unmanaged and not facts.deleting and (asks or FINALIZER in finalizers(obj)):
                    why = (
                        f"the ClusterOrder still asks for {asks} bare-metal worker(s) and the controller"
                        " would provision them again"
                        if asks
                        else f"the controller manages the ClusterOrder (it carries the finalizer {FINALIZER})"
                        " and would start its workers workflow again"
                    )
                    raise CommandError(
                        f"order {order.key}: {why}. Delete the ClusterOrder (its finalizer decommissions"
                        " the workers), or annotate it osac.openshift.io/management-state=unmanaged"
                        " first; --force decommissions anyway"
                    )
        return await self.api.decommission(order)
