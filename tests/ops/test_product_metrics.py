"""The product metric helpers (workflows/metrics.py) on a real worker and the Prometheus endpoint:
names, labels, bucket layout, and that replaying history does not record twice."""

from __future__ import annotations

import uuid

from temporalio.client import Client
from temporalio.worker import Worker

from contracts.refs import OrderRef
from tests.ops.conftest import MetricsRuntime
from tests.ops.probe_workflows import MetricsProbeInput, MetricsProbeWorkflow
from tests.ops.promtext import parse, select
from tests.workflows.stack import eventually
from workflows.metrics import (
    CORRELATION_DURATION,
    HISTOGRAM_BUCKETS,
    PROVISIONING_DURATION,
    WORKERS_DESIRED,
    WORKERS_FAILED,
    WORKERS_READY,
)


async def test_product_metrics_are_exported_once_despite_replays(
    observed_client: Client, metrics_runtime: MetricsRuntime
) -> None:
    order = OrderRef(namespace=f"tenant-{uuid.uuid4().hex[:6]}", name=f"o{uuid.uuid4().hex[:6]}")
    task_queue = f"metrics-{uuid.uuid4().hex[:6]}"
    labels = {"tenant": order.namespace, "worker_type": "bare_metal"}
    # No workflow cache: every workflow task replays the history from the start, as after a restart.
    async with Worker(
        observed_client, task_queue=task_queue, workflows=[MetricsProbeWorkflow], max_cached_workflows=0
    ):
        handle = await observed_client.start_workflow(
            MetricsProbeWorkflow.run,
            MetricsProbeInput(order=order),
            id=f"probe-{order.name}",
            task_queue=task_queue,
        )

        async def first_recordings() -> list | None:
            found = select(parse(metrics_runtime.scrape()), f"{PROVISIONING_DURATION}_count", **labels)
            return found or None

        await eventually(first_recordings, "the first recordings on /metrics", timeout=60)
        await handle.signal(MetricsProbeWorkflow.go)
        await handle.result()

    samples = parse(metrics_runtime.scrape())
    gauge_labels = {**labels, "cluster_order": order.name}
    assert [s.value for s in select(samples, WORKERS_DESIRED, **gauge_labels)] == [3]
    # The last values, set after the replayed part: the replay did not re-set 1 and 1.
    assert [s.value for s in select(samples, WORKERS_READY, **gauge_labels)] == [2]
    assert [s.value for s in select(samples, WORKERS_FAILED, **gauge_labels)] == [0]
    for gauge in (WORKERS_DESIRED, WORKERS_READY, WORKERS_FAILED):
        (sample,) = select(samples, gauge, **gauge_labels)
        assert sample.labels["workflow_type"] == "MetricsProbeWorkflow"

    # Each histogram recorded once, although its recording ran again during the replay.
    assert [s.value for s in select(samples, f"{PROVISIONING_DURATION}_count", **labels)] == [1]
    assert [s.value for s in select(samples, f"{PROVISIONING_DURATION}_sum", **labels)] == [90]
    assert [s.value for s in select(samples, f"{CORRELATION_DURATION}_count", **labels)] == [1]
    assert [s.value for s in select(samples, f"{CORRELATION_DURATION}_sum", **labels)] == [42]

    # Buckets sized for bare metal (the runtime's overrides), cumulative as Prometheus expects.
    for name, bounds in HISTOGRAM_BUCKETS.items():
        buckets = {s.labels["le"]: s.value for s in select(samples, f"{name}_bucket", **labels)}
        assert {float(le) for le in buckets if le != "+Inf"} == {float(b) for b in bounds}
        assert buckets["+Inf"] == 1
    provisioning = {
        float(s.labels["le"]): s.value for s in select(samples, f"{PROVISIONING_DURATION}_bucket", **labels)
    }
    assert provisioning[60] == 0 and provisioning[120] == 1
