"""Product metrics with OSAC's names, recorded from workflow code.

`workflow.metric_meter()` is replay-safe: the SDK drops whatever is recorded while a worker replays
history, so a restarted or cache-evicted workflow does not count a provisioning twice. Values reach
Prometheus through the Temporal runtime of the worker (OSAC_METRICS_BIND), next to the SDK metrics,
with the meter's own labels (namespace, task_queue, workflow_type) plus ours:
- `tenant`: the ClusterOrder's namespace; `worker_type`: always "bare_metal";
- gauges also carry `cluster_order` (the order's name): a tenant may hold several orders, and a gauge
  per tenant alone would be overwritten by each of them (sum by tenant for the tenant's total).

Gauges hold the last value the workflow recorded; after a worker restart they reappear with the next
status change of the order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.common import MetricMeter

from contracts.refs import OrderRef

WORKERS_DESIRED = "osac_clusterorder_workers_desired"
WORKERS_READY = "osac_clusterorder_workers_ready"
WORKERS_FAILED = "osac_clusterorder_workers_failed"
PROVISIONING_DURATION = "osac_clusterorder_worker_provisioning_duration_seconds"
CORRELATION_DURATION = "osac_clusterorder_worker_agent_correlation_duration_seconds"
WORKER_TYPE = "bare_metal"

# Bare-metal timescales: a host boots in minutes, an install takes tens of minutes.
HISTOGRAM_BUCKETS: Mapping[str, Sequence[float]] = {
    PROVISIONING_DURATION: (60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 5400, 7200, 10800),
    CORRELATION_DURATION: (5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800),
}


def _meter(meter: MetricMeter | None) -> MetricMeter:
    return meter if meter is not None else workflow.metric_meter()


def _labels(order: OrderRef) -> dict[str, str | int | float | bool]:
    return {"tenant": order.namespace, "worker_type": WORKER_TYPE}


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def record_order_counts(
    order: OrderRef, desired: int, ready: int, failed: int, *, meter: MetricMeter | None = None
) -> None:
    """Set the order's desired / Ready / Failed worker gauges (call on every status change)."""
    m = _meter(meter)
    labels = {**_labels(order), "cluster_order": order.name}
    m.create_gauge(WORKERS_DESIRED, "Workers the ClusterOrder asks for").set(max(0, desired), labels)
    m.create_gauge(WORKERS_READY, "Workers of the ClusterOrder in phase Ready").set(max(0, ready), labels)
    m.create_gauge(WORKERS_FAILED, "Workers of the ClusterOrder in phase Failed").set(max(0, failed), labels)


def record_provisioning_duration(
    order: OrderRef, seconds: float | timedelta, *, meter: MetricMeter | None = None
) -> None:
    """One worker went from the start of its provisioning to Ready."""
    _meter(meter).create_histogram_float(
        PROVISIONING_DURATION, "Time from the start of a worker's provisioning to Ready", "s"
    ).record(max(0.0, _seconds(seconds)), _labels(order))


def record_correlation_duration(
    order: OrderRef, seconds: float | timedelta, *, meter: MetricMeter | None = None
) -> None:
    """One worker's BMI was running and its discovery Agent got matched by MAC this long after."""
    _meter(meter).create_histogram_float(
        CORRELATION_DURATION, "Time from a running BMI to its Agent matched by MAC", "s"
    ).record(max(0.0, _seconds(seconds)), _labels(order))
