"""The activities registered on a real Temporal worker (dev server, pydantic data converter): names,
payloads, heartbeats and the error taxonomy as a workflow sees them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from contracts.activities import HubActivity
from contracts.hub import AgentRef, HubErrorType, InfraEnvRef, WaitAgentInput
from contracts.refs import OrderRef


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
