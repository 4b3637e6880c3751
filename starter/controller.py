"""The ClusterOrder controller (`osac-workers controller`): makes each order's workers workflow match it.

Level-triggered. ClusterOrders are observed through `HubKube`'s shared informer (one watch of every
namespace; orders outside the configured namespaces are skipped). A key is reconciled when the
informer first lists it (start), whenever it changes, on a periodic resync, after an error (with
backoff) and when a decommission it waits for finishes. One key is never reconciled by two tasks of
one process at once.

Per order:
- annotated `osac.openshift.io/management-state=unmanaged`: left alone, whatever else it says;
- no bare-metal node request and never managed: ignored;
- live: its bare-metal node requests become node sets (name = instance type). Orders whose requests
  break a rule get the condition `NodeRequestsValid=False` (reason `InvalidNodeRequests`, the
  validator's message naming the field) and nothing is started or allocated. Otherwise the
  finalizer is added first, then the workflow is started or updated (update-with-start,
  USE_EXISTING) when its node sets differ from the order's, read fresh from the hub, or when the
  order has a generation not applied yet (an edit of other fields, such as a rotated pull secret or
  a new SSH key, which the workflow then brings to the order's InfraEnv), and
  `NodeRequestsValid=True` records the generation that was applied. A mass scale-down refused
  by the workflow's guard is sent again, confirmed, once the order carries the annotation
  `osac.openshift.io/confirm-scale-down=true`, which is removed once that scale-down is applied;
- deleting (with our finalizer): the workflow is told to decommission and the finalizer removed only
  once the workflow completed, i.e. every BMI is gone (wiped) and the InfraEnv deleted, and BMaaS
  lists no BMI of the order. The last check also covers a workflow not found at all (never started,
  or a stopped run purged by retention while its abandoned workers hold hosts): BMIs left get
  `WorkersWorkflowStopped=True` (reason `HostsStillAllocated`, looked at again every poll). An order
  showing `WorkersWorkflowStopped` for any other reason (its workflow failed or was terminated)
  keeps the finalizer until an operator removes that condition;
- deleting without our finalizer, its workflow running (another controller finalized the order
  while this one was starting the workflow, or a library caller started one): the workflow is told
  to decommission, and releases its hosts; the finalizer is not added back (the object may go any
  moment). The controller that starts or changes a workflow reads the order again afterwards and
  does the same if it was deleted meanwhile (it may be gone by then, and no event would follow).

Restart-safe and idempotent: all state lives on the hub (finalizer, conditions) and in Temporal
(one workflow per order id; update-with-start never starts a second). Status writes by the workflow
change an order without changing its generation; such events are skipped once the generation was
applied, so a named scale-down (signal first, then the lower count on the order) is never undone
by a stale count in between. Resyncs compare with the workflow regardless, to heal drift. Two
controllers that see the same change send it with the same update id, which the server applies
once. The id names the generation and both node sets, so a workflow that drifted back to a state
it was in earlier in the generation (a named scale-down whose order write was lost) gets an id the
server already completed, and is answered without the update running: when the workflow's node sets
still differ from the order's afterwards, the change is sent again under an id naming the run and
its history length. A workflow that ended abnormally (failed, terminated) is never replaced behind
an operator's back: the order gets `WorkersWorkflowStopped=True` and keeps its finalizer, and once
retention purged the run, nothing is started for the order while it shows that condition, nor, for
an order with our finalizer, while BMaaS lists BMIs of it (the purged run's abandoned workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.common import MetricCounter, MetricMeter

from activities.bmaas.activities import order_snapshots
from activities.bmaas.client import BmaasClient
from activities.hub import order_facts
from activities.kube import CLUSTER_ORDERS, HubKube, KubeObject, meta
from contracts.hub import ConditionStatus, OrderFacts
from contracts.refs import OrderRef
from contracts.workflows import (
    NodeSetRequest,
    cluster_workflow_id,
    node_set_problem,
    same_node_sets,
)
from starter.api import ChangedMeanwhile, CommandError, WorkersApi, WorkflowState
from starter.orders import (
    FINALIZER,
    ConditionReason,
    ControllerCondition,
    HubOrders,
    condition_of,
    confirmed,
    finalizers,
    generation,
)
from starter.validation import InstanceTypeCatalog, OrderFields, desired_node_sets, order_problem

log = logging.getLogger("osac.controller")
T = TypeVar("T")


class WorkQueue:
    """Keys to reconcile, deduplicated; a key being processed is queued again only after `done`.

    Each entry carries `full`: reconcile regardless of the generation gate (start, resync, retry)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._pending: dict[str, bool] = {}
        self._processing: set[str] = set()
        self._again: dict[str, bool] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}

    def add(self, key: str, full: bool = False) -> None:
        if key in self._processing:
            self._again[key] = self._again.get(key, False) or full
        elif key in self._pending:
            self._pending[key] = self._pending[key] or full
        else:
            self._pending[key] = full
            self._queue.put_nowait(key)

    def add_after(self, key: str, delay: float, full: bool = True) -> None:
        """At most one timer per key: the earliest wins."""
        loop = asyncio.get_running_loop()
        due = loop.time() + max(0.0, delay)
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key, full)

        self._timers[key] = (due, loop.call_at(due, fire))

    async def get(self) -> tuple[str, bool]:
        key = await self._queue.get()
        full = self._pending.pop(key)
        self._processing.add(key)
        return key, full

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._again:
            self.add(key, self._again.pop(key))

    def close(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._pending)


