"""One worker lifecycle (scale up to Ready, decommission) on a client with the tracing interceptor
and the Prometheus runtime: the spans form one trace of the expected shape, the BMaaS and hub calls
are spans under their activity with the order/slot/BMI attributes and no secrets, and the metrics
endpoint carries the SDK's metrics (and the product's once the workflows record them)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from temporalio.client import Client

from contracts.activities import BmaasActivity
from contracts.refs import OrderRef
from contracts.workflows import cluster_workflow_id, worker_workflow_id
from tests.ops.conftest import MetricsRuntime, SpanCapture
from tests.ops.promtext import Sample, parse, select
from tests.workflows.stack import PULL_SECRET, Stack, eventually, running_stack
from worker.main import run_worker

WORKER_ACTIVITIES = {
    "create_worker_instance",
    "wait_instance_running",
    "wait_agent_and_hand",
    "wait_agent_installed",
    "unbind_agent",
    "wait_instance_gone",
}


@dataclass
class Lifecycle:
    order: OrderRef
    bmi_id: str
    spans: list[ReadableSpan]
    metrics: list[Sample]
    task_queue: str
    secrets: list[str]


@pytest.fixture(scope="module")
async def stack(observed_client: Client, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with running_stack(observed_client, tmp_path_factory.mktemp("observed")) as running:
        yield running


@pytest.fixture(scope="module")
async def lifecycle(stack: Stack, span_capture: SpanCapture, metrics_runtime: MetricsRuntime) -> Lifecycle:
    span_capture.start()
    try:
        order = await stack.create_order({"bm-standard": 1})
        await stack.apply(order, {"bm-standard": 1})
        status = await stack.wait_ready(order, 1)
        bmi_id = status.workers[0].resource_id
        assert bmi_id
        await stack.decommission_and_wait(order)
    finally:
        spans = span_capture.stop()
    return Lifecycle(
        order=order,
        bmi_id=bmi_id,
        spans=spans,
        metrics=parse(metrics_runtime.scrape()),
        task_queue=stack.settings.task_queue,
        secrets=[stack.fulfillment.admin_token, PULL_SECRET, "sup3r-s3cret-pull"],
    )


def _index(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def _parent(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> ReadableSpan | None:
    return by_id.get(span.parent.span_id) if span.parent is not None else None


def _one(spans: list[ReadableSpan], name: str, workflow_id: str | None = None) -> ReadableSpan:
    found = [
        s
        for s in spans
        if s.name == name
        and (workflow_id is None or (s.attributes or {}).get("temporalWorkflowID") == workflow_id)
    ]
    assert len(found) == 1, f"expected one {name} span for {workflow_id}, got {len(found)}"
    return found[0]


def test_one_trace_from_the_client_call_to_every_backend_call(lifecycle: Lifecycle) -> None:
    spans, order = lifecycle.spans, lifecycle.order
    by_id = _index(spans)
    cluster_id = cluster_workflow_id(order)
    worker_id = worker_workflow_id(order, order.worker_name(0))

    # The client's update-with-start is the root; the cluster workflow runs under it.
    root = _one(spans, "StartUpdateWithStartWorkflow:ClusterWorkersWorkflow", cluster_id)
    assert root.parent is None and root.kind == SpanKind.CLIENT
    run_cluster = _one(spans, "RunWorkflow:ClusterWorkersWorkflow", cluster_id)
    assert _parent(run_cluster, by_id) is root

    # The worker's child workflow hangs off the cluster workflow's start of it.
    start_child = _one(spans, "StartChildWorkflow:WorkerNodeWorkflow", cluster_id)
    assert _parent(start_child, by_id) is root
    run_worker_span = _one(spans, "RunWorkflow:WorkerNodeWorkflow", worker_id)
    assert _parent(run_worker_span, by_id) is start_child

    # Everything the workflows and activities did is one trace (other client calls, such as status
    # queries, are traces of their own).
    ours = [
        s
        for s in spans
        if (s.attributes or {}).get("temporalWorkflowID") in (cluster_id, worker_id)
        and s.name.split(":", 1)[0] in ("RunWorkflow", "StartActivity", "RunActivity", "StartChildWorkflow")
    ]
    assert {s.context.trace_id for s in ours} == {root.context.trace_id}

    # Every activity run is the child of the workflow's scheduling of it, in the same workflow.
    worker_runs: set[str] = set()
    for run in (s for s in ours if s.name.startswith("RunActivity:")):
        activity_type = run.name.split(":", 1)[1]
        scheduled = _parent(run, by_id)
        assert scheduled is not None and scheduled.name == f"StartActivity:{activity_type}"
        workflow_id = (run.attributes or {})["temporalWorkflowID"]
        assert (scheduled.attributes or {})["temporalWorkflowID"] == workflow_id
        assert _parent(scheduled, by_id) is (start_child if workflow_id == worker_id else root)
        if workflow_id == worker_id:
            worker_runs.add(activity_type)
    assert worker_runs >= WORKER_ACTIVITIES


def _backend_spans(lifecycle: Lifecycle) -> list[ReadableSpan]:
    return [
        s
        for s in lifecycle.spans
        if s.name.startswith(("bmaas ", "hub "))
        and (s.attributes or {}).get("osac.order") == lifecycle.order.key
    ]


def test_backend_calls_are_client_spans_under_their_activity(lifecycle: Lifecycle) -> None:
    by_id = _index(lifecycle.spans)
    order = lifecycle.order
    slot = order.worker_name(0)
    backend = _backend_spans(lifecycle)
    assert backend
    for span in backend:
        assert span.kind == SpanKind.CLIENT
        parent = _parent(span, by_id)
        assert parent is not None and parent.name.startswith("RunActivity:"), span.name
        attributes = span.attributes or {}
        parent_workflow = str((parent.attributes or {})["temporalWorkflowID"])
        # The slot is named exactly when the call is made for a worker slot.
        assert attributes.get("osac.slot") == (slot if parent_workflow.startswith("worker/") else None)

    def under(activity_type: str, name: str) -> list[ReadableSpan]:
        return [
            s
            for s in backend
            if s.name == name and _parent(s, by_id).name == f"RunActivity:{activity_type}"  # type: ignore[union-attr]
        ]

    (create,) = under(BmaasActivity.CREATE_WORKER_INSTANCE, "bmaas POST /baremetal_instances")
    assert (create.attributes or {})["osac.bmaas.route"] == "/baremetal_instances"
    # The release deletes and waits in one activity.
    (delete,) = under(BmaasActivity.WAIT_INSTANCE_GONE, "bmaas DELETE /baremetal_instances/{id}")
    assert (delete.attributes or {})["osac.bmi_id"] == lifecycle.bmi_id
    assert under("ensure_infraenv", "hub create InfraEnv")
    assert under("wait_agent_and_hand", "hub patch Agent")
    publish = under("publish_order_status", "hub patch/status ClusterOrder")
    assert publish and all((s.attributes or {})["osac.hub.name"] == order.name for s in publish)


def test_spans_carry_no_secrets(lifecycle: Lifecycle) -> None:
    assert lifecycle.spans
    for span in lifecycle.spans:
        texts = [span.name, *(str(v) for v in (span.attributes or {}).values())]
        texts += [str(v) for event in span.events for v in (event.attributes or {}).values()]
        if span.status.description:
            texts.append(span.status.description)
        for text in texts:
            for secret in lifecycle.secrets:
                assert secret not in text, f"span {span.name} carries a secret"
            assert "Bearer" not in text


def test_prometheus_endpoint_after_a_lifecycle(lifecycle: Lifecycle) -> None:
    metrics, order = lifecycle.metrics, lifecycle.order
    names = {s.name for s in metrics}
    completed = select(metrics, "temporal_workflow_completed", task_queue=lifecycle.task_queue)
    assert {s.labels["workflow_type"] for s in completed} == {
        "ClusterWorkersWorkflow",
        "WorkerNodeWorkflow",
    }, names
    latency = select(
        metrics,
        "temporal_activity_execution_latency_count",
        activity_type=BmaasActivity.CREATE_WORKER_INSTANCE.value,
        task_queue=f"{lifecycle.task_queue}-bmaas",
    )
    assert latency and latency[0].value >= 1
    assert any(name.startswith("temporal_worker_task_slots") for name in names), names

    # Product metrics appear once the workflows record them; when they do, they follow OSAC's shape.
    ours = [
        s
        for s in metrics
        if s.name.startswith("osac_clusterorder_") and s.labels.get("tenant") == order.namespace
    ]
    for sample in ours:
        assert sample.labels["worker_type"] == "bare_metal"
    provisioned = [
        s for s in ours if s.name == "osac_clusterorder_worker_provisioning_duration_seconds_count"
    ]
    if ours:
        assert provisioned and provisioned[0].value >= 1
        desired = [s for s in ours if s.name == "osac_clusterorder_workers_desired"]
        assert desired and desired[-1].value == 0  # decommissioned


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_worker_serves_health_probes_while_running(stack: Stack, lifecycle: Lifecycle) -> None:
    # A second worker process on its own task queues (it gets no work), with the probes on.
    port = _free_port()
    queue = f"health-{uuid.uuid4().hex[:6]}"
    settings = stack.settings.model_copy(
        update={"health_bind": f"127.0.0.1:{port}", "task_queue": queue, "bmaas_task_queue": f"{queue}-bmaas"}
    )
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(stack.client, settings, stop))
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5.0) as http:

            async def ready() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await http.get("/readyz")).status_code == 200
                return False

            await eventually(ready, "/readyz to answer 200", timeout=60)
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/nope")).status_code == 404
            stop.set()
            await asyncio.wait_for(task, 60)
            with pytest.raises(httpx.TransportError):
                await http.get("/healthz")
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait_for(task, 60)
    assert task.exception() is None
