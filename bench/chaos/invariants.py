"""The promises, judged from what a seed recorded: the twins' audit log and final state, the plateaus
and the consistency checks. Each invariant says whether it held and why (its evidence).

Wipe failures are expected: the failed wipe's BMI stays DELETING and its worker stays Deleting
(HostWipeStuck) for good, and its order's decommission cannot complete (the workflow deletes the
InfraEnv only after its last worker is gone). Decommission is judged complete when everything else
of both orders is gone and closed, and what remains is exactly the stuck workers (as many as wipes
were made to fail, on exactly the chosen hosts, quarantined), the BMIs they hold, their still-running
worker workflows, their order's workflow (decommissioning) and that order's InfraEnv: the operator
sees them and decides, nothing is silently forgotten.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from bench.chaos.config import Phase
from bench.chaos.scenario import SeedRecord, state_is
from bench.chaos.twins import Obj
from contracts.workflows import cluster_workflow_id, worker_workflow_id
from starter.api import WorkflowState

CLOSED_OK = {"COMPLETED", "CONTINUED_AS_NEW"}


@dataclass
class Invariant:
    name: str
    held: bool
    evidence: str


def _replay(audit: list[Obj]) -> tuple[list[str], list[str], dict[str, int]]:
    """Walk the audit in order. Returns (double-allocation problems, unwiped-reuse problems, counts)."""
    holder: dict[str, str] = {}  # host -> live BMI
    wiped_since_alloc: dict[str, bool] = {}
    released_since_alloc: dict[str, bool] = {}
    host_of_bmi: dict[str, str] = {}
    double: list[str] = []
    unwiped: list[str] = []
    counts: Counter[str] = Counter()
    for r in sorted(audit, key=lambda rec: rec["seq"]):
        host, bmi, kind = r.get("host_id"), r.get("bmi_id") or "?", r["kind"]
        if host is None:
            continue
        if kind == "HOST_ALLOCATED":
            counts["allocations"] += 1
            if host in holder:
                double.append(f"#{r['seq']} {host} to {bmi} while held by {holder[host]}")
            if bmi in host_of_bmi:
                double.append(f"#{r['seq']} BMI {bmi} got a second host {host}")
            if host in wiped_since_alloc:  # held before: it must have been wiped and released since
                counts["reuses"] += 1
                if not (wiped_since_alloc[host] and released_since_alloc[host]):
                    unwiped.append(f"#{r['seq']} {host} reallocated without a finished wipe")
            holder[host], host_of_bmi[bmi] = bmi, host
            wiped_since_alloc[host] = released_since_alloc[host] = False
        elif kind == "WIPE_STARTED":
            counts["wipes"] += 1
            wiped_since_alloc[host] = False
        elif kind == "WIPE_FINISHED":
            wiped_since_alloc[host] = True
        elif kind == "HOST_RELEASED":
            if not wiped_since_alloc.get(host, False):
                unwiped.append(f"#{r['seq']} {host} released without a finished wipe")
            released_since_alloc[host] = True
            holder.pop(host, None)
    counts["hosts"] = len(wiped_since_alloc)
    return double, unwiped, dict(counts)


def judge(rec: SeedRecord) -> list[Invariant]:
    return [
        _no_double_allocation(rec),
        _no_unwiped_reuse(rec),
        _quarantine_never_reused(rec),
        _wipe_failures_surfaced(rec),
        _decommission_complete(rec),
        _plateaus(rec),
        _status_consistent(rec),
        _worker_died_only_when_killed(rec),
        _no_healthy_host_taken_for_lost(rec),
        _chaos_applied(rec),
    ]


def _no_double_allocation(rec: SeedRecord) -> Invariant:
    double, _, counts = _replay(rec.audit)
    twin = [v for v in rec.audit_violations if "while held" in v or "second host" in v]
    held = not double and not twin and bool(rec.audit)
    return Invariant(
        "no host served two live BMIs",
        held,
        f"{counts.get('allocations', 0)} allocations of {counts.get('hosts', 0)} hosts replayed from"
        f" {len(rec.audit)} audit records; overlaps: {(double + twin)[:3] or 'none'}",
    )


def _no_unwiped_reuse(rec: SeedRecord) -> Invariant:
    _, unwiped, counts = _replay(rec.audit)
    twin = [v for v in rec.audit_violations if "without a finished wipe" in v or "nobody holds" in v]
    return Invariant(
        "no host reused without a finished wipe",
        not unwiped and not twin,
        f"{counts.get('reuses', 0)} reallocations and {counts.get('wipes', 0)} wipes; every reuse and"
        f" release came after a finished wipe"
        if not unwiped and not twin
        else f"{(unwiped + twin)[:3]}",
    )


def _quarantine_never_reused(rec: SeedRecord) -> Invariant:
    audit = sorted(rec.audit, key=lambda r: r["seq"])
    failed = [r for r in audit if r["kind"] == "WIPE_FAILED"]
    quarantined_at = {r["host_id"]: r["seq"] for r in audit if r["kind"] == "HOST_QUARANTINED"}
    reused = [
        f"#{r['seq']} {r['host_id']}"
        for r in audit
        if r["kind"] == "HOST_ALLOCATED"
        and r["host_id"] in quarantined_at
        and r["seq"] > quarantined_at[r["host_id"]]
    ]
    first = min(quarantined_at.values(), default=None)
    later = sum(1 for r in audit if r["kind"] == "HOST_ALLOCATED" and first is not None and r["seq"] > first)
    final_state = {h["id"]: h["state"] for h in (rec.final.hosts if rec.final else [])}
    still = sorted(h for h in quarantined_at if final_state.get(h) == "QUARANTINED")
    problems = []
    if len(failed) != rec.config.wipe_failures:
        problems.append(f"{len(failed)} wipes failed, {rec.config.wipe_failures} were made to")
    if sorted(quarantined_at) != sorted(rec.wipe_victim_hosts):
        problems.append(f"quarantined {sorted(quarantined_at)} != chosen {sorted(rec.wipe_victim_hosts)}")
    if reused:
        problems.append(f"allocated after quarantine: {reused[:3]}")
    if still != sorted(quarantined_at):
        problems.append(f"final host states {[final_state.get(h) for h in quarantined_at]}")
    if rec.config.wipe_failures and later == 0:
        problems.append("no allocation happened after the quarantine: not exercised")
    return Invariant(
        "quarantined hosts were never reused",
        not problems,
        "; ".join(problems)
        or f"{len(failed)} failed wipes quarantined {', '.join(sorted(quarantined_at)) or 'none'};"
        f" {later} allocations afterwards, none on them; still QUARANTINED at the end",
    )


def _wipe_failures_surfaced(rec: SeedRecord) -> Invariant:
    final = rec.final
    victims = set(rec.wipe_victim_workers)
    problems = []
    if len(victims) != rec.config.wipe_failures:
        problems.append(f"{len(victims)} victims chosen")
    if set(rec.stuck_seen) != victims:
        problems.append(f"HostWipeStuck seen for {sorted(rec.stuck_seen)} of {sorted(victims)}")
    if final is not None:
        a = rec.orders["A"]
        shown = {
            w.get("name"): w for w in (final.orders.get(a.key, {}).get("status") or {}).get("workers") or []
        }
        for name in sorted(victims):
            item = shown.get(name) or {}
            if item.get("phase") != "Deleting" or item.get("lastFailureReason") != "HostWipeStuck":
                problems.append(
                    f"ClusterOrder shows {name} as {item.get('phase')}/{item.get('lastFailureReason')}"
                )
        stuck_bmis = {b["metadata"]["name"]: b for b in final.bmis}
        for name in sorted(victims):
            bmi = stuck_bmis.get(name)
            if bmi is None or not state_is(bmi, "DELETING"):
                problems.append(f"BMI of {name}: {(bmi or {}).get('status', {}).get('state', 'gone')}")
        runs = final.workflows.get(a.key, {})
        for name in sorted(victims):
            if "RUNNING" not in runs.get(worker_workflow_id(a, name), []):
                problems.append(f"workflow of {name} is not running (taken for done?)")
    else:
        problems.append("no final state")
    return Invariant(
        f"exactly {rec.config.wipe_failures} failed wipe(s) surfaced, never taken for done",
        not problems,
        "; ".join(problems)
        or f"{', '.join(sorted(victims))}: Deleting/HostWipeStuck in the workflow and on the ClusterOrder,"
        " BMI DELETING, worker workflow still waiting",
    )


def _decommission_complete(rec: SeedRecord) -> Invariant:
    final = rec.final
    if final is None:
        return Invariant(
            "decommission left nothing behind", False, "no final state: " + "; ".join(rec.errors)
        )
    problems: list[str] = []
    victims = set(rec.wipe_victim_workers)
    leftover_bmis = sorted(b["metadata"]["name"] for b in final.bmis if b["metadata"]["name"] not in victims)
    if leftover_bmis:
        problems.append(f"BMIs left: {leftover_bmis[:5]}")
    for label, objects in (("Agents", final.agents), ("Machines", final.machines)):
        left = {k: len(v) for k, v in objects.items() if v}
        if left:
            problems.append(f"{label} left: {left}")
    replicas = {
        k: sum(int((p.get("spec") or {}).get("replicas") or 0) for p in pools)
        for k, pools in final.nodepools.items()
    }
    if any(replicas.values()):
        problems.append(f"NodePool replicas left: {replicas}")
    held_hosts = sorted(h["id"] for h in final.hosts if h["state"] in ("ALLOCATED", "WIPING"))
    if held_hosts:
        problems.append(f"hosts still held: {held_hosts[:5]}")
    open_expected: set[str] = set()
    kept_infraenv: list[str] = []
    for tag, order in rec.orders.items():
        stuck = {v for v in victims if v.startswith(f"{order.name}-worker-")}
        infraenvs = final.infraenvs.get(order.key, [])
        if stuck:
            open_expected.add(cluster_workflow_id(order))
            open_expected.update(worker_workflow_id(order, name) for name in stuck)
            status = final.statuses.get(order.key)
            if status is None or not status.decommissioning or {w.name for w in status.workers} != stuck:
                problems.append(f"order {tag}: not decommissioning down to its stuck workers only")
            if len(infraenvs) > 1:
                problems.append(f"order {tag}: {len(infraenvs)} InfraEnvs")
            kept_infraenv += [f"{tag}:{i['metadata']['name']}" for i in infraenvs]
        else:
            if infraenvs:
                problems.append(f"order {tag}: InfraEnv left {[i['metadata']['name'] for i in infraenvs]}")
            if final.workflow_states.get(order.key) != WorkflowState.COMPLETED:
                problems.append(f"order {tag}: workflow {final.workflow_states.get(order.key)}")
    workflows = 0
    for runs in final.workflows.values():
        for wf_id, statuses in runs.items():
            workflows += 1
            if wf_id in open_expected:
                if statuses.count("RUNNING") != 1:
                    problems.append(f"{wf_id}: {statuses}")
            elif not set(statuses) <= CLOSED_OK or "COMPLETED" not in statuses:
                problems.append(f"{wf_id}: {statuses}")
    listed = {wf_id for runs in final.workflows.values() for wf_id in runs}
    if not open_expected <= listed:
        problems.append(f"expected open workflows not listed: {sorted(open_expected - listed)}")
    return Invariant(
        "decommission left nothing behind (only the quarantined hosts' workers)",
        not problems and rec.decommissioned,
        "; ".join(problems or [rec.decommission_detail if not rec.decommissioned else ""]).strip("; ")
        or f"0 BMIs, Agents, Machines, NodePool replicas beyond the {len(victims)} stuck;"
        f" {workflows - len(open_expected)} workflows closed (Completed), {len(open_expected)} open as"
        f" expected ({len(victims)} stuck workers + their order's); InfraEnv kept for the stuck order:"
        f" {kept_infraenv or 'none'}",
    )


def _plateaus(rec: SeedRecord) -> Invariant:
    expected = {Phase.SCALE_UP, Phase.SCALE_DOWN, Phase.SCALE_UP_MORE}
    missing = expected - {p.phase for p in rec.plateaus}
    failed = [p for p in rec.plateaus if not p.reached]
    shown = "; ".join(
        f"{p.phase.value} {p.order.split('/')[1]}={p.target} ({p.seconds:.0f}s)" for p in rec.plateaus
    )
    return Invariant(
        "at each plateau ready == desired",
        not failed and not missing,
        (f"missing phases {sorted(m.value for m in missing)}; " if missing else "")
        + (
            f"not reached: {[(p.phase.value, p.order, p.target, p.last) for p in failed]}"
            if failed
            else shown
        ),
    )


def _status_consistent(rec: SeedRecord) -> Invariant:
    failed = [c for c in rec.checks if not c.held]
    return Invariant(
        "ClusterOrder statuses consistent with the twins",
        bool(rec.checks) and not failed,
        f"{len(rec.checks)} checks (each plateau and the end): "
        + ("all held" if not failed else "; ".join(f"{c.when} {c.order}: {c.detail}" for c in failed[:3])),
    )


def _worker_died_only_when_killed(rec: SeedRecord) -> Invariant:
    """A running worker rides out everything but SIGKILL. A start that fails while Temporal is
    down (the worker fails fast by design) is restarted as a supervisor would, and shown."""
    exits, failed = rec.unexpected_exits, rec.failed_starts
    expected_starts = 1 + rec.kills + len(exits) + len(failed)
    starts = f"{rec.worker_starts} starts = 1 + {rec.kills} SIGKILLs" + (
        f" + {len(failed)} failed start(s) restarted ({'; '.join(failed)})" if failed else ""
    )
    return Invariant(
        "the running worker died only when killed",
        not exits and rec.worker_starts == expected_starts,
        f"a running worker exited on its own with codes {exits}; {starts}"
        if exits
        else f"{starts}: it rode out the Temporal restart, the 503s, the hub 500/409s and the watch cuts",
    )


def _no_healthy_host_taken_for_lost(rec: SeedRecord) -> Invariant:
    """No host breaks in a chaos run, so the Ready workers' host checks, made through the kills, the
    restarts and the 503s, must never tell a worker its host was lost (it would be released and
    wiped). They must have run, too."""
    checks = rec.final.host_checks if rec.final else 0
    told = rec.final.host_lost_signals if rec.final else []
    return Invariant(
        "no healthy host taken for lost",
        checks > 0 and not told,
        f"{checks} checks of the Ready workers' hosts; "
        + (f"workers told their host was lost: {told[:3]}" if told else "none told its host was lost"),
    )


def _chaos_applied(rec: SeedRecord) -> Invariant:
    """Not a promise of the product: proof that the run was as rough as it claims."""
    cfg = rec.config
    injected = rec.hub_faults.get("injectedErrors") or []
    cuts = int(rec.hub_faults.get("watchesCut") or 0)
    problems = []
    if rec.kills < cfg.total_kills:
        problems.append(f"{rec.kills} kills of {cfg.total_kills} planned")
    if rec.temporal_restarts != cfg.temporal_restarts:
        problems.append(f"{rec.temporal_restarts} Temporal restarts of {cfg.temporal_restarts}")
    if len(injected) < 3 or not (injected[0] and (injected[1] or injected[2])):
        problems.append(f"hub 409/500 injected {injected}")
    if rec.errors:
        problems.append("harness: " + "; ".join(rec.errors[:2]))
    evidence = (
        f"{rec.kills} SIGKILLs ({rec.worker_starts} worker starts), {rec.temporal_restarts} Temporal"
        f" restart(s), BMaaS 503 on {cfg.bmaas_error_rate:.0%} of {rec.bmaas_requests} calls with"
        f" {rec.latency_spikes} latency spikes, hub 409/500/500 injected {injected} and {cuts} watch cuts,"
        f" {rec.suppressed_boots} agent registration(s) suppressed"
    )
    return Invariant(
        "the chaos was applied", not problems, "; ".join(problems) + ("; " if problems else "") + evidence
    )