@dataclass
class ControllerStats:
    reconciles: int = 0
    applies: int = 0
    rejections: int = 0
    decommissions: int = 0
    finalized: int = 0
    errors: int = 0


# The stats as Prometheus counters (OSAC_METRICS_BIND), per field: an alert on reconcile errors
# catches a controller that cannot do its work (no BMaaS token, a hub refusing it) while its probes
# say ready, since it is alive and its ClusterOrders are listed.
COUNTERS: dict[str, tuple[str, str]] = {
    "reconciles": ("osac_controller_reconciles_total", "ClusterOrder reconciles"),
    "applies": ("osac_controller_applies_total", "Node requests sent to an order's workflow"),
    "rejections": ("osac_controller_rejections_total", "Node requests refused (NodeRequestsValid=False)"),
    "decommissions": ("osac_controller_decommissions_total", "Decommissions started"),
    "finalized": ("osac_controller_finalized_total", "Finalizers removed after a decommission"),
    "errors": (
        "osac_controller_reconcile_errors_total",
        "Reconciles that failed and are retried, by error_type (the exception's class)",
    ),
}


def apply_id(
    uid: str,
    gen: int | None,
    desired: Sequence[NodeSetRequest],
    observed: Sequence[NodeSetRequest] | None,
    state: WorkflowState,
    confirm: bool = False,
    closed_run: str | None = None,
) -> str:
    """The update id of one change: the same for every controller that saw the same situation.

    A confirmation changes the id: a change refused without it can be sent again with it. A start
    after a completed run names that run: the server answers an id a closed run completed from that
    run, and would start nothing (a second `decommission --force` in one generation)."""

    def digest(sets: Sequence[NodeSetRequest] | None) -> str:
        if sets is None:
            return f"{state.value}:{closed_run}" if closed_run else state.value
        text = ",".join(f"{n.name}:{n.instance_type}:{n.count}" for n in sorted(sets, key=lambda n: n.name))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    confirmed_part = "/confirmed" if confirm else ""
    return f"set-node-sets/{uid or 'no-uid'}/{gen}/{digest(desired)}/{digest(observed)}{confirmed_part}"


# How soon an order whose workflow changed while a change was sent is looked at again.
CHANGED_MEANWHILE_RELOOK_S = 1.0


class ChangeUnanswered(Exception):
    """No worker took a change in time: the reconcile fails (counted) and is retried."""


