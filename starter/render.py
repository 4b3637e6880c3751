"""How the CLI shows an order's workers: a table, JSON, and live progress bars."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from contracts.hub import ConditionStatus
from contracts.refs import OrderRef
from contracts.worker import WorkerPhase
from contracts.workflows import ClusterWorkersStatus
from starter.api import OrderNotFound, StatusUnanswered

PHASE_STYLE: dict[WorkerPhase, str] = {
    WorkerPhase.PROVISIONING: "cyan",
    WorkerPhase.WAITING_FOR_AGENT: "blue",
    WorkerPhase.BINDING: "magenta",
    WorkerPhase.READY: "green",
    WorkerPhase.FAILED: "red",
    WorkerPhase.UNBINDING: "yellow",
    WorkerPhase.DELETING: "yellow",
}
# Conditions whose True means trouble; for the others False does.
BAD_WHEN_TRUE = {
    "WorkersFailed",
    "RHCOSImageNotFound",
    "FulfillmentServiceUnavailable",
    "WorkersWorkflowStopped",
}


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    delta = (moment - datetime.now(UTC)).total_seconds()
    return f"in {delta:.0f}s" if delta >= 0 else f"{-delta:.0f}s ago"


def settled(status: ClusterWorkersStatus) -> bool:
    """Nothing left to do: decommissioned, or every desired worker Ready and no other worker left."""
    if status.finished:
        return True
    if status.decommissioning:
        return False
    return (
        status.ready_workers == status.desired_workers
        and len(status.workers) == status.desired_workers
        and all(w.phase == WorkerPhase.READY for w in status.workers)
    )


def summary_line(status: ClusterWorkersStatus) -> str:
    phases = Counter(w.phase.value for w in status.workers)
    state = "decommissioned" if status.finished else "decommissioning" if status.decommissioning else "active"
    counts = ", ".join(f"{k}={v}" for k, v in sorted(phases.items())) or "no workers"
    return (
        f"{status.order.key}: {state}; ready {status.ready_workers}/{status.desired_workers}"
        f" (current {status.current_workers}); {counts}"
    )


def workers_table(status: ClusterWorkersStatus) -> Table:
    table = Table(title=summary_line(status), title_justify="left", expand=False)
    for column in ("WORKER", "NODE SET", "PHASE", "BMI", "ATTEMPT", "LAST FAILURE", "NEXT RETRY"):
        table.add_column(column, no_wrap=column in ("WORKER", "BMI"))
    for w in status.workers:
        failure = ""
        if w.last_failure_reason is not None:
            failure = f"{w.last_failure_reason.value} ({_ago(w.last_failure_time)})"
        table.add_row(
            w.name,
            w.node_set,
            Text(w.phase.value, style=PHASE_STYLE.get(w.phase, "")),
            w.resource_id or "",
            str(w.attempt_count),
            failure,
            _ago(w.next_retry_time),
        )
    return table


def conditions_text(status: ClusterWorkersStatus) -> Text:
    text = Text()
    for cond in status.conditions:
        bad = (cond.status == ConditionStatus.TRUE) == (cond.type in BAD_WHEN_TRUE)
        text.append(f"{cond.type}={cond.status.value}", style="red" if bad else "green")
        text.append(f" ({cond.reason}) ")
    return text


def progress_view(status: ClusterWorkersStatus, elapsed: float) -> RenderableType:
    bars = Table.grid(padding=(0, 2))
    for _ in range(4):
        bars.add_column()
    for node_set in status.node_sets:
        members = [w for w in status.workers if w.node_set == node_set.name]
        ready = sum(1 for w in members if w.phase == WorkerPhase.READY)
        total = max(node_set.count if not status.decommissioning else 0, len(members), 1)
        phases = Counter(w.phase.value for w in members if w.phase != WorkerPhase.READY)
        bars.add_row(
            Text(node_set.name, style="bold"),
            ProgressBar(total=total, completed=min(ready, total), width=30),
            f"{ready}/{0 if status.decommissioning else node_set.count} ready",
            ", ".join(f"{v} {k}" for k, v in sorted(phases.items())),
        )
    header = Text(f"{summary_line(status)}  [{elapsed:.0f}s]")
    return Group(header, bars, conditions_text(status), workers_table(status))


def status_feed(
    fetch_status: Callable[[OrderRef], Awaitable[ClusterWorkersStatus]],
    ref: OrderRef,
    say: Callable[[str], None],
    *,
    missing: str | None = None,
) -> Callable[[], Awaitable[ClusterWorkersStatus | None]]:
    """`fetch_status` for `follow`: None while the order has no workflow yet (`missing` said once,
    if given) or no worker answers its query in time (said once per gap: a worker restarting, a
    rolling deploy), so a long follow outlives either."""
    told = False
    unanswered = False

    async def fetch() -> ClusterWorkersStatus | None:
        nonlocal told, unanswered
        try:
            status = await fetch_status(ref)
        except OrderNotFound:
            if missing is not None and not told:
                told = True
                say(missing)
            return None
        except StatusUnanswered as err:
            if not unanswered:
                unanswered = True
                say(f"{err}; still waiting")
            return None
        unanswered = False
        return status

    return fetch


async def follow(
    fetch: Callable[[], Awaitable[ClusterWorkersStatus | None]],
    *,
    done: Callable[[ClusterWorkersStatus], bool] = settled,
    timeout: float | None = None,
    console: Console | None = None,
    interval: float = 0.5,
) -> ClusterWorkersStatus | None:
    """Show live progress until `done(status)`; returns the last status (None: nothing to show yet).

    On a terminal the view redraws in place; otherwise one line is printed per change, so logs of
    `make demo` stay readable."""
    console = console or Console(soft_wrap=True)
    started = time.monotonic()
    last: ClusterWorkersStatus | None = None
    last_line = ""

    async def step() -> bool:
        nonlocal last
        status = await fetch()
        if status is not None:
            last = status
        return last is not None and done(last)

    def timed_out() -> bool:
        return timeout is not None and time.monotonic() - started > timeout

    if console.is_terminal:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while True:
                finished = await step()
                if last is not None:
                    live.update(progress_view(last, time.monotonic() - started))
                if finished or timed_out():
                    return last
                await asyncio.sleep(interval)
    while True:
        finished = await step()
        if last is not None:
            line = summary_line(last)
            if line != last_line:
                console.print(f"[{time.monotonic() - started:5.1f}s] {line}", highlight=False)
                last_line = line
        if finished or timed_out():
            return last
        await asyncio.sleep(interval)
