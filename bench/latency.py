"""Reaction latency: from a twin's state change to the orchestrator's next call about it.

Change times come from the twins' own records and the harness's watches: BMI running is the
fulfillment audit's HOST_BOOTED (written in the same step that makes the BMI RUNNING), BMI gone is
HOST_RELEASED (same step as the object's removal), and the Agent changes are the first hub watch event
that shows them. The orchestrator's next call is the start of the worker workflow's next activity
(the history's ActivityTaskStarted time: the activity's first request goes out right then); for a
registered Agent it is its approval (the hand-off's write, as the harness's watch first shows it),
which the current workers make inside the activity that waited for the registration; where the
worker workflow has no next call (installed, gone), it is the first ClusterOrder status write that
shows the worker past the change (Ready or a later phase; left out once gone), which is the
orchestrator's next hub request about it.

Beside each figure, `noticed` is the time until the activity that was waiting for the change returned
(what the watches cost, without what the workflow does next).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench.histories import ActivityCall, RunHistory
from bench.observer import AgentTimeline, OrderTimeline
from contracts.worker import WorkerPhase

EVENTS = ("bmi_running", "agent_registered", "agent_installed", "agent_unbound", "bmi_gone")
WORKER_WORKFLOW = "WorkerNodeWorkflow"
# Phases a worker shows once its install is done (a scale-down may follow before the next write).
_PAST_INSTALL = (WorkerPhase.READY, WorkerPhase.UNBINDING, WorkerPhase.DELETING)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Samples:
    noticed: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    unmatched: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # A few unmatched changes, (slot, change time, next call or None), to tell why.
    unmatched_examples: dict[str, list[tuple[str, float, float | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # Per matched change, (slot, change time, reaction): the slowest tell whether a tail is one order's.
    matched: dict[str, list[tuple[str, float, float]]] = field(default_factory=lambda: defaultdict(list))

    def reactions(self, event: str) -> list[float]:
        return [reaction for _, _, reaction in self.matched.get(event, [])]

    def summary(self) -> dict[str, dict[str, float | None]]:
        result: dict[str, dict[str, float | None]] = {}
        for event in EVENTS:
            values = self.reactions(event)
            result[event] = {
                "p50": round(percentile(values, 50), 4) if values else None,
                "p99": round(percentile(values, 99), 4) if values else None,
            }
        return result

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for event in EVENTS:
            reaction, noticed = self.reactions(event), self.noticed.get(event) or []
            out[event] = {
                "samples": len(reaction),
                "unmatched": self.unmatched.get(event, 0),
                "unmatched_examples": self.unmatched_examples.get(event, [])[:3],
                "slowest": [
                    (slot, round(at, 3), round(took, 4))
                    for slot, at, took in sorted(self.matched.get(event, []), key=lambda m: -m[2])[:8]
                ],
                "max": round(max(reaction), 4) if reaction else None,
                "noticed_p50": round(percentile(noticed, 50), 4) if noticed else None,
                "noticed_p99": round(percentile(noticed, 99), 4) if noticed else None,
            }
        return out


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _slot_of(workflow_id: str) -> str:
    return workflow_id.rsplit("/", 1)[-1]


class _Slot:
    def __init__(self, calls: list[ActivityCall]) -> None:
        self.calls = sorted(calls, key=lambda c: c.scheduled)

    def next_start(self, after: float) -> float | None:
        starts = [c.started for c in self.calls if c.started is not None and c.started >= after]
        return min(starts) if starts else None

    def waiter_returned(self, after: float) -> float | None:
        """When the activity in flight at `after` returned (the wait that was watching the change)."""
        closes = [
            c.closed
            for c in self.calls
            if c.started is not None and c.started <= after and c.closed is not None and c.closed >= after
        ]
        return min(closes) if closes else None


def measure(
    histories: list[RunHistory],
    audit: list[dict[str, Any]],
    agents: list[AgentTimeline],
    orders: dict[str, OrderTimeline],
) -> Samples:
    calls: dict[str, list[ActivityCall]] = defaultdict(list)
    for run in histories:
        if run.workflow_type == WORKER_WORKFLOW:
            calls[_slot_of(run.workflow_id)].extend(run.activities)
    slots = {name: _Slot(c) for name, c in calls.items()}
    status_ready: dict[str, float] = {}
    status_gone: dict[str, float] = {}
    for line in orders.values():
        status_gone.update(line.gone)
        for name, seen in line.phases.items():
            past = [seen[p] for p in _PAST_INSTALL if p in seen]
            if name in line.gone:
                past.append(line.gone[name])
            if past:
                status_ready[name] = min(past)
    samples = Samples()

    def add(event: str, slot_name: str | None, changed: float | None, next_call: float | None) -> None:
        slot = slots.get(slot_name or "")
        if changed is None or slot is None:
            return
        if next_call is None or next_call < changed:
            samples.unmatched[event] += 1
            samples.unmatched_examples[event].append((slot_name or "", changed, next_call))
            return
        samples.matched[event].append((slot_name or "", changed, next_call - changed))
        returned = slot.waiter_returned(changed)
        if returned is not None:
            samples.noticed[event].append(returned - changed)

    for record in audit:
        bmi_name, kind = str(record.get("bmi_name") or ""), record.get("kind")
        if bmi_name not in slots:
            continue
        at = _epoch(record["time"])
        if kind == "HOST_BOOTED":
            add("bmi_running", bmi_name, at, slots[bmi_name].next_start(at))
        elif kind == "HOST_RELEASED":
            add("bmi_gone", bmi_name, at, status_gone.get(bmi_name))
    for agent in agents:
        if agent.worker is None or agent.worker not in slots:
            continue
        slot = slots[agent.worker]
        if agent.registered is not None:
            add("agent_registered", agent.worker, agent.registered, agent.approved)
        if agent.installed is not None:
            add("agent_installed", agent.worker, agent.installed, status_ready.get(agent.worker))
        if agent.unbound is not None:
            add("agent_unbound", agent.worker, agent.unbound, slot.next_start(agent.unbound))
    return samples