class ClusterOrderController:
    def __init__(
        self,
        kube: HubKube,
        api: WorkersApi,
        catalog: InstanceTypeCatalog,
        *,
        namespaces: Sequence[str] = (),
        resync_seconds: float = 300.0,
        concurrency: int = 4,
        health_file: Path | None = None,
        error_backoff: tuple[float, float] = (0.5, 60.0),
        decommission_poll_seconds: float = 60.0,
        bmaas: BmaasClient | None = None,
        meter: MetricMeter | None = None,
        apply_timeout_seconds: float = 30.0,
    ) -> None:
        """`bmaas`: where the BMIs of a deleting order are listed (the catalog's client by default).
        `meter`: where the stats are also counted (`COUNTERS`), e.g. the process runtime's.
        `apply_timeout_seconds`: how long a change may wait for a worker to take it before the
        reconcile fails and is retried (the SDK would wait for good, holding a reconcile slot)."""
        self._kube = kube
        self._orders = HubOrders(kube)
        self._api = api
        self._catalog = catalog
        self._bmaas = bmaas if bmaas is not None else catalog.client
        self._namespaces = frozenset(namespaces)
        self._resync = resync_seconds
        self._concurrency = max(1, concurrency)
        self._health_file = health_file
        self._backoff = error_backoff
        self._decommission_poll = decommission_poll_seconds
        self._apply_timeout = apply_timeout_seconds
        self._queue = WorkQueue()
        self._failures: dict[str, int] = {}
        self._finish_waiters: dict[str, asyncio.Task[None]] = {}
        self.stats = ControllerStats()
        self._counters: dict[str, MetricCounter] = {}
        if meter is not None:
            self._counters = {field: meter.create_counter(*named) for field, named in COUNTERS.items()}
        # key -> resourceVersion last reconciled to the end (tests and probes wait on it)
        self.observed: dict[str, str] = {}

    @property
    def synced(self) -> bool:
        return self._kube.informer(CLUSTER_ORDERS).synced

    def _wanted(self, namespace: str) -> bool:
        return not self._namespaces or namespace in self._namespaces

    # ----------------------------------------------------------------------------------- loops

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set."""
        await self._kube.informer(CLUSTER_ORDERS).start()
        tasks = [
            asyncio.create_task(self._watch(), name="controller-watch"),
            asyncio.create_task(self._resync_loop(), name="controller-resync"),
            *(
                asyncio.create_task(self._work(), name=f"controller-worker-{i}")
                for i in range(self._concurrency)
            ),
        ]
        if self._health_file is not None:
            tasks.append(asyncio.create_task(self._health_loop(self._health_file), name="controller-health"))
        log.info(
            "controller running: namespaces=%s resync=%ss task_queue=%s",
            ",".join(sorted(self._namespaces)) or "all",
            self._resync,
            self._api.task_queue,
        )
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper:
                    task.result()  # a loop that ended on its own is a bug: surface it
        finally:
            for task in [stopper, *tasks, *self._finish_waiters.values()]:
                task.cancel()
            await asyncio.gather(*tasks, *self._finish_waiters.values(), stopper, return_exceptions=True)
            self._queue.close()
            if self._health_file is not None:
                self._health_file.unlink(missing_ok=True)
            log.info("controller stopped")

    async def _watch(self) -> None:
        informer = self._kube.informer(CLUSTER_ORDERS)
        seen: dict[str, str] = {}
        first = True

        def changes() -> dict[str, bool] | None:
            nonlocal first
            current: dict[str, str] = {}
            dirty: dict[str, bool] = {}
            for obj in informer.items():
                m = meta(obj)
                namespace, name = str(m.get("namespace") or ""), str(m.get("name") or "")
                if not self._wanted(namespace):
                    continue
                key = f"{namespace}/{name}"
                current[key] = str(m.get("resourceVersion") or "")
                if seen.get(key) != current[key]:
                    dirty[key] = first  # the initial list is a full pass
            for key in seen.keys() - current.keys():
                dirty[key] = False
            seen.clear()
            seen.update(current)
            first = False
            return dirty or None

        while True:
            dirty = await informer.wait(changes, tick_seconds=60.0)
            for key, full in dirty.items():
                self._queue.add(key, full)

    async def _resync_loop(self) -> None:
        informer = self._kube.informer(CLUSTER_ORDERS)
        while True:
            await asyncio.sleep(self._resync)
            for obj in informer.items():
                m = meta(obj)
                if self._wanted(str(m.get("namespace") or "")):
                    self._queue.add(f"{m.get('namespace')}/{m.get('name')}", True)

    async def _work(self) -> None:
        while True:
            key, full = await self._queue.get()
            try:
                delay = await self.reconcile(key, full=full)
                self._failures.pop(key, None)
                if delay is not None:
                    self._queue.add_after(key, delay)
            except Exception as exc:
                if _being_cancelled():
                    # Stopped meanwhile: the SDK turns a cancelled update call into an error of its
                    # own, and carrying on would keep this loop, and the controller's stop, going.
                    raise asyncio.CancelledError from exc
                self._count("errors", error_type=type(exc).__name__)
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                floor, cap = self._backoff
                delay = min(cap, floor * 2 ** (failures - 1))
                log.warning(
                    "reconcile %s failed (%s: %s); retrying in %.1fs", key, type(exc).__name__, exc, delay
                )
                self._queue.add_after(key, delay)
            finally:
                self._queue.done(key)
            if _being_cancelled():
                # A cancel that came as the call finished can be lost on the way (wait_for then
                # returns the result): still a stop.
                raise asyncio.CancelledError

    async def _health_loop(self, path: Path) -> None:
        while True:
            report = {"pid": os.getpid(), "synced": self.synced, "time": time.time(), **asdict(self.stats)}
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(report) + "\n")
            os.replace(tmp, path)
            await asyncio.sleep(2.0)

    # ------------------------------------------------------------------------------- reconcile

    def _count(self, field: str, **labels: str) -> None:
        setattr(self.stats, field, getattr(self.stats, field) + 1)
        counter = self._counters.get(field)
        if counter is not None:
            counter.add(1, dict(labels) or None)

    async def reconcile(self, key: str, *, full: bool = True) -> float | None:
        """Make the workflow match the order. Returns seconds until the key should be looked at again."""
        self._count("reconciles")
        cached = self._kube.informer(CLUSTER_ORDERS).get(*key.split("/", 1)) if "/" in key else None
        version = str(meta(cached).get("resourceVersion") or "") if cached is not None else ""
        delay = await self._reconcile(key, full)
        if cached is None:  # gone from the hub: forget it
            self.observed.pop(key, None)
            self._failures.pop(key, None)
        else:
            self.observed[key] = version
        return delay

    async def _reconcile(self, key: str, full: bool) -> float | None:
        namespace, _, name = key.partition("/")
        if not self._wanted(namespace):
            return None
        obj = self._kube.informer(CLUSTER_ORDERS).get(namespace, name)
        if obj is None:
            waiter = self._finish_waiters.pop(key, None)
            if waiter is not None:
                waiter.cancel()
            return None
        try:
            ref = OrderRef(namespace=namespace, name=name)
        except ValidationError:
            await self._refuse_name(OrderRef.model_construct(namespace=namespace, name=name), obj)
            return None  # nothing to retry: only a new order (names are immutable) can change it
        facts = order_facts(ref, obj)
        managed = FINALIZER in finalizers(obj)
        if facts.unmanaged:
            if facts.deleting and managed:
                return await self._finalize_unmanaged(key, ref)
            return None
        if facts.deleting:
            if managed:
                return await self._finalize(key, ref)
            await self._deleting_without_finalizer(ref)
            return None
        if not (_bare_metal(facts) or managed):
            return None  # not a bare-metal order
        if not full and self._generation_applied(obj, managed):
            return None  # e.g. the workflow's own status write: nothing the workflow needs
        return await self._sync(key, ref)

    async def _refuse_name(self, unchecked: OrderRef, obj: KubeObject) -> None:
        """A bare-metal order whose name is no DNS label (Kubernetes allows dots and 253
        characters): its name becomes its BMIs' names and its hosts' hostnames, so nothing can be
        made for it. Said on the order, once per generation; other orders are none of ours."""
        facts = order_facts(unchecked, obj)
        if facts.unmanaged or facts.deleting or not _bare_metal(facts):
            return
        problem = (
            f"metadata.name: {unchecked.name[:80]!r} is not a DNS label (lowercase letters, digits"
            " and '-', at most 63 characters); the order's name becomes its hosts' names, so no"
            " workers are created for it"
        )
        await self._reject(unchecked, problem, obj, judged=generation(obj))

    def _generation_applied(self, obj: KubeObject, managed: bool) -> bool:
        cond = _accepted_at(obj)
        if cond is None:
            return False
        if condition_of(obj, ControllerCondition.WORKERS_WORKFLOW_STOPPED) is not None:
            return True  # an operator must look; resyncs check again
        if cond.get("status") == ConditionStatus.FALSE.value:
            # A refused mass scale-down is confirmed by an annotation: metadata, same generation.
            return not confirmed(obj)
        return managed

    async def _sync(self, key: str, ref: OrderRef) -> float | None:
        # Decisions that start or change a workflow come from a fresh read, never from a cache that
        # may lag behind another controller's or the tenant's last write.
        obj = await self._orders.get(ref)
        if obj is None:
            return None
        facts = order_facts(ref, obj)
        if facts.unmanaged:
            return None
        if facts.deleting:
            if FINALIZER in finalizers(obj):
                return await self._finalize(key, ref)
            await self._deleting_without_finalizer(ref)
            return None
        desired = desired_node_sets(facts)
        problem = order_problem(facts)
        latest = await self._api.latest_run(ref)
        state = latest.state
        observed: Sequence[NodeSetRequest] | None = None
        if state.closed_abnormally:
            await self._workflow_stopped(ref, state, obj)
            return None
        if state == WorkflowState.RUNNING:
            status = await self._api.status(ref)
            if status.decommissioning:
                # Decommissioned outside the order (`decommission --force`): start afresh once done.
                self._await_finished(key, ref)
                return self._decommission_poll
            if problem is not None:
                await self._reject(ref, problem, obj, generation(obj))
                return None
            # Same counts: apply only an edit the workflow has not seen (its InfraEnv follows the
            # order). Another controller may have applied it a moment ago, before its condition.
            seen = (status.order_generation or 0) >= (generation(obj) or 0)
            if same_node_sets(status.node_sets, desired) and (_accepted_at(obj) is not None or seen):
                if confirmed(obj) and not _accepted_now(obj):
                    # Applied with its confirmation, but the controller stopped before it was
                    # accepted (and the confirmation removed): finish that now.
                    await self._orders.remove_confirmation(ref, generation(obj))
                await self._accepted(ref, obj, desired, generation(obj))
                return None
            observed = status.node_sets
            # The workflow refuses by the same rules, naming its command's fields; checked here too,
            # the refusal names the order's. The maximum is the one the workflow keeps from its
            # start (the controller's may have changed since); new workers' names are its to check.
            problem = node_set_problem(
                desired,
                await self._catalog.names(),
                status.max_workers_per_order,
                current=observed,
                confirm_scale_down=confirmed(obj),
                fields=OrderFields(facts),
            )
            if problem is not None:
                await self._reject(ref, problem, obj, generation(obj))
                return None
        else:
            if await self._stopped_run_may_hold_hosts(ref, obj, state):
                return self._decommission_poll
            if problem is None:
                problem = self._name_taken(ref, obj)
            if problem is None:
                instance_types = await self._catalog.names()
                problem = node_set_problem(
                    desired,
                    instance_types,
                    self._api.max_workers_per_order,
                    order=ref,
                    fields=OrderFields(facts),
                )
            if problem is not None:
                await self._reject(ref, problem, obj, generation(obj))
                return None
        # The finalizer comes before the workflow, so no workflow can exist for an order that is
        # deleted without us noticing.
        if not await self._orders.add_finalizer(ref, obj):
            return 0.5  # deleted meanwhile: look again
        # Two controllers that saw the same workflow state and the same order send the same
        # update id: the server applies the change once.
        confirm = confirmed(obj)
        closed_run = latest.run_id if state == WorkflowState.COMPLETED else None
        update_id = apply_id(facts.uid, generation(obj), desired, observed, state, confirm, closed_run)
        after_completed = closed_run is not None
        try:
            # Seen no running workflow: a new run starts with no node sets; one another controller
            # started meanwhile has its own, and this change, decided without them, is refused.
            expected = observed if observed is not None else []
            await self._apply(ref, desired, update_id, confirm, generation(obj), expected, after_completed)
            # Only a running workflow can have completed this id before.
            again = None
            if observed is not None:
                again = await self._deduplicated(ref, desired, update_id, generation(obj))
            if again is not None:
                again_id, seen_now = again
                await self._apply(ref, desired, again_id, confirm, generation(obj), seen_now, after_completed)
        except CommandError as err:
            await self._reject(ref, str(err), None, generation(obj))
            return None
        except ChangedMeanwhile as err:
            # The run stopped, or its node sets changed, since the look above: a race, not a failure
            # (no error counted); looked at again in a moment, never in a hot loop.
            log.info("%s; looking again", err)
            return CHANGED_MEANWHILE_RELOOK_S
        self._count("applies")
        if confirm:
            # A confirmation covers the change it came with, whatever it was (a scale-up, a new
            # order): left on the order, it would wave every later mistyped count through the
            # guard. (Not done, a crash or a refused write: the next look finds it applied but not
            # yet accepted, below.)
            await self._orders.remove_confirmation(ref, generation(obj))
        # The order may have been deleted meanwhile, and another controller may have looked before
        # this start landed (no workflow yet, no BMI yet) and removed our finalizer, or be about to:
        # whoever sees the order deleting after the start decommissions, so nobody else has to.
        after = await self._orders.get(ref)
        if after is None or order_facts(ref, after).deleting:
            log.warning("order %s: deleted while its workflow was being started; decommissioning it", ref.key)
            await self._decommission(ref)
            return None
        log.info(
            "order %s: node sets applied (%s)",
            ref.key,
            ", ".join(f"{n.name}={n.count}" for n in desired) or "none",
        )
        await self._accepted(ref, after, desired, generation(obj))
        return None

    async def _apply(
        self,
        ref: OrderRef,
        desired: Sequence[NodeSetRequest],
        update_id: str,
        confirm: bool,
        gen: int | None,
        expected: Sequence[NodeSetRequest] | None,
        after_completed_run: bool,
    ) -> None:
        instance_types = await self._catalog.names()
        # Sent again under the same id, a change the server holds is still applied once.
        await self._answered_in_time(
            self._api.apply(
                ref,
                desired,
                instance_types=instance_types,
                update_id=update_id,
                confirm_scale_down=confirm,
                order_generation=gen,
                expected_node_sets=expected,
                after_completed_run=after_completed_run,
            ),
            ref,
            "change",
        )

    async def _answered_in_time(self, call: Awaitable[T], ref: OrderRef, what: str) -> T:
        """`call`, an update the SDK would wait for for good (holding a reconcile slot), given up
        after the apply timeout as ChangeUnanswered."""
        sent = asyncio.ensure_future(call)
        # A stop cancels the call and leaves its error (the SDK's own, below) to nobody: retrieved
        # here, so asyncio does not log it as an ERROR when it is collected.
        sent.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            return await asyncio.wait_for(sent, self._apply_timeout)
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as err:
            # The SDK turns the cancellation `wait_for` sends at the timeout into its own error,
            # which `wait_for` passes on instead of TimeoutError. A cancel of this reconcile from
            # outside is a stop, whichever form it arrives in.
            if _being_cancelled():
                raise asyncio.CancelledError from err
            raise ChangeUnanswered(
                f"order {ref.key}: no worker took the {what} within {self._apply_timeout:g}s (workers"
                f" down, or polling another task queue than {self._api.task_queue!r})"
            ) from None

    async def _deduplicated(
        self, ref: OrderRef, desired: Sequence[NodeSetRequest], update_id: str, gen: int | None
    ) -> tuple[str, list[NodeSetRequest]] | None:
        """A new id to send the change again under, and the node sets it is decided on, if the
        server answered `update_id` from an earlier completion.

        The id is the same whenever the workflow is back in a state it had earlier in this
        generation (a named scale-down lowered it, the order's lower count never written): the
        server then returns the stored result without running the update. The workflow's node sets
        tell: still not the order's. A newer generation applied meanwhile (another controller) is
        left alone. The new id names the run and its history length, which grew since any earlier
        send, and is the same for controllers that look at the same moment."""
        now = await self._api.status(ref)
        if now.decommissioning or same_node_sets(now.node_sets, desired):
            return None
        if (now.order_generation or 0) > (gen or 0):
            return None
        description = await self._api.handle(ref).describe()
        log.info(
            "order %s: update %s was answered from an earlier completion; the workflow still has %s;"
            " sending it again",
            ref.key,
            update_id,
            ", ".join(f"{n.name}={n.count}" for n in now.node_sets) or "none",
        )
        return f"{update_id}/again/{description.run_id}/{description.history_length}", now.node_sets

    async def _accepted(
        self, ref: OrderRef, obj: KubeObject | None, desired: Sequence[NodeSetRequest], applied: int | None
    ) -> None:
        """`applied`: the generation whose node requests were applied (a later edit is not)."""
        message = "Bare-metal node requests applied: " + (
            ", ".join(f"{n.name}={n.count}" for n in sorted(desired, key=lambda n: n.name)) or "none"
        )
        await self._orders.set_condition(
            ref,
            ControllerCondition.NODE_REQUESTS_VALID,
            ConditionStatus.TRUE,
            ConditionReason.ACCEPTED,
            message,
            observed_generation=applied,
        )
        if obj is None or condition_of(obj, ControllerCondition.WORKERS_WORKFLOW_STOPPED) is not None:
            await self._orders.clear_condition(ref, ControllerCondition.WORKERS_WORKFLOW_STOPPED)

    def _name_taken(self, ref: OrderRef, obj: KubeObject) -> str | None:
        """Why a new order may not start: an older ClusterOrder of its name in another namespace,
        also one being deleted while it carries our finalizer (its decommission still releases its
        hosts; another's finalizer alone holds nothing of ours).
        BMaaS knows an order by its name (OSAC's order id), so the two would claim the same BMIs;
        the BMaaS activities refuse another namespace's BMI, but not one from before the namespace
        label, which the older order may still hold: this says so before anything starts."""

        def age(o: KubeObject) -> tuple[str, str]:
            return (str(meta(o).get("creationTimestamp") or ""), str(meta(o).get("namespace")))

        older = sorted(
            (
                o
                for o in self._kube.informer(CLUSTER_ORDERS).items()
                if meta(o).get("name") == ref.name
                and meta(o).get("namespace") != ref.namespace
                and (not meta(o).get("deletionTimestamp") or FINALIZER in finalizers(o))
                and age(o) < age(obj)
            ),
            key=age,
        )
        if not older:
            return None
        deleting = " (being decommissioned; this order is judged again at a resync once that ends)"
        return (
            f"metadata.name: ClusterOrder {meta(older[0]).get('namespace')}/{ref.name} already has this"
            " name; ClusterOrder names are OSAC order ids and must be unique across namespaces"
            + (deleting if meta(older[0]).get("deletionTimestamp") else "")
        )

    async def _reject(
        self, ref: OrderRef, problem: str, obj: KubeObject | None = None, judged: int | None = None
    ) -> None:
        """`judged`: the generation found invalid (a later edit may fix it and is not stamped)."""
        self._count("rejections")
        log.info("order %s: node requests rejected: %s", ref.key, problem)
        await self._orders.set_condition(
            ref,
            ControllerCondition.NODE_REQUESTS_VALID,
            ConditionStatus.FALSE,
            ConditionReason.INVALID,
            problem,
            obj,
            observed_generation=judged,
        )

    async def _workflow_stopped(self, ref: OrderRef, state: WorkflowState, obj: KubeObject | None) -> None:
        log.error("order %s: its workers workflow ended %s; not starting another", ref.key, state.value)
        await self._orders.set_condition(
            ref,
            ControllerCondition.WORKERS_WORKFLOW_STOPPED,
            ConditionStatus.TRUE,
            state.value,
            f"The workers workflow {cluster_workflow_id(ref)} ended {state.value}; its workers keep"
            " their hosts. Until an operator has looked (temporal workflow describe), nothing is started"
            " for this order and a deleting order keeps its finalizer: temporal workflow reset resumes"
            " the run with its workers; otherwise release the hosts, delete the run (temporal workflow"
            " delete) and remove this condition.",
            obj,
        )

    async def _finalize(self, key: str, ref: OrderRef) -> float | None:
        state = await self._api.workflow_state(ref)
        if state.closed_abnormally:
            await self._workflow_stopped(ref, state, None)
            return None
        if state == WorkflowState.RUNNING:
            await self._decommission(ref)
            self._await_finished(key, ref)
            return self._decommission_poll
        # Completed (every worker released, every BMI confirmed gone, the InfraEnv deleted) or no
        # workflow at all. Absent may also be a stopped run that retention purged, whose abandoned
        # workers still hold hosts: the finalizer goes only on a fresh look at the order and BMaaS.
        obj = await self._orders.get(ref)
        if obj is None:
            return None
        if await self._stopped_run_may_hold_hosts(ref, obj, state):
            return self._decommission_poll
        await self._orders.remove_finalizer(ref)
        self._finish_waiters.pop(key, None)
        self._count("finalized")
        log.info("order %s: workers decommissioned; finalizer removed", ref.key)
        return None

    async def _finalize_unmanaged(self, key: str, ref: OrderRef) -> float | None:
        """An order an operator took over (annotated unmanaged) and the tenant deleted still carries
        our finalizer: it goes as a managed order's does, once nothing of ours holds a host for it.
        A workflow still running for it is the operator's to decommission, not ours."""
        if await self._api.workflow_state(ref) == WorkflowState.RUNNING:
            log.warning(
                "order %s: deleted while unmanaged and its workers workflow still runs; the finalizer"
                " stays until it is decommissioned (`osac-workers decommission %s`)",
                ref.key,
                ref.key,
            )
            return self._decommission_poll
        return await self._finalize(key, ref)

    async def _stopped_run_may_hold_hosts(self, ref: OrderRef, obj: KubeObject, state: WorkflowState) -> bool:
        """Whether an order with no running workflow (absent or completed) must wait for an operator
        before the controller starts a workflow for it or removes its finalizer: its last run ended
        abnormally (the condition stays until an operator removes it, even once retention purged
        the run), or it was managed and BMaaS still lists BMIs of it (a purged run's abandoned
        workers hold them: a new run would number its slots from 0 and allocate a second set)."""
        stopped = condition_of(obj, ControllerCondition.WORKERS_WORKFLOW_STOPPED)
        if stopped is not None and stopped.get("reason") != ConditionReason.HOSTS_STILL_ALLOCATED:
            log.warning(
                "order %s: its workers workflow is %s after it ended %s; nothing is started or finalized"
                " until an operator removes the condition %s",
                ref.key,
                state.value,
                stopped.get("reason"),
                ControllerCondition.WORKERS_WORKFLOW_STOPPED.value,
            )
            return True
        if FINALIZER not in finalizers(obj):
            return False  # never managed: no workflow of ours ever allocated for it
        held = await self._order_bmis(ref)
        if not held:
            return False
        if await self._api.workflow_state(ref) == WorkflowState.RUNNING:
            return True  # started meanwhile (another controller): the next look takes it from there
        log.error(
            "order %s: no workers workflow runs (%s) but BMaaS still lists its BMIs %s; nothing is"
            " started or finalized",
            ref.key,
            state.value,
            ", ".join(held),
        )
        await self._orders.set_condition(
            ref,
            ControllerCondition.WORKERS_WORKFLOW_STOPPED,
            ConditionStatus.TRUE,
            ConditionReason.HOSTS_STILL_ALLOCATED,
            f"No workers workflow runs for this order ({cluster_workflow_id(ref)}: {state.value}), yet"
            f" BMaaS still lists its BareMetalInstances {', '.join(held)}. No workflow is started and a"
            " deleting order keeps its finalizer until they are released and wiped; an operator must"
            f" find what holds them (temporal workflow list --query \"OsacClusterOrder='{ref.key}'\").",
            obj,
        )
        return True

    async def _deleting_without_finalizer(self, ref: OrderRef) -> None:
        """A deleting order without our finalizer: a workflow still running for it was started
        after the finalizer went (a start racing the deletion) and would hold its hosts for ever."""
        if await self._api.workflow_state(ref) != WorkflowState.RUNNING:
            return
        log.warning("order %s: deleting without our finalizer, but its workers workflow runs", ref.key)
        await self._decommission(ref)

    async def _decommission(self, ref: OrderRef) -> None:
        status = await self._api.status(ref)
        if status.decommissioning:
            return
        try:
            await self._answered_in_time(self._api.decommission(ref), ref, "decommission")
            self._count("decommissions")
            log.info("order %s: deleting; decommissioning its workers", ref.key)
        except CommandError as err:
            log.info("order %s: decommission already under way (%s)", ref.key, err)

    async def _order_bmis(self, ref: OrderRef) -> list[str]:
        """The BMIs BMaaS lists for the order, any state (DELETING: not wiped yet). None listed by
        a token that cannot see CaaS's objects is an error, not an empty list (the client's canary)."""
        return sorted(s.name or s.id for s in await order_snapshots(self._bmaas, ref))

    def _await_finished(self, key: str, ref: OrderRef) -> None:
        """Look at the key again the moment its workflow completes (the poll is only a fallback)."""
        current = self._finish_waiters.get(key)
        if current is not None and not current.done():
            return

        async def wait() -> None:
            with contextlib.suppress(Exception):
                await self._api.wait_finished(ref)
            self._queue.add(key, True)

        self._finish_waiters[key] = asyncio.create_task(wait(), name=f"finished-{key}")


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _bare_metal(facts: OrderFacts) -> bool:
    """The order asks for bare-metal workers (valid node requests or not)."""
    return bool(facts.node_sets or facts.invalid_node_requests)


def _accepted_now(obj: KubeObject) -> bool:
    """NodeRequestsValid=True recorded for the order's current generation."""
    cond = _accepted_at(obj)
    return cond is not None and cond.get("status") == ConditionStatus.TRUE.value


def _accepted_at(obj: KubeObject) -> KubeObject | None:
    """`NodeRequestsValid` when it was written for the order's current generation (either status)."""
    cond = condition_of(obj, ControllerCondition.NODE_REQUESTS_VALID)
    return cond if cond is not None and cond.get("observedGeneration") == generation(obj) else None
