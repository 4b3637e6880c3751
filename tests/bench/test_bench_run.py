"""The benchmark harness end to end in a tiny mode: every figure present and sane (no timing asserts).

Runs `python -m bench.run` as a real process (own dev server, twins and worker processes) with three
workers, the 1x profile only and three workers held for density, the worker split in its two roles
(`--split-worker`: the one-process worker is the same code with one process to measure, and the
suite's time is short)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.latency import EVENTS
from bench.run import TOP_LEVEL_KEYS, density_verdict

LIFECYCLE_ACTIVITIES = 6


def _bench(tmp_path: Path, *options: str) -> Path:
    """Run `python -m bench.run` with `options`; its results directory (work directories, when
    kept, go under `tmp_path` too)."""
    results_dir = tmp_path / "results"
    command = [sys.executable, "-m", "bench.run", *options, f"--results-dir={results_dir}"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return results_dir


def test_tiny_run_writes_every_figure(tmp_path: Path) -> None:
    results_dir = _bench(
        tmp_path,
        "--n=3",
        "--profile-n=3",
        "--density=3",
        "--cost-profiles=1x",
        "--hold=1",
        "--ready-hold=1",
        "--split-worker",
        "--keep-workdir",
    )
    [path] = [p for p in results_dir.glob("*.json") if not p.name.endswith(".details.json")]
    results = json.loads(path.read_text())
    assert tuple(results) == TOP_LEVEL_KEYS
    assert results["n"] == 3
    assert results["floor_ratio"] > 0

    for key in ("history_events_per_lifecycle", "hub_requests_per_lifecycle", "bmaas_requests_per_lifecycle"):
        figure = results[key]
        one = figure["1x"]
        assert 0 < one["min"] <= one["median"] <= one["max"], (key, one)
        assert figure["10x"] is None and figure["ratio"] is None  # 10x was not run
    by_type = results["history_events_per_lifecycle"]["by_workflow_type"]
    assert all(cost["1x"]["median"] > 0 for cost in by_type.values())

    reaction = results["reaction_latency_s"]
    assert set(reaction) == set(EVENTS)
    for event, figures in reaction.items():
        assert figures["p50"] is not None and 0 <= figures["p50"] <= figures["p99"], (event, figures)

    assert results["rss_mb_per_1000_ready"] > 0
    assert results["cpu_s_per_1000_ready"] >= 0
    assert results["machine"]["cores"] >= 1 and results["machine"]["memory_mb"] > 0
    assert results["versions"]["temporalio"] != "absent"

    details = json.loads(path.with_name(path.stem + ".details.json").read_text())
    assert details["floor"]["audit_violations"] == 0
    split = details["floor"]["time_split_per_worker"]
    assert split["median_workflow_task_running_s"] > 0 and split["median_workflow_task_queued_s"] >= 0
    by_cause = split["workflow_task_queued_by_cause"]
    # Every worker's first task comes from its start; the rest from activities and signals.
    assert by_cause["workflow_execution_started"]["tasks_per_worker"] == 1
    assert by_cause["activity_task_completed"]["tasks_per_worker"] >= 4
    assert all(c["p50_s"] <= c["p99_s"] and c["s_per_worker"] >= 0 for c in by_cause.values())
    assert split["workflow_tasks_replayed_per_run"] >= 0
    # The server's own counters: the baseline is exactly its K activities and K + 1 workflow tasks
    # per workflow, so the scrapes cover the whole phase. A lifecycle has at least six activities
    # of its own (create, three waits up to Ready, unbind, wait gone), each followed by a workflow
    # task; its local status writes ride on the tasks of other events.
    floor = details["floor"]
    k = floor["baseline_activities_per_workflow"]
    baseline = floor["baseline_server_requests_per_workflow"]
    assert baseline["frontend/RespondActivityTaskCompleted"] == k
    assert baseline["frontend/RespondWorkflowTaskCompleted"] == k + 1
    lifecycle = floor["server_requests_per_worker"]
    assert lifecycle["frontend/RespondActivityTaskCompleted"] >= LIFECYCLE_ACTIVITIES
    assert lifecycle["frontend/RespondWorkflowTaskCompleted"] >= LIFECYCLE_ACTIVITIES + 1
    assert lifecycle["persistence/total"] > baseline["persistence/UpdateWorkflowExecution"] > 0
    # CPU seconds side by side: the twins' share counts in one ratio only.
    assert floor["work_ratio"] > floor["work_ratio_without_twins"] > 0
    assert details["cost_1x"]["audit_violations"] == 0
    # The hub twin's watch delay, for the worker's informers and the harness's own watch.
    delays = details["cost_1x"]["hub_watch_delay"]
    assert {"admin", "bench"} <= set(delays)
    assert all(
        0 <= d["p50Seconds"] <= d["p99Seconds"] <= d["maxSeconds"] and d["events"] > 0
        for d in delays.values()
    )
    assert details["density"]["workers"] == 3
    # CPU is never negative; the idle figure is the hold's second half, the tail its first.
    assert details["density"]["idle_cpu_s_per_minute_held"] >= 0
    assert details["density"]["tail_cpu_s_first_half_of_hold"] >= 0

    # A workflow process and an activity process; the figures are their sums.
    assert details["settings"]["worker_processes"] == ["workflows", "activities"]
    assert floor["worker_cpu_s"] > 0
    # Each process ran its own part: its log says which role it had.
    [workdir] = list(tmp_path.glob("osac-bench-*"))
    logs = {
        role: (workdir / "lifecycle-zero" / f"worker-{role}.log").read_text()
        for role in ("workflows", "activities")
    }
    assert "(role workflows)" in logs["workflows"]
    assert "(role activities)" in logs["activities"]
    assert "created BMI" in logs["activities"] and "created BMI" not in logs["workflows"]


def test_only_an_exact_thousand_gets_a_density_verdict() -> None:
    assert "met" in density_verdict(376.1, 1000) and "missed" in density_verdict(401.0, 1000)
    assert density_verdict(417.6, 300) == "[dim]see full run[/]"  # scaled from 300: no verdict
    assert density_verdict(None, None) == "[dim]n/a[/]"
