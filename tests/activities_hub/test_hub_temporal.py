"""The activities registered on a real Temporal worker (dev server, pydantic data converter): names,
payloads, heartbeats and the error taxonomy as a workflow sees them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from contracts.activities import HubActivity
from contracts.hub import (
    AgentMatch,
    AgentRef,
    AgentWatch,
    HubErrorType,
    InfraEnvRef,
    WaitAgentInput,
    WatchAgentInput,
)
from contracts.refs import OrderRef
from contracts.worker import FailureReason
from contracts.workflows import AgentRegistered
from tests.workflows.stack import eventually


@workflow.defn(sandboxed=False)
class CorrelateOnce:
    @workflow.run
    async def run(self, request: WaitAgentInput) -> AgentRef:
        return await workflow.execute_activity(
            HubActivity.WAIT_AGENT_FOR_MACS.value,
            request,
            result_type=AgentRef,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=3),
            retry_policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(milliseconds=100)),
        )


async def test_correlation_through_a_temporal_worker(temporal_env, api, api_assisted, api_hub_acts, kit):
    client = temporal_env.client
    queue = f"hub-activities-{uuid.uuid4().hex[:8]}"
    order = OrderRef(namespace=api.ns, name="order-1")
    good, shared = kit.random_macs(2), kit.random_macs(1)
    api.agent("host-a", good)
    api.agent("twin-1", shared)
    api.agent("twin-2", shared)

    def request(macs: list[str]) -> WaitAgentInput:
        return WaitAgentInput(
            infraenv=InfraEnvRef.for_order(order),
            order=order,
            macs=macs,
            deadline=datetime.now(UTC) + timedelta(seconds=30),
        )

    async with Worker(
        client,
        task_queue=queue,
        workflows=[CorrelateOnce],
        activities=api_assisted.all() + api_hub_acts.all(),
    ):
        agent = await client.execute_workflow(
            CorrelateOnce.run, request(good), id=f"correlate-{uuid.uuid4()}", task_queue=queue
        )
        assert agent == AgentRef(namespace=api.ns, name="host-a")

        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                CorrelateOnce.run, request(shared), id=f"correlate-{uuid.uuid4()}", task_queue=queue
            )
    activity_error = failed.value.cause
    assert isinstance(activity_error, ActivityError)
    cause = activity_error.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == HubErrorType.AMBIGUOUS_AGENT_MATCH and cause.non_retryable
    assert cause.details[0]["agents"] == ["twin-1", "twin-2"]


@workflow.defn(sandboxed=False)
class WatchOnce:
    """Asks for a watch, then waits for its signal, as WorkerNodeWorkflow does."""

    def __init__(self) -> None:
        self.report: AgentRegistered | None = None

    @workflow.signal
    def agent_registered(self, report: AgentRegistered) -> None:
        self.report = report

    @workflow.run
    async def run(self, request: WatchAgentInput) -> AgentRegistered:
        watch = await workflow.execute_activity(
            HubActivity.WATCH_AGENT_FOR_MACS.value,
            request,
            result_type=AgentWatch,
            start_to_close_timeout=timedelta(seconds=60),
        )
        if watch.match is not None:
            return AgentRegistered(bmi_id=request.bmi_id, match=watch.match)
        await workflow.wait_condition(lambda: self.report is not None)
        assert self.report is not None
        return self.report


async def test_a_watch_signals_the_worker_once_its_agent_registers(
    temporal_env, api, api_assisted, api_hub_acts, kit
):
    client = temporal_env.client
    queue = f"hub-activities-{uuid.uuid4().hex[:8]}"
    order = OrderRef(namespace=api.ns, name="order-1")
    early, late, shared = kit.random_macs(1), kit.random_macs(1), kit.random_macs(1)
    api.agent("early", early)

    def request(macs: list[str], workflow_id: str) -> WatchAgentInput:
        return WatchAgentInput(
            infraenv=InfraEnvRef.for_order(order),
            order=order,
            macs=macs,
            deadline=datetime.now(UTC) + timedelta(seconds=60),
            worker_workflow_id=workflow_id,
            bmi_id=f"bmi-{workflow_id}",
        )

    async def started(macs: list[str]) -> Any:
        workflow_id = f"watch-{uuid.uuid4()}"
        return await client.start_workflow(
            WatchOnce.run, request(macs, workflow_id), id=workflow_id, task_queue=queue
        )

    async with Worker(
        client, task_queue=queue, workflows=[WatchOnce], activities=api_assisted.all() + api_hub_acts.all()
    ):
        # Registered already: the answer comes back at once, no watch and no signal.
        first = await (await started(early)).result()
        assert first.match == AgentMatch(namespace=api.ns, name="early")

        # Not yet: the activity returns, the watch signals once the Agent registers.
        waiting = await started(late)
        ambiguous = await started(shared)

        async def watching() -> bool:
            history = [e async for e in waiting.fetch_history_events()]
            history += [e async for e in ambiguous.fetch_history_events()]
            completed = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            return sum(1 for e in history if e.event_type == completed) == 2

        await eventually(watching, "both watch activities returned")
        api.agent("late", late)
        api.agent("twin-1", shared)
        api.agent("twin-2", shared)
        second = await waiting.result()
        assert second.match == AgentMatch(namespace=api.ns, name="late")
        assert second.bmi_id == f"bmi-{waiting.id}"
        # Two Agents claiming the host: the worker is told, so it fails the attempt unbound.
        third = await ambiguous.result()
        assert third.match is None and third.failure_reason == FailureReason.AMBIGUOUS_AGENT_MATCH
