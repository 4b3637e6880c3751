"""The library API: typed calls over a Temporal client, for the controller, the CLI and any caller.

Wire contract (what a Go caller needs; JSON Schemas of every payload are in `schemas/`):
- workflow `ClusterWorkersWorkflow`, id `cluster-workers/<namespace>/<order>`, task queue
  `osac-workers`; input `ClusterWorkersInput`.
- update `set_node_sets(SetNodeSets) -> ClusterWorkersStatus` (sent with update-with-start,
  conflict policy USE_EXISTING, reuse policy REJECT_DUPLICATE unless starting afresh after a
  completed run; `expected_node_sets` refused as `NodeSetsSuperseded` when the node sets changed),
  update `decommission() -> ClusterWorkersStatus`, update
  `release_worker(ScaleDownWorker) -> ReleasedWorker` (refused for an unknown or departing worker;
  the signal `scale_down_worker(ScaleDownWorker)` does the same without an answer), query
  `status() -> ClusterWorkersStatus`.
- each worker: `WorkerNodeWorkflow`, id `worker/<namespace>/<order>/<order>-worker-<index>`,
  query `status() -> WorkerStatus`, signal `scale_down()` (sent by the cluster workflow).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from contracts.refs import OrderRef
from contracts.worker import TimingPolicy
from contracts.workflows import (
    BMAAS_TASK_QUEUE,
    DEFAULT_MAX_WORKERS_PER_ORDER,
    NODE_SETS_SUPERSEDED,
    WORKFLOW_TASK_QUEUE,
    ClusterWorkersInput,
    ClusterWorkersStatus,
    NodeSetRequest,
    ScaleDownWorker,
    SetNodeSets,
    cluster_workflow_id,
)
from workflows.cluster_workers import ClusterWorkersWorkflow


class CommandError(Exception):
    """A command the workflow (or this API) refused; the message names the field and the reason."""


class OrderNotFound(CommandError):
    pass


class StatusUnanswered(CommandError):
    """No worker answered the status query in time: busy or down, so asking again may succeed."""


class ChangedMeanwhile(Exception):
    """What the caller decided on changed before its command landed: a closed run holds the order's
    workflow id where it expected a running one or none (terminated by an operator a moment ago),
    or the workflow has other node sets than it saw. Nothing was started or changed; look again."""


class WorkflowState(StrEnum):
    """Where an order's workers workflow stands (its latest run)."""

    ABSENT = "Absent"
    RUNNING = "Running"
    COMPLETED = "Completed"  # decommissioned: every BMI gone, the InfraEnv deleted
    FAILED = "Failed"
    CANCELED = "Canceled"
    TERMINATED = "Terminated"
    TIMED_OUT = "TimedOut"

    @property
    def closed_abnormally(self) -> bool:
        return self in (
            WorkflowState.FAILED,
            WorkflowState.CANCELED,
            WorkflowState.TERMINATED,
            WorkflowState.TIMED_OUT,
        )


def stopped_run_text(order: OrderRef, state: WorkflowState) -> str:
    """Why an order whose workers workflow closed abnormally takes no change, and the recourse."""
    return (
        f"the workers workflow of order {order.key} is {state}: it takes no change until an operator"
        " resets it or releases its hosts (its WorkersWorkflowStopped condition says how)"
    )


@dataclass(frozen=True)
class LatestRun:
    """An order's latest workers workflow run: its state, and its id (None when there is none)."""

    state: WorkflowState
    run_id: str | None = None


_STATES = {
    WorkflowExecutionStatus.RUNNING: WorkflowState.RUNNING,
    WorkflowExecutionStatus.CONTINUED_AS_NEW: WorkflowState.RUNNING,
    WorkflowExecutionStatus.COMPLETED: WorkflowState.COMPLETED,
    WorkflowExecutionStatus.FAILED: WorkflowState.FAILED,
    WorkflowExecutionStatus.CANCELED: WorkflowState.CANCELED,
    WorkflowExecutionStatus.TERMINATED: WorkflowState.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT: WorkflowState.TIMED_OUT,
}


def _state_of(status: WorkflowExecutionStatus | None) -> WorkflowState:
    return _STATES.get(status or WorkflowExecutionStatus.RUNNING, WorkflowState.RUNNING)


# A query is answered by a worker; without one it would wait for the server's long default.
QUERY_TIMEOUT = timedelta(seconds=20)


