"""Reading the Temporal server's request counters from its Prometheus text."""

from __future__ import annotations

from bench.server_metrics import parse, per_unit

TEXT = """\
# HELP service_requests service_requests counter
# TYPE service_requests counter
service_requests{namespace="default",operation="RespondWorkflowTaskCompleted",service_name="frontend"} 7
service_requests{namespace="other",operation="RespondWorkflowTaskCompleted",service_name="frontend"} 3
service_requests{namespace="default",operation="RespondWorkflowTaskCompleted",service_name="history"} 10
persistence_requests{operation="UpdateWorkflowExecution",service_name="history"} 12
service_latency_bucket{operation="RespondWorkflowTaskCompleted",service_name="frontend",le="0.1"} 99
"""


def test_counters_are_summed_per_service_and_operation_and_other_metrics_ignored() -> None:
    assert parse(TEXT) == {
        "frontend/RespondWorkflowTaskCompleted": 10,
        "history/RespondWorkflowTaskCompleted": 10,
        "persistence/UpdateWorkflowExecution": 12,
    }


def test_a_phase_is_the_growth_per_unit_with_totals_per_service() -> None:
    before = {"frontend/A": 10.0, "frontend/B": 4.0, "history/A": 1.0}
    after = {"frontend/A": 30.0, "frontend/B": 4.0, "history/A": 5.0, "history/C": 6.0}
    assert per_unit(before, after, units=2) == {
        "frontend/total": 10.0,
        "history/total": 5.0,
        "frontend/A": 10.0,
        "history/C": 3.0,
        "history/A": 2.0,
    }
