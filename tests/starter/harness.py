"""The starter under test: the whole product (tests.workflows.stack) plus ClusterOrder controllers.

Controllers run on the test's event loop against the stack's hub twin (over HTTP, through their own
HubKube) and the session's Temporal dev server, with the stack's task queues. Orders are created
on the hub the way a tenant's arrive. Every wait polls a condition up to a generous deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.service import RPCError

from activities.bmaas.client import BmaasClient
from activities.kube import HubKube
from contracts.hub import MANAGEMENT_STATE_ANNOTATION
from contracts.refs import OrderRef
from contracts.workflows import (
    CONFIRM_SCALE_DOWN_ANNOTATION,
    ClusterWorkersStatus,
    cluster_workflow_id,
    worker_workflow_id,
)
from starter.api import OrderNotFound, WorkersApi, WorkflowState
from starter.controller import ClusterOrderController
from starter.validation import InstanceTypeCatalog
from tests.workflows.stack import CLUSTER_ORDERS, PULL_SECRET, RELEASE_IMAGE, Stack, eventually
from workflows.worker_node import WorkerNodeWorkflow

ORDER_PATH = CLUSTER_ORDERS + "/namespaces/{namespace}/clusterorders"
FINALIZER = "osac.openshift.io/baremetal-workers"
OSAC_FINALIZER = "osac.openshift.io/clusterorder"  # OSAC's own, which holds a deleting order meanwhile
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHr0ks3jOM2Yz0gK1cM9Yc9l7Wq9d4m2b0F5tJd4Vx0e t@x"


@dataclass
class RunningController:
    controller: ClusterOrderController
    kube: HubKube
    bmaas: BmaasClient
    task: asyncio.Task[None]
    stop_event: asyncio.Event

    async def stop(self) -> None:
        self.stop_event.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 30)
        await self.bmaas.aclose()
        await self.kube.close()


async def start_controller(
    stack: Stack, *, resync_seconds: float = 300.0, api: WorkersApi | None = None, **options: Any
) -> RunningController:
    """`api`: what the controller drives (the stack's library API by default); `options`: more of
    the controller's keyword arguments."""
    kube = HubKube.from_kubeconfig(str(stack.lab.hub.kubeconfig))
    bmaas = BmaasClient(stack.settings.fulfillment_url, stack.settings.fulfillment_token_file)
    controller = ClusterOrderController(
        kube,
        api or stack.api,
        InstanceTypeCatalog(bmaas),
        resync_seconds=resync_seconds,
        error_backoff=(0.2, 2.0),
        decommission_poll_seconds=5.0,
        **options,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    running = RunningController(controller, kube, bmaas, task, stop)
    await eventually(_synced(running), "the controller's informer to sync", timeout=60)
    return running


def _synced(running: RunningController) -> Any:
    async def probe() -> bool:
        if running.task.done():
            running.task.result()  # surface a crash instead of waiting out the deadline
        return running.controller.synced

    return probe


@contextlib.asynccontextmanager
async def controller(stack: Stack, **kwargs: Any) -> AsyncIterator[RunningController]:
    running = await start_controller(stack, **kwargs)
    try:
        yield running
    finally:
        await running.stop()


# ------------------------------------------------------------------------------------- orders


def order_body(
    ref: OrderRef,
    node_requests: list[dict[str, Any]],
    *,
    annotations: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": ref.name, "namespace": ref.namespace}
    if annotations:
        metadata["annotations"] = annotations
    if finalizers:
        metadata["finalizers"] = finalizers
    return {
        "apiVersion": "osac.openshift.io/v1alpha1",
        "kind": "ClusterOrder",
        "metadata": metadata,
        "spec": {
            "templateID": "ocp_4_18_small",
            "releaseImage": RELEASE_IMAGE,
            "pullSecret": PULL_SECRET,
            "sshPublicKey": SSH_KEY,
            "nodeRequests": node_requests,
        },
    }


def bare_metal(**counts: int) -> list[dict[str, Any]]:
    """`bare_metal(bm_standard=2)` -> nodeRequests entries (underscores become dashes)."""
    return [
        {"numberOfNodes": count, "bareMetal": {"instanceType": kind.replace("_", "-")}}
        for kind, count in counts.items()
    ]


async def new_namespace(stack: Stack) -> str:
    namespace = f"s-{uuid.uuid4().hex[:8]}"
    response = await stack.hub_http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
    response.raise_for_status()
    return namespace


def order_name() -> str:
    """A fresh order name: a test that must tell its order from the others a controller watches
    (every earlier test's orders too) picks it before the order exists."""
    return f"o{uuid.uuid4().hex[:8]}"


async def create_order(
    stack: Stack,
    node_requests: list[dict[str, Any]],
    *,
    namespace: str | None = None,
    annotations: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    name: str | None = None,
) -> OrderRef:
    """`name`: any name the hub takes (unchecked here: a test of a name we refuse needs one)."""
    ref = OrderRef.model_construct(
        namespace=namespace or await new_namespace(stack), name=name or order_name()
    )
    body = order_body(ref, node_requests, annotations=annotations, finalizers=finalizers)
    response = await stack.hub_http.post(ORDER_PATH.format(namespace=ref.namespace), json=body)
    response.raise_for_status()
    return ref


async def get_order(stack: Stack, ref: OrderRef) -> dict[str, Any] | None:
    response = await stack.hub_http.get(f"{ORDER_PATH.format(namespace=ref.namespace)}/{ref.name}")
    if response.status_code == 404:
        return None
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


async def patch_order(stack: Stack, ref: OrderRef, patch: dict[str, Any]) -> dict[str, Any]:
    response = await stack.hub_http.patch(
        f"{ORDER_PATH.format(namespace=ref.namespace)}/{ref.name}",
        json=patch,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


async def delete_order(stack: Stack, ref: OrderRef) -> None:
    response = await stack.hub_http.delete(f"{ORDER_PATH.format(namespace=ref.namespace)}/{ref.name}")
    response.raise_for_status()


async def remove_condition(stack: Stack, ref: OrderRef, kind: str) -> None:
    """What an operator does to a condition once they have looked (a status patch)."""
    obj = await get_order(stack, ref)
    kept = [c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("type") != kind]
    response = await stack.hub_http.patch(
        f"{ORDER_PATH.format(namespace=ref.namespace)}/{ref.name}/status",
        json={"status": {"conditions": kept}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    response.raise_for_status()


def finalizers(obj: dict[str, Any] | None) -> list[str]:
    return list(((obj or {}).get("metadata") or {}).get("finalizers") or [])


async def wait_observed(stack: Stack, running: RunningController, ref: OrderRef, timeout: float = 60) -> None:
    """Until the controller has reconciled the order as it is on the hub now (a barrier for
    asserting that it did nothing)."""

    async def probe() -> bool:
        obj = await get_order(stack, ref)
        version = str(obj["metadata"]["resourceVersion"]) if obj is not None else ""
        return running.controller.observed.get(ref.key) == version

    await eventually(probe, f"the controller to have reconciled {ref.key}", timeout)


# ----------------------------------------------------------------------------------- temporal


async def update_names(stack: Stack, ref: OrderRef) -> list[str]:
    """Names of the updates the workflow accepted, from its history (current run)."""
    handle = stack.client.get_workflow_handle(cluster_workflow_id(ref))
    names = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            names.append(
                event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            )
    return names


async def run_id(stack: Stack, ref: OrderRef) -> str:
    description = await stack.client.get_workflow_handle(cluster_workflow_id(ref)).describe()
    return description.run_id


async def workflow_state(stack: Stack, ref: OrderRef) -> WorkflowState:
    return await stack.api.workflow_state(ref)


async def terminate_cluster_workflow(stack: Stack, ref: OrderRef) -> None:
    """As an operator would; its worker workflows (parent close policy ABANDON) keep their hosts."""
    await stack.client.get_workflow_handle(cluster_workflow_id(ref)).terminate(reason="test: by hand")
    await eventually(
        lambda: _in_state(stack, ref, WorkflowState.TERMINATED), f"the workflow of {ref.key} terminated"
    )


async def runs_of(stack: Stack, ref: OrderRef) -> str:
    """Every run of the order's workflow id: how it started (who, continued from which run) and how
    it ended, for a failure message to say what started an unexpected run."""
    lines = []
    async for listed in stack.client.list_workflows(f"WorkflowId = '{cluster_workflow_id(ref)}'"):
        history = await stack.client.get_workflow_handle(listed.id, run_id=listed.run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        last = history.events[-1]
        lines.append(
            f"run {listed.run_id} {listed.status.name if listed.status else '?'} started {listed.start_time}"
            f" by {started.identity!r} (continued from {started.continued_execution_run_id or '-'},"
            f" initiator {started.initiator}); last event {EventType.Name(last.event_type)} at"
            f" {last.event_time.ToDatetime()}"
        )
    return "\n".join(lines)


async def purge_cluster_workflow(stack: Stack, ref: OrderRef) -> None:
    """The order's workflow record deleted, as retention deletes a closed run's."""
    request = DeleteWorkflowExecutionRequest(
        namespace=stack.client.namespace,
        workflow_execution=WorkflowExecution(workflow_id=cluster_workflow_id(ref)),
    )
    await stack.client.workflow_service.delete_workflow_execution(request)
    await eventually(lambda: _in_state(stack, ref, WorkflowState.ABSENT), f"the workflow of {ref.key} purged")


async def _in_state(stack: Stack, ref: OrderRef, state: WorkflowState) -> bool:
    return await workflow_state(stack, ref) == state


async def release_hosts(stack: Stack, ref: OrderRef) -> None:
    """An operator's release of the hosts that abandoned worker workflows hold: each is told to
    scale down (it unbinds its Agent, deletes its BMI, BMaaS wipes the host), until BMaaS lists no
    BMI of the order. A BMI no running workflow holds is deleted directly."""
    for bmi in await stack.bmis(ref):
        handle = stack.client.get_workflow_handle(worker_workflow_id(ref, str(bmi["metadata"]["name"])))
        try:
            await handle.signal(WorkerNodeWorkflow.scale_down)
        except RPCError:  # not running
            response = await stack.bmaas_http.delete(f"/api/private/v1/baremetal_instances/{bmi['id']}")
            if response.status_code != 404:
                response.raise_for_status()

    async def none_listed() -> bool:
        return await stack.bmis(ref) == []

    await eventually(none_listed, f"BMaaS to list no BMI of {ref.key}", timeout=120)


def cli_env(stack: Stack, temporal_address: str) -> dict[str, str]:
    """The environment a CLI process needs to reach this stack (as an operator's shell would)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OSAC_")) and k != "KUBECONFIG"
    }
    env.update(
        {
            "TEMPORAL_ADDRESS": temporal_address,
            "TEMPORAL_NAMESPACE": "default",
            "TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml",
            "KUBECONFIG": str(stack.lab.hub.kubeconfig),
            "OSAC_FULFILLMENT_URL": stack.settings.fulfillment_url,
            "OSAC_FULFILLMENT_TOKEN_FILE": str(stack.settings.fulfillment_token_file),
            "OSAC_TASK_QUEUE": stack.settings.task_queue,
            "OSAC_BMAAS_TASK_QUEUE": stack.settings.bmaas_task_queue,
        }
    )
    return env


async def wait_ready(stack: Stack, ref: OrderRef, ready: int, timeout: float = 120) -> ClusterWorkersStatus:
    """Like Stack.wait_ready, but the workflow may not exist yet (the controller starts it) and
    released workers must be gone, not only on their way out."""

    async def probe() -> ClusterWorkersStatus | None:
        try:
            status = await stack.api.status(ref)
        except OrderNotFound:
            return None
        settled = status.ready_workers == ready == status.current_workers == len(status.workers)
        return status if settled and status.desired_workers == ready else None

    return await eventually(probe, f"{ready} ready workers of {ref.key}", timeout)


UNMANAGED = {MANAGEMENT_STATE_ANNOTATION: "unmanaged"}
CONFIRM = CONFIRM_SCALE_DOWN_ANNOTATION