def _unanswered(err: RPCError, waited: float) -> bool:
    """No worker answered by QUERY_TIMEOUT: the server's DEADLINE_EXCEEDED, or the client's own
    deadline first (the SDK's CANCELLED "Timeout expired"); a CANCELLED sooner is something else."""
    if err.status == RPCStatusCode.DEADLINE_EXCEEDED:
        return True
    return err.status == RPCStatusCode.CANCELLED and waited >= 0.9 * QUERY_TIMEOUT.total_seconds()


def _retrieve_start_error(start: WithStartWorkflowOperation[Any, Any]) -> None:
    """The start operation also keeps a failed (or cancelled) start's error in a future of its
    own, which nothing awaits: the call raised that error already. Left unretrieved, asyncio logs it
    as an ERROR with a traceback when the future is collected ("Future exception was never
    retrieved"), for every refused or timed-out change. (temporalio 1.35 keeps it in
    `_workflow_handle`; if that moves, this does nothing and the test says so.)"""
    pending = getattr(start, "_workflow_handle", None)
    if isinstance(pending, asyncio.Future) and pending.done() and not pending.cancelled():
        pending.exception()


def _rejection(err: WorkflowUpdateFailedError) -> CommandError:
    cause = err.cause
    message = getattr(cause, "message", None) or str(cause or err)
    return CommandError(message)


