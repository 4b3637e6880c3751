"""WorkerNodeWorkflow: one bare-metal worker slot from allocation to a wiped, released host.

Provisioning -> WaitingForAgent -> Binding -> Ready, then on scale-down Unbinding -> Deleting -> done.
A failure before Ready cleans up (agent, BMI, wipe), waits the policy's backoff in Failed and tries
again; it never gives up on its own. A Ready worker whose host is lost leaves as on a scale-down.
Deterministic: no I/O, `workflow.now()`, sandboxed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as ActivityTimedOut

with workflow.unsafe.imports_passed_through():
    from contracts.activities import BmaasActivity, HubActivity
    from contracts.bmaas import (
        CreateWorkerInstanceInput,
        CreateWorkerInstanceResult,
        FindInstancesWithMacsInput,
        InstanceGone,
        InstanceRunning,
        InstancesWithMacs,
        ListOrderInstancesInput,
        LostInstance,
        OrderInstances,
        WaitInstanceGoneInput,
        WaitInstanceRunningInput,
        WorkerInstance,
        create_margin,
    )
    from contracts.hub import (
        AgentHandOff,
        AgentMatch,
        AgentRef,
        AgentWatch,
        HandAgentInput,
        InfraEnvRef,
        NodePoolRef,
        ReleaseAgentInput,
        ReleasedAgents,
        ReleaseWipedHostAgentsInput,
        UnbindAgentInput,
        WaitAgentInstalledInput,
        WaitAndHandAgentInput,
        WatchAgentInput,
    )
    from contracts.worker import (
        TENANT_MESSAGES,
        CarriesReport,
        FailingRequests,
        FailureReason,
        ReportDelivery,
        TimingPolicy,
        WorkerPhase,
        WorkerStatus,
    )
    from contracts.workflows import (
        AgentRegistered,
        FailedAttempt,
        WorkerNodeInput,
        WorkerNodeResult,
        WorkerOutcome,
        WorkerProgress,
        WorkerReport,
        WorkerRevision,
    )
    from workflows.activity_calls import bmaas_call_through_outages, call_activity, ran_out_of_attempts
    from workflows.metrics import record_correlation_duration, record_provisioning_duration
    from workflows.search_attributes import (
        OSAC_ATTEMPT,
        OSAC_BARE_METAL_INSTANCE,
        OSAC_CLUSTER_ORDER,
        OSAC_NODE_SET,
        OSAC_WORKER_PHASE,
    )

T = TypeVar("T")


class WorkerPatch(StrEnum):
    """Behaviour changes guarded by `workflow.patched`, so histories recorded before them replay."""

    # A scale-down whose cancel a finishing step used up stops the attempt before its next step.
    STOP_BETWEEN_STEPS = "stop-between-steps"
    # After a create that ended unanswered, the release looks for the slot's BMI only once the
    # create can no longer make it (it posts only within its attempt): a margin later.
    CREATE_SETTLED_BEFORE_RELEASE = "create-settled-before-release"
    # A teardown that keeps waiting (a drain that hangs, a release that keeps failing) continues as
    # new when the history grows long, instead of being ended by the server's limit with its host.
    TEARDOWN_CONTINUES_AS_NEW = "teardown-continues-as-new"
    # So does a failed attempt's release; the next run finishes it before the next attempt.
    FAILED_RELEASE_CONTINUES_AS_NEW = "failed-release-continues-as-new"
    # A step that fails as a scale-down cancels it is not the attempt's failure: the worker is
    # released as asked, never shown Failed (with a WorkerFailed Event) on its way out.
    SCALE_DOWN_OUTRANKS_FAILURE = "scale-down-outranks-failure"
    # A create that failed for good may still have an earlier attempt's POST unanswered: its
    # release waits the margin before it looks for the slot's BMI, as after a timeout.
    CREATE_UNSETTLED_AFTER_ANY_FAILURE = "create-unsettled-after-any-failure"
    # `host_lost` in a run's first workflow task (the SDK applies signals before the run reads its
    # input) is judged once the run has its state, instead of being dropped.
    HOST_LOST_BEFORE_START = "host-lost-before-start"
    # A cancellation requested from outside is a scale-down: the host is released and wiped before
    # the run ends, instead of the run ending Canceled with its host allocated.
    CANCEL_RELEASES = "cancel-releases"
    # A restarted release lists the slot's BMIs first and gives their MACs to the Agent release, so
    # an Agent that registered but was not handed over yet (the stopped run's wait was matching it)
    # is deleted with its host instead of staying on the hub.
    RESTARTED_RELEASE_FINDS_REGISTRATIONS = "restarted-release-finds-registrations"
    # A host that may run the discovery image when its Agent is released registers again (its agent
    # restarts when the Agent is deleted) until BMaaS powers it off: its registrations are deleted
    # once more after the wipe, while no BMI of the order holds the host, instead of staying on the
    # hub until the decommission's sweep.
    REGISTRATIONS_SWEPT_AFTER_WIPE = "registrations-swept-after-wipe"
    # A Ready worker whose host is lost leaves (Unbinding, Deleting, its reason HostLost shown) and
    # its order replaces it with a new worker; before, it failed and came back in its slot after a
    # backoff, though Failed is only for attempts that never reached Ready.
    LOST_HOST_LEAVES = "lost-host-leaves"
    # A scale-down that lands while BMaaS is asked about an Agent's extra NIC (a call its cancel
    # cannot reach) stops the attempt once it is answered, before the Agent is handed over.
    STOP_AFTER_NIC_CHECK = "stop-after-nic-check"


FAILURE_TYPES = {reason.value: reason for reason in FailureReason}
# A timer must be positive; a deadline already passed fires at once.
MIN_TIMER = timedelta(milliseconds=10)


def registrations_cutoff(listed: OrderInstances, macs: list[str]) -> datetime | None:
    """Until when a wiped host's registrations are surely its release's: when the order's BMIs were
    listed, if none of them held the host (matched here, not left to the activity's filter). None:
    one holds it, or the list's time is unknown (an activity worker older than `listed_at`)."""
    wanted = set(macs)
    if listed.listed_at is None or any(wanted.intersection(bmi.macs) for bmi in listed.instances):
        return None
    return listed.listed_at


class AttemptFailed(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def _failure_of(err: ActivityError | ApplicationError) -> AttemptFailed:
    """Map a non-retryable activity error to the OSAC failure reason it stands for. A local
    activity's failure arrives as the activity's own ApplicationError, a remote one's as its cause."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError) and cause.type in FAILURE_TYPES:
        return AttemptFailed(FAILURE_TYPES[cause.type], cause.message)
    if isinstance(cause, ApplicationError) and (cause.type or "").startswith("Bmaas"):
        return AttemptFailed(FailureReason.BMI_PROVISIONING_FAILED, f"{cause.type}: {cause.message}")
    return AttemptFailed(FailureReason.INTERNAL_ERROR, str(cause or err))


@workflow.defn
class WorkerNodeWorkflow:
    def __init__(self) -> None:
        self._pending_reports: list[asyncio.Future[None]] = []
        self._scale_down = False
        self._progress: WorkerProgress | None = None
        self._input: WorkerNodeInput | None = None
        self._agent_registered: AgentRegistered | None = None
        self._reports_by_activities = False
        self._hands_in_wait = False
        # The latest status change not yet handed to an activity or signalled.
        self._unsent: WorkerReport | None = None
        # The `deleted` report the last wipe wait delivers on success, so the end need not repeat it.
        self._deleted_delivered: WorkerReport | None = None
        self._tearing_down = False
        # From the cluster workflow: this Ready worker's BMI no longer runs its node.
        self._host_lost: LostInstance | None = None
        # `host_lost` that came before the run read its input: judged by the run.
        self._host_lost_before_start: LostInstance | None = None
        # Whether a cancel request is taken as a scale-down (None: none came yet).
        self._cancel_is_scale_down: bool | None = None

    # ----------------------------------------------------------------------------------- API

    @workflow.signal
    def scale_down(self) -> None:
        """Release this worker: unbind, delete, wipe. Idempotent."""
        self._scale_down = True
        if self._progress is not None:
            self._progress.scale_down_requested = True

    @workflow.signal
    def agent_registered(self, report: AgentRegistered) -> None:
        """From the watch started by watch_agent_for_macs. Only news of this attempt's host counts."""
        if self._news_of_current_host(WorkerPhase.WAITING_FOR_AGENT, report.bmi_id):
            self._agent_registered = report

    @workflow.signal
    def host_lost(self, lost: LostInstance) -> None:
        """From the cluster workflow's check of its Ready workers' BMIs. Counts only for the current
        BMI of a Ready worker: a worker already leaving or replacing it has nothing to do."""
        if self._progress is None:
            self._host_lost_before_start = lost
        elif self._news_of_current_host(WorkerPhase.READY, lost.bmi_id):
            self._host_lost = lost

    def _news_of_current_host(self, phase: WorkerPhase, bmi_id: str | None) -> bool:
        """News sent from outside counts only in the phase that waits for it, about the current BMI."""
        progress = self._progress
        return progress is not None and progress.status.phase == phase and bmi_id == progress.bmi_id

    @workflow.query
    def status(self) -> WorkerStatus:
        assert self._progress is not None
        return self._progress.status

    # ------------------------------------------------------------------------------ main flow

    @workflow.run
    async def run(self, inp: WorkerNodeInput) -> WorkerNodeResult:
        """The worker's life runs beside this method, so that a cancellation requested from outside
        (the Web UI's "cancel") reaches only this method: it is taken as a scale-down, and the host
        is released and wiped, instead of the run ending with its host allocated and nobody left to
        release it. A leaving worker takes it as the no-op a second scale-down is."""
        life = asyncio.ensure_future(self._live(inp))
        while True:
            try:
                await workflow.wait_condition(life.done)
                return life.result()
            except asyncio.CancelledError:
                if life.done() or not self._take_cancel_as_scale_down():
                    # As before the patch: the cancellation goes through the life, which ends with it.
                    life.cancel()
                    await workflow.wait_condition(life.done)
                    return life.result()

    def _take_cancel_as_scale_down(self) -> bool:
        """Whether this run takes a cancel request as a scale-down (decided once; recorded runs
        from before the patch do not), and if so, the scale-down."""
        if self._cancel_is_scale_down is None:
            self._cancel_is_scale_down = workflow.patched(WorkerPatch.CANCEL_RELEASES.value)
            if self._cancel_is_scale_down:
                workflow.logger.warning("worker workflow cancelled from outside: releasing its host")
        if self._cancel_is_scale_down:
            self.scale_down()
        return self._cancel_is_scale_down

    async def _wait(
        self,
        done: Callable[[], bool],
        *,
        timeout: float | timedelta | None = None,
        timeout_summary: str | None = None,
    ) -> None:
        """`workflow.wait_condition` for the life. With the SDK's single-batch activations (workflow
        logic flag 2, meant to become its default), a wait that began before a cancel request raises
        CancelledError when it ends: that request is a scale-down here, so the wait ends as it would
        have (a TimeoutError if it timed out). A cancellation of the task itself still goes through."""
        try:
            await workflow.wait_condition(done, timeout=timeout, timeout_summary=timeout_summary)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not self._take_cancel_as_scale_down():
                raise
            if timeout is not None and not done():
                raise TimeoutError() from None

    async def _live(self, inp: WorkerNodeInput) -> WorkerNodeResult:
        self._input = inp
        self._reports_by_activities = inp.revision >= WorkerRevision.ACTIVITY_REPORTS
        self._hands_in_wait = inp.revision >= WorkerRevision.AGENT_HANDED_IN_WAIT
        slot = inp.slot
        self._progress = inp.progress or WorkerProgress(
            status=WorkerStatus(node_set=slot.node_set, name=slot.name)
        )
        self._scale_down = self._scale_down or self._progress.scale_down_requested
        self._progress.scale_down_requested = self._scale_down
        early, self._host_lost_before_start = self._host_lost_before_start, None
        if (
            early is not None
            and self._news_of_current_host(WorkerPhase.READY, early.bmi_id)
            and workflow.patched(WorkerPatch.HOST_LOST_BEFORE_START.value)
        ):
            self._host_lost = early
        # The parent sets these at start; a run that lacks them (continued, or started by hand)
        # sets them here, in one upsert.
        status = self._progress.status
        wanted: list[SearchAttributeUpdate[Any]] = [
            OSAC_CLUSTER_ORDER.value_set(slot.order.key),
            OSAC_NODE_SET.value_set(slot.node_set),
            OSAC_WORKER_PHASE.value_set(status.phase.value),
            OSAC_ATTEMPT.value_set(status.attempt_count),
        ]
        if self._progress.bmi_id is not None:
            wanted.append(OSAC_BARE_METAL_INSTANCE.value_set(self._progress.bmi_id))
        current = workflow.info().typed_search_attributes
        missing = [u for u in wanted if current.get(u.key) != u.value]
        if missing:
            workflow.upsert_search_attributes(missing)

        while not self._scale_down:
            if (failed := self._progress.releasing_failed_attempt) is not None:
                await self._release_failed_attempt(failed)  # begun by an earlier run
                continue
            if self._progress.status.phase == WorkerPhase.READY:
                await self._flush_reports()
                await self._wait(
                    lambda: (
                        self._scale_down
                        or self._host_lost is not None
                        or workflow.info().is_continue_as_new_suggested()
                    )
                )
                if self._host_lost is not None and workflow.patched(WorkerPatch.LOST_HOST_LEAVES.value):
                    # Released like a scale-down's victim (its order, told, starts a new worker), the
                    # reason shown meanwhile; the order's scale-down signal follows.
                    lost, self._host_lost = self._host_lost, None
                    workflow.logger.warning("worker lost its host, leaving: %s", lost.describe())
                    self._record_failure(AttemptFailed(FailureReason.HOST_LOST, lost.describe()))
                    self.scale_down()
                    break
                if self._scale_down:
                    break
                if self._host_lost is not None:
                    # Released (Agent unbound, BMI deleted and wiped) and replaced like any failure.
                    lost, self._host_lost = self._host_lost, None
                    await self._fail(AttemptFailed(FailureReason.HOST_LOST, lost.describe()))
                    continue
                await self._continue_as_new()
            if self._progress.status.phase == WorkerPhase.FAILED:
                await self._wait_backoff()
                if self._scale_down:
                    break
                if workflow.info().is_continue_as_new_suggested():
                    await self._continue_as_new()
                self._progress.status.attempt_count += 1
                self._progress.status.next_retry_time = None
                self._set_phase(WorkerPhase.PROVISIONING)
            await self._attempt_until_ready_or_scale_down()

        await self._teardown()
        await self._report_change(deleted=True)
        return WorkerNodeResult(
            name=slot.name, outcome=WorkerOutcome.DELETED, attempts=self._progress.status.attempt_count
        )

    async def _attempt_until_ready_or_scale_down(self) -> None:
        """Run one provisioning attempt; a scale-down cancels it wherever it is."""
        attempt = asyncio.ensure_future(self._provision())
        await self._wait(lambda: attempt.done() or self._scale_down)
        if not attempt.done():
            attempt.cancel()
        try:
            await attempt
        except (asyncio.CancelledError, CancelledError):
            if not self._scale_down:
                raise
        except AttemptFailed as failure:
            if self._scale_down and workflow.patched(WorkerPatch.SCALE_DOWN_OUTRANKS_FAILURE.value):
                workflow.logger.info("worker attempt ended as it was scaled down: %s", failure)
                return  # the teardown releases what the attempt held
            await self._fail(failure)

    async def _provision(self) -> None:
        progress, slot = self._state()
        if progress.status.phase == WorkerPhase.PROVISIONING:
            if progress.provisioning_since is None:
                progress.provisioning_since = workflow.now()
            try:
                created = await self._bmaas(
                    BmaasActivity.CREATE_WORKER_INSTANCE,
                    CreateWorkerInstanceInput(
                        order=slot.order,
                        slot_index=slot.index,
                        instance_type=slot.instance_type,
                        release_image=slot.release_image,
                        network_attachment=slot.network,
                    ),
                    CreateWorkerInstanceResult,
                    summary=f"Allocate a {slot.instance_type} host as BMI {slot.name}",
                )
            except asyncio.CancelledError:
                # Cancelled between attempts (a retry's backoff after a POST given up unanswered):
                # as doubtful as a timeout.
                progress.create_unsettled = True
                raise
            except AttemptFailed as failure:
                # Timed out, or a retryable error that ended it (retries stop once a scale-down
                # asked to cancel): its POST may still make the BMI. A decided error cannot, but
                # it may follow an attempt whose POST went unanswered (the workflow cannot tell).
                cause = failure.__cause__
                error = cause.cause if isinstance(cause, ActivityError) else None
                if isinstance(error, ActivityTimedOut) or (
                    isinstance(error, ApplicationError) and not error.non_retryable
                ):
                    progress.create_unsettled = True
                elif workflow.patched(WorkerPatch.CREATE_UNSETTLED_AFTER_ANY_FAILURE.value):
                    progress.create_unsettled = True
                raise
            progress.bmi_id = created.instance.id
            progress.status.resource_id = created.instance.id
            self._stop_if_scaled_down()
            running = await self._bmaas(
                BmaasActivity.WAIT_INSTANCE_RUNNING,
                WaitInstanceRunningInput(
                    bmi_id=created.instance.id, deadline=self._deadline(self._policy().bmi_running_timeout)
                ),
                InstanceRunning,
                summary=f"Wait until BMI {slot.name} is running",
                wait=True,
            )
            progress.macs = list(running.macs)
            self._stop_if_scaled_down()
            self._set_phase(WorkerPhase.WAITING_FOR_AGENT)

        if progress.status.phase == WorkerPhase.WAITING_FOR_AGENT:
            waiting_since = workflow.now()
            match = await (self._wait_and_hand() if self._hands_in_wait else self._await_agent())
            if self._scale_down and progress.agent_handed:
                progress.agent_name = match.name  # the teardown must take it back from the NodePool
            self._stop_if_scaled_down()
            if match.unmatched_macs:
                # Extra interfaces (a BMC's USB NIC) are normal; another BMI's NIC means the Agent is
                # not unambiguously this host (osac-reference §4), so it is never bound.
                others = await self._bmaas(
                    BmaasActivity.FIND_INSTANCES_WITH_MACS,
                    FindInstancesWithMacsInput(macs=match.unmatched_macs, exclude_bmi_id=progress.bmi_id),
                    InstancesWithMacs,
                    summary=f"Check that agent {match.name} reports no other host's NIC",
                )
                if self._scale_down and workflow.patched(WorkerPatch.STOP_AFTER_NIC_CHECK.value):
                    self._stop_if_scaled_down()
                if others.bmi_ids:
                    raise AttemptFailed(
                        FailureReason.AMBIGUOUS_AGENT_MATCH,
                        f"Agent {match.namespace}/{match.name} also reports a NIC of BMI(s) "
                        + ", ".join(others.bmi_ids),
                    )
            progress.agent_name = match.name
            record_correlation_duration(slot.order, workflow.now() - waiting_since)
            self._set_phase(WorkerPhase.BINDING)

        if progress.status.phase == WorkerPhase.BINDING:
            agent = self._agent_ref()
            if not progress.agent_handed:
                await self._hub(
                    HubActivity.HAND_AGENT_TO_NODEPOOL,
                    HandAgentInput(
                        agent=agent,
                        nodepool=self._nodepool_ref(),
                        worker=slot.name,
                        hostname=slot.name,
                        macs=progress.macs,
                    ),
                    None,
                    summary=f"Approve agent {agent.name}, label it for {slot.nodepool_name}, sync replicas",
                )
                progress.agent_handed = True
                self._stop_if_scaled_down()
            ready = self._next_report(phase=WorkerPhase.READY)
            await self._hub(
                HubActivity.WAIT_AGENT_INSTALLED,
                WaitAgentInstalledInput(
                    agent=agent,
                    deadline=self._deadline(self._policy().agent_install_timeout),
                    nodepool=self._nodepool_ref(),
                    timeout=self._policy().agent_install_timeout,
                    bmi_id=progress.bmi_id,
                ),
                None,
                summary=f"Wait until {slot.name} is claimed, installed and joined",
                wait=True,
                report_on_success=ready,
            )
            progress.ready_since = workflow.now()
            if progress.provisioning_since is not None:
                record_provisioning_duration(slot.order, workflow.now() - progress.provisioning_since)
                progress.provisioning_since = None
            self._set_phase(WorkerPhase.READY, delivered=ready)

    def _stop_if_scaled_down(self) -> None:
        """A scale-down cancels the step in flight, but a step that finishes anyway (a call, which
        does not heartbeat; a wait done before its next heartbeat) uses the cancel up: stop before
        the next step instead of provisioning on (the parent tells a worker to leave once)."""
        if self._scale_down and workflow.patched(WorkerPatch.STOP_BETWEEN_STEPS.value):
            raise asyncio.CancelledError()

    async def _wait_and_hand(self) -> AgentMatch:
        """WorkerRevision.AGENT_HANDED_IN_WAIT: one heartbeating activity waits (until the policy's
        registration deadline) for the host's Agent and hands it to the NodePool at once, unless it
        reports a NIC of no known host's (then the workflow checks with BMaaS and hands it itself)."""
        progress, slot = self._state()
        outcome = await self._hub(
            HubActivity.WAIT_AGENT_AND_HAND,
            WaitAndHandAgentInput(
                **self._agent_wait_terms(),
                nodepool=self._nodepool_ref(),
                worker=slot.name,
                hostname=slot.name,
                bmi_id=progress.bmi_id,
            ),
            AgentHandOff,
            summary=f"Wait for the agent of {slot.name}, approve it and hand it to {slot.nodepool_name}",
            wait=True,
        )
        progress.agent_handed = outcome.handed is not None
        return outcome.match

    def _agent_wait_terms(self) -> dict[str, Any]:
        """What every Agent wait of this attempt looks for, and until when: the registration
        deadline is set when the attempt first waits (and cleared with its BMI)."""
        progress, slot = self._state()
        assert progress.bmi_id is not None
        if progress.agent_deadline is None:
            progress.agent_deadline = workflow.now() + self._policy().agent_registration_timeout
        return {
            "infraenv": InfraEnvRef.for_order(slot.order),
            "order": slot.order,
            "macs": progress.macs,
            "deadline": progress.agent_deadline,
        }

    async def _await_agent(self) -> AgentMatch:
        """WorkerRevision.ACTIVITY_REPORTS and earlier: wait for the host's Agent on a durable timer
        (the policy's registration deadline), told early by the watch that watch_agent_for_macs
        leaves running, and renewing that watch every `agent_watch_renewal` in case its process went
        away. Nothing is in flight meanwhile."""
        progress, slot = self._state()
        policy = self._policy()
        terms = self._agent_wait_terms()
        deadline = progress.agent_deadline
        assert deadline is not None and progress.bmi_id is not None
        self._agent_registered = None
        while True:
            watch = await self._hub(
                HubActivity.WATCH_AGENT_FOR_MACS,
                WatchAgentInput(
                    **terms,
                    worker_workflow_id=workflow.info().workflow_id,
                    bmi_id=progress.bmi_id,
                ),
                AgentWatch,
                summary=f"Look for the discovery agent of {slot.name}, watch until it registers",
                local=self._reports_by_activities,
            )
            if watch.match is not None:
                return watch.match
            remaining = deadline - workflow.now()
            # Decided before the timer starts, so replay takes the same branch whatever the clock.
            final = remaining <= policy.agent_watch_renewal
            try:
                await self._wait(
                    lambda: self._agent_registered is not None,
                    timeout=max(min(remaining, policy.agent_watch_renewal), MIN_TIMER),
                    timeout_summary=(
                        f"Registration deadline of {slot.name}"
                        if final
                        else f"Renew the agent watch of {slot.name}"
                    ),
                )
            except TimeoutError:
                if final:
                    raise AttemptFailed(
                        FailureReason.AGENT_REGISTRATION_TIMEOUT,
                        f"no Agent registered in InfraEnv {slot.order.namespace} for the host of"
                        f" {slot.name} (BMI {progress.bmi_id}) by {deadline.isoformat()}",
                    ) from None
                continue
            report = self._agent_registered
            assert report is not None
            if report.failure_reason is not None:
                raise AttemptFailed(report.failure_reason, report.failure_message or "")
            assert report.match is not None
            return report.match

    async def _fail(self, failure: AttemptFailed) -> None:
        progress, _ = self._state()
        now = workflow.now()
        # The backoff starts over only after a Ready that lasted: a worker that fails soon after each
        # Ready keeps backing off longer. Its Ready ended here, so it counts once.
        if progress.ready_since and now - progress.ready_since >= self._policy().attempt_reset_after_ready:
            progress.failures_in_a_row = 0
        progress.ready_since = None
        progress.failures_in_a_row += 1
        failed = progress.releasing_failed_attempt = self._record_failure(failure)
        workflow.logger.warning("worker attempt failed: %s", failure)
        workflow.set_current_details(f"Attempt {progress.status.attempt_count} failed: {failure}")
        self._set_phase(WorkerPhase.FAILED)
        await self._release_failed_attempt(failed)

    async def _release_failed_attempt(self, failed: FailedAttempt) -> None:
        progress, _ = self._state()
        await self._release_until_done()
        progress.releasing_failed_attempt = None
        # A slow wipe or unbind showed its own reason meanwhile; once released, the attempt's is
        # what the tenant must see until the next attempt.
        self._show_failure(failed)
        backoff = self._policy().backoff(failed.reason, progress.failures_in_a_row)
        progress.status.next_retry_time = workflow.now() + backoff
        await self._report_change()

    async def _wait_backoff(self) -> None:
        progress, _ = self._state()
        retry_at = progress.status.next_retry_time or workflow.now()
        remaining = (retry_at - workflow.now()).total_seconds()
        if remaining > 0:
            try:
                await self._wait(lambda: self._scale_down, timeout=remaining)
            except TimeoutError:
                pass

    # ------------------------------------------------------------------------------ teardown

    async def _teardown(self) -> None:
        """Scale-down from any phase: nothing may be left behind."""
        progress, _ = self._state()
        self._tearing_down = True
        self._set_phase(WorkerPhase.UNBINDING if progress.agent_name else WorkerPhase.DELETING)
        await self._release_until_done()

    async def _release_until_done(self) -> None:
        """Release never gives up: a hard error is shown in the status and the release tried again."""
        progress, _ = self._state()
        failures = 0
        while True:
            try:
                await self._release_resources()
                return
            except AttemptFailed as failure:
                failures += 1
                workflow.logger.warning("releasing the worker failed, will retry: %s", failure)
                workflow.set_current_details(f"Release failed, retrying: {failure}")
                if progress.status.phase != WorkerPhase.FAILED:
                    self._record_failure(failure)
                    await self._report_change()
                await workflow.sleep(self._policy().backoff(FailureReason.INTERNAL_ERROR, failures))
                await self._continue_release_as_new_if_due()

    async def _release_resources(self) -> None:
        """Give back the Agent and the BMI and block until BMaaS confirms the host is wiped; a host
        that may have run the discovery image then has its late registrations swept."""
        progress, slot = self._state()
        listed: list[WorkerInstance] | None = None
        if progress.restarted:
            # The stopped run's calls may still be running (a create finishing, a wait handing the
            # Agent over) until their timeouts: look for what they left only after those.
            policy = self._policy()
            await workflow.sleep(max(policy.call_timeout, policy.wait_heartbeat_timeout))
            if workflow.patched(WorkerPatch.RESTARTED_RELEASE_FINDS_REGISTRATIONS.value):
                # The stopped run's last report holds no MACs; the slot's BMIs have them.
                listed = await self._instances_of_slot()
                progress.macs = sorted({*progress.macs, *(mac for bmi in listed for mac in bmi.macs)})
        elif (
            progress.create_unsettled
            and progress.bmi_id is None
            and workflow.patched(WorkerPatch.CREATE_SETTLED_BEFORE_RELEASE.value)
        ):
            # An unanswered create's POST ended a margin before its attempt's end (contracts.bmaas
            # create_margin); a margin after, a BMI it made is listed.
            await workflow.sleep(create_margin(self._policy().call_timeout))
        progress.create_unsettled = False
        agent = self._agent_ref() if progress.agent_name is not None else None
        if agent is not None and progress.status.phase != WorkerPhase.FAILED:
            self._set_phase(WorkerPhase.UNBINDING)
        if agent is not None and progress.agent_handed:
            await self._unbind(agent)  # deletes the Agent and stale registrations once unbound
            progress.agent_name = None
            progress.agent_handed = False
        elif agent is not None or progress.macs or progress.restarted:
            released = await self._hub(
                HubActivity.RELEASE_AGENT,
                ReleaseAgentInput(
                    agent=agent,
                    infraenv=InfraEnvRef.for_order(slot.order),
                    order=slot.order,
                    macs=progress.macs,
                    worker=slot.name,
                    find_handed=progress.restarted,
                ),
                ReleasedAgents,
                summary=f"Delete the agent registrations of the host of {slot.name}",
            )
            progress.agent_name = None
            progress.agent_handed = False
            for name in released.handed:
                # Handed by a wait that was cancelled before it could say so: unbound like any other.
                if progress.status.phase != WorkerPhase.FAILED:
                    self._set_phase(WorkerPhase.UNBINDING)
                await self._unbind(AgentRef(namespace=slot.order.namespace, name=name))
        if progress.status.phase != WorkerPhase.FAILED:
            self._set_phase(WorkerPhase.DELETING)
        bmi_ids = await self._bmis_of_slot(listed)
        for bmi_id in bmi_ids:
            await self._wait_gone(bmi_id, last_of_slot=self._tearing_down and bmi_id == bmi_ids[-1])
        if (
            # Not Ready: the host may run the discovery image (an install interrupted, failed or not
            # begun); a Ready one boots its disk.
            progress.ready_since is None
            and bmi_ids
            and progress.macs
            and workflow.patched(WorkerPatch.REGISTRATIONS_SWEPT_AFTER_WIPE.value)
        ):
            await self._sweep_registrations_after_wipe()
        progress.bmi_id = None
        progress.macs = []
        progress.agent_deadline = None
        progress.status.resource_id = None
        progress.restarted = False  # whatever the stopped run held is released now

    async def _wait_gone(self, bmi_id: str, last_of_slot: bool) -> None:
        """Block until BMaaS confirms the host is wiped and released. A wipe that takes too long is
        made visible (reason HostWipeStuck, phase unchanged) but is never taken for done. The last
        wipe of a teardown tells the cluster workflow the worker is gone."""
        _progress, slot = self._state()
        stuck_after = self._policy().wipe_stuck_after
        deleted = self._next_report(deleted=True, resource_id=None) if last_of_slot else None
        gone = asyncio.ensure_future(
            self._bmaas(
                BmaasActivity.WAIT_INSTANCE_GONE,
                WaitInstanceGoneInput(
                    bmi_id=bmi_id, stuck_after_seconds=stuck_after.total_seconds(), delete_first=True
                ),
                InstanceGone,
                summary=f"Delete BMI {slot.name} ({bmi_id}) and wait until its host is wiped and released",
                wait=True,
                report_on_success=deleted,
            )
        )
        try:
            await self._wait(gone.done, timeout=stuck_after)
        except TimeoutError:
            self._record_failure(AttemptFailed(FailureReason.HOST_WIPE_STUCK, f"BMI {bmi_id} still deleting"))
            workflow.set_current_details(f"Wipe of BMI {bmi_id} is taking longer than {stuck_after}")
            await self._report_change()
        except asyncio.CancelledError:
            gone.cancel()
            raise
        await gone
        self._deleted_delivered = deleted

    def _record_failure(self, failure: AttemptFailed) -> FailedAttempt:
        shown = FailedAttempt(
            reason=failure.reason, message=TENANT_MESSAGES[failure.reason], time=workflow.now()
        )
        self._show_failure(shown)
        return shown

    def _show_failure(self, shown: FailedAttempt) -> None:
        progress, _ = self._state()
        progress.status.last_failure_reason = shown.reason
        progress.status.last_failure_message = shown.message
        progress.status.last_failure_time = shown.time

    async def _sweep_registrations_after_wipe(self) -> None:
        """Delete what the host registered between its Agent's release and its power-off, while no
        BMI of the order holds the host (one given it since may have had it register for itself).
        Best effort: the decommission's sweep of the InfraEnv is the backstop."""
        progress, slot = self._state()
        try:
            listed = await self._bmaas(
                BmaasActivity.LIST_ORDER_INSTANCES,
                # Best effort: a BMaaS refusing it must not hold the end of the release.
                ListOrderInstancesInput(order=slot.order, macs=progress.macs, give_up_on_refusal=True),
                OrderInstances,
                summary=f"Check that no BMI of the order holds the wiped host of {slot.name}",
            )
            cutoff = registrations_cutoff(listed, progress.macs)
            if cutoff is None:
                workflow.logger.info(
                    "the wiped host of %s is held again, or the BMaaS worker is too old to tell: "
                    "its registrations are left for the decommission's sweep",
                    slot.name,
                )
                return
            swept = await self._hub(
                HubActivity.RELEASE_WIPED_HOST_AGENTS,
                ReleaseWipedHostAgentsInput(
                    infraenv=InfraEnvRef.for_order(slot.order),
                    order=slot.order,
                    macs=progress.macs,
                    worker=slot.name,
                    listed_at=cutoff,
                ),
                ReleasedAgents,
                summary=f"Delete the agent registrations the host of {slot.name} made before its wipe",
            )
        except AttemptFailed as failure:
            workflow.logger.warning(
                "the registrations of the wiped host of %s are left for the decommission's sweep: %s",
                slot.name,
                failure,
            )
            return
        if swept.handed or swept.kept:
            # Approved or handed after the release looked: not this sweep's to judge, so said.
            workflow.logger.warning(
                "after the wipe, Agents of the host of %s were left: handed %s, kept %s",
                slot.name,
                swept.handed,
                swept.kept,
            )

    async def _unbind(self, agent: AgentRef) -> None:
        progress, slot = self._state()
        while True:
            try:
                await self._hub(
                    HubActivity.UNBIND_AGENT,
                    UnbindAgentInput(
                        agent=agent,
                        nodepool=self._nodepool_ref(),
                        deadline=self._deadline(self._policy().agent_unbinding_timeout),
                        infraenv=InfraEnvRef.for_order(slot.order),
                        order=slot.order,
                        macs=progress.macs,
                        worker=slot.name,
                    ),
                    ReleasedAgents,
                    summary=f"Remove the Machine of {slot.name}, lower replicas, wait until unbound",
                    wait=True,
                )
                return
            except AttemptFailed as failure:
                if failure.reason != FailureReason.AGENT_UNBINDING_TIMEOUT:
                    raise
                # Stay in Unbinding with the reason visible, and keep waiting.
                self._record_failure(failure)
                await self._report_change()
                await self._continue_release_as_new_if_due()

    async def _continue_release_as_new_if_due(self) -> None:
        """A release's next run starts it again from the carried progress (the scale-down, or the
        failed attempt, is in it): each step is idempotent."""
        if not workflow.info().is_continue_as_new_suggested():
            return
        if self._tearing_down:
            if workflow.patched(WorkerPatch.TEARDOWN_CONTINUES_AS_NEW.value):
                await self._continue_as_new()
        elif self._state()[0].releasing_failed_attempt is not None and workflow.patched(
            WorkerPatch.FAILED_RELEASE_CONTINUES_AS_NEW.value
        ):
            await self._continue_as_new()

    async def _bmis_of_slot(self, listed: list[WorkerInstance] | None = None) -> list[str]:
        """The BMIs to release: the known one, or any a cancelled create may have left behind
        (`listed`: the slot's BMIs as this release already listed them)."""
        progress, _slot = self._state()
        if progress.bmi_id is not None and not progress.restarted:
            return [progress.bmi_id]
        if listed is None:
            listed = await self._instances_of_slot()
        known = [progress.bmi_id] if progress.bmi_id is not None else []
        return sorted({*known, *(bmi.id for bmi in listed)})

    async def _instances_of_slot(self) -> list[WorkerInstance]:
        """The order's BMIs named after this slot, in any state."""
        progress, slot = self._state()
        found = await self._bmaas(
            BmaasActivity.LIST_ORDER_INSTANCES,
            ListOrderInstancesInput(order=slot.order, name=slot.name),
            OrderInstances,
            summary=(
                f"Look for the BMIs of {slot.name} and their hosts' MACs"
                if progress.restarted
                else f"Look for a BMI of {slot.name} left by an interrupted create"
            ),
        )
        # Filtered here too: an activity worker older than the `name` filter returns every BMI.
        return [bmi for bmi in found.instances if bmi.name == slot.name]

    # ------------------------------------------------------------------------------- helpers

    def _state(self) -> tuple[WorkerProgress, Any]:
        assert self._progress is not None and self._input is not None
        return self._progress, self._input.slot

    def _policy(self) -> TimingPolicy:
        assert self._input is not None
        return self._input.policy

    def _agent_ref(self) -> AgentRef:
        progress, slot = self._state()
        assert progress.agent_name is not None
        return AgentRef(namespace=slot.order.namespace, name=progress.agent_name)

    def _nodepool_ref(self) -> NodePoolRef:
        _, slot = self._state()
        return NodePoolRef(
            namespace=slot.cluster_namespace, name=slot.nodepool_name, agent_namespace=slot.order.namespace
        )

    def _set_phase(self, phase: WorkerPhase, delivered: WorkerReport | None = None) -> None:
        progress, _ = self._state()
        if progress.status.phase == phase:
            return
        progress.status.phase = phase
        self._publish_phase(phase)
        workflow.set_current_details(f"{phase.value} (attempt {progress.status.attempt_count})")
        self._note_change(delivered=delivered)

    def _note_change(self, delivered: WorkerReport | None = None) -> None:
        """A change to report, sent with the next report (`delivered`: already sent by an activity)."""
        if self._reports_by_activities:
            self._status_changed(delivered=delivered)
        else:
            # Not awaited: the parent coalesces reports, and signals from one sender keep their order.
            self._pending_reports.append(asyncio.ensure_future(self._report()))

    def _publish_phase(self, phase: WorkerPhase) -> None:
        """One upsert per phase change, carrying the attempt and (once known) the BMI with it."""
        progress, _ = self._state()
        updates: list[SearchAttributeUpdate[Any]] = [
            OSAC_WORKER_PHASE.value_set(phase.value),
            OSAC_ATTEMPT.value_set(progress.status.attempt_count),
        ]
        if progress.bmi_id is not None:
            updates.append(OSAC_BARE_METAL_INSTANCE.value_set(progress.bmi_id))
        workflow.upsert_search_attributes(updates)

    # --------------------------------------------------------------------------- reporting
    # A status change is numbered and handed to the next activity that carries reports (its first
    # step delivers it to the cluster workflow), which keeps five events per report out of this
    # history. Where no activity follows (waiting Ready, a failure's backoff, the end) it is signalled.

    def _next_report(self, deleted: bool = False, **status: Any) -> WorkerReport:
        """The report the next status change will make, with `status` fields changed."""
        progress, _ = self._state()
        return WorkerReport(
            status=progress.status.model_copy(update=status, deep=True),
            deleted=deleted,
            sequence=progress.report_sequence + 1,
            bmaas_failing=progress.bmaas_failing,
            order_uid=self._order_uid(),
        )

    def _status_changed(self, deleted: bool = False, delivered: WorkerReport | None = None) -> None:
        """Number the current status; `delivered`: an activity delivered this very report already."""
        progress, _ = self._state()
        if self._unsent is not None:
            # No activity took it (cancelled, or none came): send it still, for its Event.
            self._pending_reports.append(asyncio.ensure_future(self._send_report(self._unsent)))
        report = self._next_report(deleted=deleted)
        progress.report_sequence = report.sequence
        self._unsent = None if report == delivered else report

    async def _report_change(self, deleted: bool = False) -> None:
        """Report the current status now and wait until it is sent."""
        if not self._reports_by_activities:
            await self._report(deleted=deleted)
            return
        self._status_changed(deleted=deleted, delivered=self._deleted_delivered if deleted else None)
        await self._flush_reports()

    async def _flush_reports(self) -> None:
        if self._unsent is not None:
            report, self._unsent = self._unsent, None
            self._pending_reports.append(asyncio.ensure_future(self._send_report(report)))
        # Taken first: a report that failed is not waited for again by the next flush.
        pending, self._pending_reports = self._pending_reports, []
        await asyncio.gather(*pending)

    def _skip_report_maybe_delivered(self, delivery: ReportDelivery | None) -> None:
        """An activity cancelled or failed after delivering its `on_success` report (a cancel that
        reached it only then) may have delivered it: the next report must not reuse its number, or
        the cluster workflow drops it as a copy and keeps showing that report (Ready during an unbind)."""
        if delivery is not None and delivery.on_success is not None:
            progress, _ = self._state()
            progress.report_sequence = max(progress.report_sequence, delivery.on_success.sequence)

    def _report_delivery(self, arg: Any, on_success: WorkerReport | None) -> ReportDelivery | None:
        assert self._input is not None
        parent = self._input.parent_workflow_id
        if not self._reports_by_activities or not isinstance(arg, CarriesReport) or parent is None:
            return None
        if self._unsent is None and on_success is None:
            return None
        return ReportDelivery(parent_workflow_id=parent, on_start=self._unsent, on_success=on_success)

    async def _report(self, deleted: bool = False) -> None:
        """WorkerRevision.SIGNALLED_REPORTS: every report a signal of its own, unnumbered."""
        assert self._progress is not None
        await self._send_report(
            WorkerReport(
                status=self._progress.status.model_copy(deep=True),
                deleted=deleted,
                bmaas_failing=self._progress.bmaas_failing,
                order_uid=self._order_uid(),
            )
        )

    def _order_uid(self) -> str | None:
        assert self._input is not None
        return self._input.order_uid

    async def _send_report(self, report: WorkerReport) -> None:
        assert self._input is not None
        if self._input.parent_workflow_id is None:
            return
        parent = workflow.get_external_workflow_handle(self._input.parent_workflow_id)
        try:
            await parent.signal("worker_report", report)
        except ApplicationError as err:
            # A parent that is gone cannot be told; the worker's own status query still answers.
            workflow.logger.warning("could not report to the cluster workflow: %s", err)

    async def _continue_as_new(self) -> None:
        await self._flush_reports()
        await self._wait(workflow.all_handlers_finished)
        assert self._input is not None and self._progress is not None
        workflow.continue_as_new(self._input.model_copy(update={"progress": self._progress}))

    async def _bmaas(
        self, name: BmaasActivity, arg: Any, result_type: type[T] | None, *, summary: str, **options: Any
    ) -> T:
        assert self._input is not None
        return await self._call(
            name.value, arg, result_type, summary=summary, task_queue=self._input.bmaas_task_queue, **options
        )

    async def _hub(
        self, name: HubActivity, arg: Any, result_type: type[T] | None, *, summary: str, **options: Any
    ) -> T:
        return await self._call(name.value, arg, result_type, summary=summary, task_queue=None, **options)

    def _deadline(self, limit: timedelta) -> datetime:
        """An absolute deadline for a wait activity: durable in its input, so a retried or
        restarted wait keeps the policy's limit, and no workflow timer adds to the history."""
        return workflow.now() + limit

    async def _call(
        self,
        name: str,
        arg: Any,
        result_type: type[T] | None,
        *,
        summary: str,
        task_queue: str | None,
        wait: bool = False,
        report_on_success: WorkerReport | None = None,
        local: bool = False,
    ) -> T:
        """Call an activity, retried until it answers. A BMaaS call is given the attempts that fit in
        the policy's `bmaas_failing_shown_after`, then made again: an outage is reported meanwhile."""
        assert self._input is not None
        shows_failing = task_queue == self._input.bmaas_task_queue and not wait and not local
        # A report built before a round that runs out would carry a number the order has passed.
        assert not (shows_failing and report_on_success), "a BMaaS call that may run out reports nothing"

        async def call_round(attempts: int = 0, failing: bool = False) -> T:
            """One call with its retries. Raises AttemptFailed, CancelledError, or the ActivityError
            of a call that ran out of its `attempts` on an error that is retried."""
            delivery = self._report_delivery(arg, report_on_success)
            sent = arg.model_copy(update={"report": delivery}) if delivery is not None else arg
            try:
                result: T = await call_activity(
                    name,
                    sent,
                    result_type,
                    policy=self._policy(),
                    summary=summary,
                    wait=wait,
                    task_queue=task_queue,
                    local=local,
                    attempts=attempts,
                    failing=failing,
                )
            except ActivityError as err:
                self._skip_report_maybe_delivered(delivery)
                if isinstance(err.cause, CancelledError):
                    # Cancelled by us (scale-down or a lost race): stay a cancellation, not a failure.
                    raise asyncio.CancelledError() from err
                if attempts and ran_out_of_attempts(err):
                    raise
                raise _failure_of(err) from err
            except ApplicationError as err:
                if not local:
                    raise
                raise _failure_of(err) from err
            if delivery is not None and delivery.on_start is not None and self._unsent is delivery.on_start:
                self._unsent = None
            return result

        if not shows_failing:
            return await call_round()
        return await bmaas_call_through_outages(
            call_round, policy=self._policy(), name=name, on_failing=self._show_bmaas_failing
        )

    def _show_bmaas_failing(self, failing: FailingRequests | None) -> None:
        """Tell the order that BMaaS keeps failing this worker's call (once per outage), or no longer
        does: sent at once, never waited for (the step's wait could be cancelled by a scale-down)."""
        progress, _ = self._state()
        if (progress.bmaas_failing is None) == (failing is None):
            return
        progress.bmaas_failing = failing
        self._note_change()
        if self._unsent is not None:
            report, self._unsent = self._unsent, None
            self._pending_reports.append(asyncio.ensure_future(self._send_report(report)))