class WorkersApi:
    def __init__(
        self,
        client: Client,
        *,
        task_queue: str = WORKFLOW_TASK_QUEUE,
        bmaas_task_queue: str = BMAAS_TASK_QUEUE,
        policy: TimingPolicy | None = None,
        max_workers_per_order: int = DEFAULT_MAX_WORKERS_PER_ORDER,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.bmaas_task_queue = bmaas_task_queue
        self.policy = policy or TimingPolicy()
        if problems := self.policy.problems():  # refused before any workflow is started with it
            raise ValueError("policy: " + "; ".join(problems))
        self.max_workers_per_order = max_workers_per_order

    def handle(self, order: OrderRef) -> WorkflowHandle[ClusterWorkersWorkflow, ClusterWorkersStatus]:
        return self.client.get_workflow_handle_for(ClusterWorkersWorkflow.run, cluster_workflow_id(order))

    async def apply(
        self,
        order: OrderRef,
        node_sets: Sequence[NodeSetRequest],
        instance_types: Sequence[str] = (),
        *,
        update_id: str | None = None,
        confirm_scale_down: bool = False,
        order_generation: int | None = None,
        expected_node_sets: Sequence[NodeSetRequest] | None = None,
        after_completed_run: bool = False,
    ) -> ClusterWorkersStatus:
        """Ensure the order's workflow runs and set its node sets, in one call (idempotent).

        `update_id`: callers that may send the same change twice (two controllers) pass an id
        derived from the change; the server then applies it once and answers both.
        `confirm_scale_down`: let a mass scale-down through the workflow's guard.
        `order_generation`: the ClusterOrder generation this comes from (the status reports it).
        `expected_node_sets`: the node sets the caller saw when it decided (empty: it saw no running
        workflow); the change is refused (ChangedMeanwhile) if the workflow's differ by now.
        `after_completed_run`: the caller found the order's last run completed (decommissioned) and
        means to start afresh. Otherwise a closed run under the id is never replaced: a run an
        operator terminated after the caller looked must stay stopped (a new one would number its
        slots from 0 and tell the stopped run's workers, which still hold their hosts, to leave);
        ChangedMeanwhile says so."""
        start = WithStartWorkflowOperation(
            ClusterWorkersWorkflow.run,
            ClusterWorkersInput(
                order=order,
                instance_types=sorted(instance_types),
                max_workers_per_order=self.max_workers_per_order,
                policy=self.policy,
                bmaas_task_queue=self.bmaas_task_queue,
            ),
            id=cluster_workflow_id(order),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=(
                WorkflowIDReusePolicy.ALLOW_DUPLICATE
                if after_completed_run
                else WorkflowIDReusePolicy.REJECT_DUPLICATE
            ),
            static_summary=f"Bare-metal workers of ClusterOrder {order.key}",
            static_details=f"Order: {order.key}\nInfraEnv: {order.namespace}/{order.infraenv_name}",
        )
        try:
            return await self.client.execute_update_with_start_workflow(
                ClusterWorkersWorkflow.set_node_sets,
                SetNodeSets(
                    node_sets=list(node_sets),
                    confirm_scale_down=confirm_scale_down,
                    order_generation=order_generation,
                    instance_types=sorted(instance_types) if instance_types else None,
                    expected_node_sets=None if expected_node_sets is None else list(expected_node_sets),
                ),
                start_workflow_operation=start,
                id=update_id,
            )
        except WorkflowUpdateFailedError as err:
            if getattr(err.cause, "type", None) == NODE_SETS_SUPERSEDED:
                raise ChangedMeanwhile(f"order {order.key}: {_rejection(err)}") from err
            raise _rejection(err) from err
        except WorkflowAlreadyStartedError as err:
            raise ChangedMeanwhile(
                f"order {order.key}: a closed run holds its workflow id; nothing was started"
            ) from err
        finally:
            _retrieve_start_error(start)

    async def status(self, order: OrderRef, *, field: str | None = None) -> ClusterWorkersStatus:
        """The latest run's status (its `status` query). `field`: the input a command's refusal
        names when the run turns out stopped."""
        try:
            return await self._query_status(self.handle(order), order, field=field)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise OrderNotFound(f"order {order.key}: no workers workflow exists for it") from err
            raise

    async def live_status(self, order: OrderRef) -> ClusterWorkersStatus:
        """`status`, for a follower: a latest run stopped abnormally is a CommandError naming its
        state (its last status, answered by replay, would read as still under way for ever)."""
        state = await self.workflow_state(order)
        if state == WorkflowState.ABSENT:
            raise OrderNotFound(f"order {order.key}: no workers workflow exists for it")
        if state.closed_abnormally:
            raise CommandError(stopped_run_text(order, state))
        return await self.status(order)

    async def _query_status(
        self,
        handle: WorkflowHandle[Any, Any],
        order: OrderRef,
        *,
        field: str | None = None,
        state: WorkflowState | None = None,
    ) -> ClusterWorkersStatus:
        """The `status` query of `handle`'s run. No answer in time is StatusUnanswered; a stopped
        run's refusal is explained (`_refuse_if_stopped`); any other error is left as it is."""
        started = time.monotonic()
        try:
            result: ClusterWorkersStatus = await handle.query(
                ClusterWorkersWorkflow.status, rpc_timeout=QUERY_TIMEOUT
            )
            return result
        except RPCError as err:
            if _unanswered(err, time.monotonic() - started):
                raise StatusUnanswered(
                    f"order {order.key}: no worker answered the status query within"
                    f" {QUERY_TIMEOUT.total_seconds():.0f}s (is `osac-workers worker` running on task"
                    f" queue {self.task_queue}?)"
                ) from err
            await self._refuse_if_stopped(order, err, field=field, state=state)
            raise

    async def _refuse_if_stopped(
        self, order: OrderRef, err: RPCError, *, field: str | None = None, state: WorkflowState | None = None
    ) -> None:
        """A run closed before its first workflow task has no state to replay, and the server
        refuses queries on it ("closed before WorkflowTaskStarted"): say what stopped it (`state`:
        that run's, when known; otherwise the latest run's). Anything else (a running run whose
        task keeps failing, say), or no answer, leaves `err` as it is."""
        if err.status != RPCStatusCode.FAILED_PRECONDITION:
            return
        if state is None:
            try:
                state = await self.workflow_state(order)
            except RPCError:
                return
        if state.closed_abnormally:
            prefix = f"{field}: " if field else ""
            raise CommandError(prefix + stopped_run_text(order, state)) from err

    async def run_id(self, order: OrderRef) -> str:
        """The id of the order's latest run (to follow that run even if another one starts later)."""
        try:
            return (await self.handle(order).describe()).run_id
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise OrderNotFound(f"order {order.key}: no workers workflow exists for it") from err
            raise

    async def run_status(self, order: OrderRef, run_id: str) -> ClusterWorkersStatus:
        """The status of the run `run_id` and the runs it continued as: the `status` query of the
        one running now, or the result of the one that completed (no worker replays its history)."""
        while True:
            handle = self.client.get_workflow_handle_for(
                ClusterWorkersWorkflow.run, cluster_workflow_id(order), run_id=run_id
            )
            described = (await handle.describe()).status
            if described == WorkflowExecutionStatus.COMPLETED:
                return await handle.result(follow_runs=False)
            if _state_of(described).closed_abnormally:
                # Its last status would read as still under way, for as long as anyone follows it.
                raise CommandError(stopped_run_text(order, _state_of(described)))
            if described != WorkflowExecutionStatus.CONTINUED_AS_NEW:
                return await self._query_status(handle, order, state=_state_of(described))  # this run's
            async for event in handle.fetch_history_events(
                event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
            ):
                if event.HasField("workflow_execution_continued_as_new_event_attributes"):
                    run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id

    async def latest_run(self, order: OrderRef) -> LatestRun:
        """The latest run's state and id, from the server (needs no worker)."""
        try:
            description = await self.handle(order).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return LatestRun(WorkflowState.ABSENT)
            raise
        return LatestRun(_state_of(description.status), description.run_id)

    async def workflow_state(self, order: OrderRef) -> WorkflowState:
        """The latest run's state, from the server (needs no worker)."""
        return (await self.latest_run(order)).state

    async def scale(
        self, order: OrderRef, node_set: str, count: int, *, confirm_scale_down: bool = False
    ) -> ClusterWorkersStatus:
        """Set one node set's count, keeping the others as they are."""
        current = await self.status(order, field="node_set")
        if current.finished or current.decommissioning:
            state = "decommissioned" if current.finished else "being decommissioned"
            raise CommandError(f"node_set: order {order.key} is {state}; it takes no more changes")
        sets = {n.name: n for n in current.node_sets}
        if node_set not in sets:
            known = ", ".join(sorted(sets)) or "none"
            raise CommandError(f"node_set: order {order.key} has no node set {node_set!r} (known: {known})")
        sets[node_set] = sets[node_set].model_copy(update={"count": count})
        try:
            return await self.handle(order).execute_update(
                ClusterWorkersWorkflow.set_node_sets,
                SetNodeSets(node_sets=list(sets.values()), confirm_scale_down=confirm_scale_down),
            )
        except WorkflowUpdateFailedError as err:
            raise _rejection(err) from err
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:  # the run closed since the status query
                raise await self._not_running(order, "node_set") from err
            raise

    async def scale_down_worker(self, order: OrderRef, worker: str) -> NodeSetRequest:
        """Release one named worker (update `release_worker`); returns its node set with the
        workflow's lowered count. The workflow refuses a worker already leaving, or named by another
        caller a moment before: a caller that then lowered the order's count would make the workflow
        release a worker nobody named."""
        current = await self.status(order, field="worker")  # no workflow, no worker answering: said first
        if current.finished:
            raise CommandError(f"worker: order {order.key} is decommissioned")
        try:
            released = await self.handle(order).execute_update(
                ClusterWorkersWorkflow.release_worker, ScaleDownWorker(name=worker)
            )
        except WorkflowUpdateFailedError as err:
            raise _rejection(err) from err
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:  # the run closed (or was closed) before
                raise await self._not_running(order, "worker") from err
            raise
        return released.node_set

    async def decommission(self, order: OrderRef, *, update_id: str | None = None) -> ClusterWorkersStatus:
        """Release every worker, then the InfraEnv. `update_id` as in `apply`: a caller retrying
        the same request after a lost answer gets the first answer instead of a rejection."""
        try:
            return await self.handle(order).execute_update(ClusterWorkersWorkflow.decommission, id=update_id)
        except WorkflowUpdateFailedError as err:
            raise _rejection(err) from err
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            raise await self._not_running(order, "decommission") from err

    async def _not_running(self, order: OrderRef, field: str) -> CommandError:
        """Why a command found no running workflow to take it, from the latest run's state."""
        state = await self.workflow_state(order)
        if state == WorkflowState.ABSENT:
            return OrderNotFound(f"order {order.key}: no workers workflow exists for it")
        if state == WorkflowState.COMPLETED:
            return CommandError(f"{field}: order {order.key} is decommissioned; it takes no more changes")
        if state == WorkflowState.RUNNING:  # the run closed and a new one started meanwhile
            return CommandError(f"{field}: order {order.key} has a new workers workflow run; try again")
        return CommandError(f"{field}: {stopped_run_text(order, state)}")

    async def wait_finished(self, order: OrderRef) -> ClusterWorkersStatus:
        """Block until decommission completed: every BMI gone and the InfraEnv deleted."""
        return await self.handle(order).result()
