"""One seed of the chaos scenario: two orders scaled up, one down, the other up, both decommissioned,
while the worker is SIGKILLed, Temporal restarts and both twins misbehave. It records what it saw;
`bench.chaos.invariants` judges it.

Phases: each sends its command, plays its planned disruptions (at seeded moments after the
command), then waits for the phase's settled state. Wipe failures: before order A's scale-down the
harness predicts its victims from the documented victim order (Ready, newest first) and makes the
wipes of `wipe_failures` of their hosts fail. Those workers stay Deleting (HostWipeStuck) and their
BMIs DELETING for good, by design; they are the expected, surfaced outcome, never a leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from bench.chaos.config import (
    CHAOS_BMAAS_TIMINGS,
    INSTANCE_TYPE,
    ChaosConfig,
    ChaosPlan,
    Phase,
    chaos_policy,
    make_plan,
)
from bench.chaos.processes import TemporalDevServer, WorkerProcess
from bench.chaos.twins import AGENTS, INFRA_ENVS, MACHINES, NODE_POOLS, Obj, Twins, pick
from contracts.activities import BmaasActivity
from contracts.refs import OrderRef
from contracts.worker import FailureReason, WorkerPhase, WorkerStatus
from contracts.workflows import (
    ClusterWorkersStatus,
    NodeSetRequest,
    cluster_workflow_id,
    worker_workflow_id,
)
from lab.hub_controllers.agent_boot import BootOutcome
from starter.api import CommandError, StatusUnanswered, WorkflowState
from tests.workflows.stack import INSTANCE_TYPES, Stack, running_stack
from workflows.cluster_workers import ClusterWorkersWorkflow

T = TypeVar("T")
Log = Callable[[str], None]

TRANSIENT_RPC = {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}
CONSISTENCY_DEADLINE_S = 180.0  # the coalesced status write, retried through hub 500s
POLL_S = 0.5


def state_is(bmi: Obj, state: str) -> bool:
    return str((bmi.get("status") or {}).get("state") or "").endswith(state)


@dataclass
class Plateau:
    phase: Phase
    order: str
    target: int
    reached: bool
    seconds: float
    last: str  # the last status seen (evidence, or why it was not reached)


@dataclass
class Consistency:
    when: str
    order: str
    held: bool
    detail: str


@dataclass
class FinalState:
    bmis: list[Obj]
    hosts: list[Obj]
    agents: dict[str, list[Obj]]
    machines: dict[str, list[Obj]]
    infraenvs: dict[str, list[Obj]]
    nodepools: dict[str, list[Obj]]
    workflows: dict[str, dict[str, list[str]]]  # order key -> workflow id -> statuses of its runs
    statuses: dict[str, ClusterWorkersStatus | None]
    orders: dict[str, Obj]
    workflow_states: dict[str, WorkflowState]
    # From the cluster workflows' histories: checks of the Ready workers' hosts made, and the
    # workers told their host was lost (no host breaks in a chaos run: each is a false alarm).
    host_checks: int = 0
    host_lost_signals: list[str] = field(default_factory=list)


@dataclass
class SeedRecord:
    config: ChaosConfig
    plan: ChaosPlan
    orders: dict[str, OrderRef] = field(default_factory=dict)  # "A"/"B" -> order
    kills: int = 0
    unexpected_exits: list[int] = field(default_factory=list)
    failed_starts: list[str] = field(default_factory=list)
    worker_starts: int = 0
    temporal_restarts: int = 0
    latency_spikes: int = 0
    plateaus: list[Plateau] = field(default_factory=list)
    checks: list[Consistency] = field(default_factory=list)
    wipe_victim_hosts: list[str] = field(default_factory=list)
    wipe_victim_workers: list[str] = field(default_factory=list)
    stuck_seen: dict[str, WorkerStatus] = field(default_factory=dict)  # worker -> its stuck status
    decommissioned: bool = False
    decommission_detail: str = ""
    phase_seconds: dict[str, float] = field(default_factory=dict)
    audit: list[Obj] = field(default_factory=list)
    audit_violations: list[str] = field(default_factory=list)
    hub_faults: Obj = field(default_factory=dict)
    suppressed_boots: int = 0
    bmaas_requests: int = 0
    final: FinalState | None = None
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _transient(err: BaseException) -> bool:
    """Temporal restarting, or no worker to answer (killed): worth another try."""
    if isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        return True
    if isinstance(err, RPCError):
        return err.status in TRANSIENT_RPC
    return isinstance(err, StatusUnanswered)  # a query nobody answered (a killed worker)


async def retry_rpc(call: Callable[[], Awaitable[T]], what: str, deadline_s: float) -> T:
    """Temporal calls across a server restart or a dead worker: retried while transient."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await call()
        except (RPCError, CommandError, WorkflowUpdateRPCTimeoutOrCancelledError) as err:
            if not _transient(err):
                raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: Temporal kept failing for {deadline_s:.0f}s") from err
        await asyncio.sleep(1.0)


class ChaosRun:
    def __init__(
        self,
        config: ChaosConfig,
        plan: ChaosPlan,
        stack: Stack,
        twins: Twins,
        server: TemporalDevServer,
        worker: WorkerProcess,
        log: Log,
    ) -> None:
        self.config, self.plan, self.stack, self.twins = config, plan, stack, twins
        self.server, self.worker = server, worker
        self.record = SeedRecord(config, plan)
        self._log = log
        self._t0 = time.monotonic()

    def log(self, message: str) -> None:
        self._log(f"  [{time.monotonic() - self._t0:6.1f}s] {message}")

    # ------------------------------------------------------------------------------ the scenario

    async def run(self) -> SeedRecord:
        cfg, stack = self.config, self.stack
        a = await stack.create_order({INSTANCE_TYPE: cfg.workers_a})
        b = await stack.create_order({INSTANCE_TYPE: cfg.workers_b})
        self.record.orders = {"A": a, "B": b}
        self.log(f"orders A={a.key} B={b.key}; plan: {self.plan.describe()}")
        await self.twins.arm(cfg, self.plan)
        spikes = asyncio.create_task(self._latency_spikes())
        monitor = asyncio.create_task(self._watch_worker())
        try:
            await self._phase(
                Phase.SCALE_UP,
                lambda: self._apply_both(a, b),
                {a: cfg.workers_a, b: cfg.workers_b},
            )
            await self._choose_wipe_victims(a)
            await self._phase(
                Phase.SCALE_DOWN,
                lambda: self._set_count(a, cfg.scale_down_a_to, "scale-down"),
                {a: cfg.scale_down_a_to, b: cfg.workers_b},
            )
            await self._phase(
                Phase.SCALE_UP_MORE,
                lambda: self._set_count(b, cfg.workers_b + cfg.scale_up_b_by, "scale-up-more"),
                {a: cfg.scale_down_a_to, b: cfg.workers_b + cfg.scale_up_b_by},
            )
            await self._phase(Phase.DECOMMISSION, lambda: self._decommission_both(a, b), {})
        finally:
            for task in (spikes, monitor):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.record.hub_faults = await self.twins.hub_fault_status()  # disarming resets its counters
        await self.twins.disarm()
        self.log("faults disarmed; collecting the final state")
        await self._collect(a, b)
        self.record.kills, self.record.worker_starts = self.worker.kills, self.worker.starts
        self.record.unexpected_exits = list(self.worker.unexpected_exits)
        self.record.failed_starts = list(self.worker.failed_starts)
        self.record.temporal_restarts = self.server.restarts
        return self.record

    async def _watch_worker(self) -> None:
        """The worker must only die when we kill it: a Temporal restart or a flaky backend is no
        reason to exit. If it does, it is recorded (an invariant fails) and started again."""
        while True:
            what = self.worker.restart_if_dead()
            if what:
                self.log(f"{what}; started again")
            await asyncio.sleep(0.5)

    async def _phase(
        self, phase: Phase, command: Callable[[], Coroutine[Any, Any, None]], targets: dict[OrderRef, int]
    ) -> None:
        started = time.monotonic()
        self.log(
            f"{phase.value}: " + (", ".join(f"{o.name}->{n}" for o, n in targets.items()) or "decommission")
        )
        sent = asyncio.create_task(command())
        await self._disrupt(phase, started)
        try:
            await asyncio.wait_for(sent, self.config.phase_deadline_s)
        except Exception as err:  # recorded: the invariants show what did not converge
            self.record.errors.append(f"{phase.value}: the command did not complete: {err!r}")
            self.log(f"{phase.value}: command failed: {err!r}")
        if phase == Phase.DECOMMISSION:
            await self._wait_decommissioned()
        else:
            await asyncio.gather(*(self._wait_plateau(phase, order, n) for order, n in targets.items()))
            await asyncio.gather(*(self._check_consistency(phase.value, order) for order in targets))
            if phase == Phase.SCALE_DOWN:
                await self._wait_stuck_surfaced(next(iter(targets)))
        self.record.phase_seconds[phase.value] = time.monotonic() - started
        self.log(f"{phase.value}: settled after {time.monotonic() - started:.1f}s")

    async def _disrupt(self, phase: Phase, started: float) -> None:
        for event in self.plan.disruptions.get(phase, []):
            await asyncio.sleep(max(0.0, started + event.at_s - time.monotonic()))
            if event.kind == "kill":
                self.worker.kill()
                self.log(f"SIGKILL worker (kill {self.worker.kills}); down for {event.restart_after_s}s")
                await asyncio.sleep(event.restart_after_s)
                self.worker.start()
            else:
                self.log("restarting the Temporal dev server (database file kept)")
                await self.server.restart()
                self.log(f"Temporal back on {self.server.address}")

    async def _latency_spikes(self) -> None:
        for spike in self.plan.spikes:
            await asyncio.sleep(spike.after_s)
            await self.twins.set_latency(self.config.bmaas_latency_spike_s)
            self.record.latency_spikes += 1
            await asyncio.sleep(spike.lasts_s)
            await self.twins.set_latency(0.0)

    # -------------------------------------------------------------------------------- commands

    async def _apply_both(self, a: OrderRef, b: OrderRef) -> None:
        for order, count in ((a, self.config.workers_a), (b, self.config.workers_b)):
            sets = [NodeSetRequest(name=INSTANCE_TYPE, instance_type=INSTANCE_TYPE, count=count)]

            async def apply(order: OrderRef = order, sets: list[NodeSetRequest] = sets) -> Any:
                return await self.stack.api.apply(
                    order, sets, instance_types=INSTANCE_TYPES, update_id=f"chaos-apply-{order.name}"
                )

            await retry_rpc(apply, f"apply {order.key}", self.config.phase_deadline_s)

    async def _set_count(self, order: OrderRef, count: int, label: str) -> None:
        async def scale() -> Any:
            # A deliberate mass scale-down: confirmed, as the guard requires (issue §3). Setting a
            # count is idempotent, so a retry after a lost answer changes nothing.
            return await self.stack.api.scale(order, INSTANCE_TYPE, count, confirm_scale_down=True)

        await retry_rpc(scale, f"{label} {order.key}", self.config.phase_deadline_s)

    async def _decommission_both(self, a: OrderRef, b: OrderRef) -> None:
        for order in (a, b):
            handle = self.stack.api.handle(order)

            async def decommission(handle: Any = handle) -> Any:
                # One update id: a retry after a restart is answered, not rejected as a repeat.
                return await handle.execute_update(
                    ClusterWorkersWorkflow.decommission, id="chaos-decommission"
                )

            await retry_rpc(decommission, f"decommission {order.key}", self.config.phase_deadline_s)

    # --------------------------------------------------------------------------------- waiting

    async def _status(self, order: OrderRef) -> ClusterWorkersStatus | None:
        try:
            return await self.stack.api.status(order)
        except (CommandError, RPCError):  # no worker answered (killed) or Temporal restarting
            return None

    async def _wait(self, probe: Callable[[], Awaitable[str | None]], deadline_s: float) -> tuple[bool, str]:
        """Poll until `probe` answers None (done); returns (done, last answer)."""
        deadline = time.monotonic() + deadline_s
        last = "never looked"
        while time.monotonic() < deadline:
            answer = await probe()
            if answer is None:
                return True, "ok"
            last = answer
            await asyncio.sleep(POLL_S)
        return False, last

    def _stuck_names(self, order: OrderRef) -> set[str]:
        return {w for w in self.record.wipe_victim_workers if w.startswith(f"{order.name}-worker-")}

    async def _wait_plateau(self, phase: Phase, order: OrderRef, target: int) -> None:
        started = time.monotonic()
        stuck = self._stuck_names(order) if phase != Phase.SCALE_UP else set()
        seen = ""

        async def probe() -> str | None:
            nonlocal seen
            status = await self._status(order)
            if status is None:
                return seen or "no status answer"
            others = sorted(
                f"{w.name}:{w.phase.value}"
                for w in status.workers
                if w.phase != WorkerPhase.READY and not (w.name in stuck and w.phase == WorkerPhase.DELETING)
            )
            seen = (
                f"desired={status.desired_workers} current={status.current_workers}"
                f" ready={status.ready_workers} not-ready={others[:6]}{'...' if len(others) > 6 else ''}"
            )
            counts = (status.desired_workers, status.current_workers, status.ready_workers)
            return None if counts == (target, target, target) and not others else seen

        reached, last = await self._wait(probe, self.config.phase_deadline_s)
        seconds = time.monotonic() - started
        self.record.plateaus.append(
            Plateau(phase, order.key, target, reached, seconds, seen if reached else last)
        )
        self.log(
            f"{phase.value}: {order.name} {'reached' if reached else 'DID NOT reach'} {target} ready ({seen})"
        )

    async def _check_consistency(self, when: str, order: OrderRef) -> None:
        """The ClusterOrder status equals the workflow's, and the twins hold exactly what it says."""
        stuck = self._stuck_names(order)

        async def probe() -> str | None:
            status = await self._status(order)
            if status is None:
                return "no status answer"
            return await self._mismatch(order, status, stuck)

        held, detail = await self._wait(probe, CONSISTENCY_DEADLINE_S)
        if held:
            status = await self._status(order)
            ready = status.ready_workers if status else "?"
            detail = (
                f"ClusterOrder status == workflow status; {ready} RUNNING BMIs, Agents, Machines and"
                f" NodePool replicas match" + (f"; {len(stuck)} stuck BMI(s) DELETING" if stuck else "")
            )
        self.record.checks.append(Consistency(when, order.key, held, detail))

    async def _mismatch(self, order: OrderRef, status: ClusterWorkersStatus, stuck: set[str]) -> str | None:
        obj = await self.twins.cluster_order(order)
        published = obj.get("status") or {}
        for key, value in (
            ("desiredWorkers", status.desired_workers),
            ("currentWorkers", status.current_workers),
            ("readyWorkers", status.ready_workers),
        ):
            if published.get(key) != value:
                return f"ClusterOrder {key}={published.get(key)} but the workflow says {value}"

        def row(w: Obj) -> tuple[Any, ...]:
            return (w.get("name"), w.get("phase"), w.get("resourceID"), w.get("lastFailureReason"))

        ours = sorted(row(w.osac_item()) for w in status.workers)
        theirs = sorted(row(w) for w in published.get("workers") or [])
        if ours != theirs:
            return f"ClusterOrder workers[] {theirs[:3]}... differ from the workflow's {ours[:3]}..."
        bmis = {b["id"]: b for b in await self.twins.bmis(order)}
        for worker in status.workers:
            bmi = bmis.pop(worker.resource_id or "", None)
            if bmi is None:
                return f"worker {worker.name} names BMI {worker.resource_id}, which the twin does not have"
            if bmi["metadata"]["name"] != worker.name:
                return f"BMI {bmi['id']} is named {bmi['metadata']['name']}, not {worker.name}"
            want = "RUNNING" if worker.phase == WorkerPhase.READY else "DELETING"
            if not state_is(bmi, want):
                return f"BMI of {worker.name} ({worker.phase.value}) is {bmi['status'].get('state')}"
        if bmis:
            orphans = sorted(b["metadata"]["name"] for b in bmis.values())
            return f"BMIs of the order that no worker names: {orphans}"
        ready = status.ready_workers
        agents = await self.twins.hub_items(AGENTS, order.namespace)
        machines = await self.twins.hub_items(MACHINES, order.namespace)
        if len(agents) != ready or len(machines) != ready:
            return f"{len(agents)} Agents and {len(machines)} Machines for {ready} Ready workers"
        pools = await self.twins.hub_items(NODE_POOLS, order.namespace)
        replicas = sum(int((p.get("spec") or {}).get("replicas") or 0) for p in pools)
        if replicas != ready:
            return f"NodePool replicas {replicas} for {ready} Ready workers"
        return None

    async def _choose_wipe_victims(self, a: OrderRef) -> None:
        """The hosts whose wipe will fail: among the workers the scale-down will release."""
        status = await retry_rpc(lambda: self.stack.api.status(a), "status", 120)
        removed = len(status.workers) - self.config.scale_down_a_to
        # Victims are Ready workers, newest (highest index) first: workflows/cluster_workers.py.
        newest = sorted(status.workers, key=lambda w: int(w.name.rsplit("-", 1)[1]), reverse=True)[:removed]
        chosen = pick(self.plan.victim_pick, [w.name for w in newest], self.config.wipe_failures)
        bmi_of = {w.name: w.resource_id for w in status.workers}
        host_of = {h.get("bmi_id"): h["id"] for h in await self.twins.hosts() if h.get("bmi_id")}
        hosts = [host_of[bmi_of[name]] for name in chosen]
        await self.twins.fail_wipes_of(hosts)
        self.record.wipe_victim_workers, self.record.wipe_victim_hosts = chosen, hosts
        self.log(
            f"wipes will fail for {', '.join(f'{w} on {h}' for w, h in zip(chosen, hosts, strict=True))}"
        )

    async def _wait_stuck_surfaced(self, a: OrderRef) -> None:
        stuck = self._stuck_names(a)

        async def probe() -> str | None:
            status = await self._status(a)
            if status is None:
                return "no status answer"
            found = {
                w.name: w
                for w in status.workers
                if w.name in stuck
                and w.phase == WorkerPhase.DELETING
                and w.last_failure_reason == FailureReason.HOST_WIPE_STUCK
            }
            if set(found) == stuck:
                self.record.stuck_seen.update(found)
                return None
            return f"HostWipeStuck shown for {sorted(found)} of {sorted(stuck)}"

        done, last = await self._wait(probe, self.config.phase_deadline_s)
        if not done:
            self.record.errors.append(f"wipe failures not surfaced: {last}")

    async def _wait_decommissioned(self) -> None:
        """B completes; A completes too unless it holds a stuck worker, then only those remain."""

        async def probe() -> str | None:
            for order in self.record.orders.values():
                stuck = self._stuck_names(order)
                state = await self.stack.api.workflow_state(order)
                if not stuck:
                    if state != WorkflowState.COMPLETED:
                        return f"{order.name}: workflow {state.value}"
                    continue
                status = await self._status(order)
                if status is None:
                    return f"{order.name}: no status answer"
                left = {w.name for w in status.workers}
                if not status.decommissioning or left != stuck:
                    return f"{order.name}: workers left {sorted(left)}, expected only {sorted(stuck)}"
            return None

        done, last = await self._wait(probe, self.config.phase_deadline_s)
        self.record.decommissioned, self.record.decommission_detail = done, last
        if not done:
            self.record.errors.append(f"decommission did not settle: {last}")

    # ------------------------------------------------------------------------------- evidence

    async def _collect(self, a: OrderRef, b: OrderRef) -> None:
        rec = self.record
        for order in (a, b):
            await self._check_consistency("final", order)
        rec.audit = await self.twins.audit()
        rec.audit_violations = await self.twins.audit_violations()
        rec.suppressed_boots = sum(
            1 for r in list(self.stack.lab.boot_seam.records) if r.outcome == BootOutcome.SUPPRESSED
        )
        stats = await self.twins.bmaas.get("/lab/v1/stats")
        rec.bmaas_requests = int(stats.json().get("total", 0))
        orders = {o.key: o for o in (a, b)}
        expected_open = await self._expected_open(a, b)
        workflows = await self._settled_workflows(orders, expected_open)
        rec.final = FinalState(
            bmis=await self.twins.bmis(),
            hosts=await self.twins.hosts(),
            agents={k: await self.twins.hub_items(AGENTS, o.namespace) for k, o in orders.items()},
            machines={k: await self.twins.hub_items(MACHINES, o.namespace) for k, o in orders.items()},
            infraenvs={k: await self.twins.hub_items(INFRA_ENVS, o.namespace) for k, o in orders.items()},
            nodepools={k: await self.twins.hub_items(NODE_POOLS, o.namespace) for k, o in orders.items()},
            workflows=workflows,
            statuses={k: await self._status(o) for k, o in orders.items()},
            orders={k: await self.twins.cluster_order(o) for k, o in orders.items()},
            workflow_states={k: await self.stack.api.workflow_state(o) for k, o in orders.items()},
        )
        await self._collect_host_checks(orders)

    async def _collect_host_checks(self, orders: dict[str, OrderRef]) -> None:
        assert self.record.final is not None
        client: Client = self.stack.client
        for key in orders:
            query = f"OsacClusterOrder = '{key}' AND WorkflowType = 'ClusterWorkersWorkflow'"
            async for wf in client.list_workflows(query):
                history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
                for event in history.events:
                    if event.HasField("activity_task_scheduled_event_attributes"):
                        name = event.activity_task_scheduled_event_attributes.activity_type.name
                        self.record.final.host_checks += name == BmaasActivity.FIND_LOST_INSTANCES
                    if event.HasField("signal_external_workflow_execution_initiated_event_attributes"):
                        signal = event.signal_external_workflow_execution_initiated_event_attributes
                        if signal.signal_name == "host_lost":
                            self.record.final.host_lost_signals.append(signal.workflow_execution.workflow_id)

    async def _expected_open(self, a: OrderRef, b: OrderRef) -> set[str]:
        open_ids: set[str] = set()
        for order in (a, b):
            stuck = self._stuck_names(order)
            if stuck:
                open_ids.add(cluster_workflow_id(order))
                open_ids.update(worker_workflow_id(order, name) for name in stuck)
        return open_ids

    async def _settled_workflows(
        self, orders: dict[str, OrderRef], expected_open: set[str]
    ) -> dict[str, dict[str, list[str]]]:
        """Every run of every workflow of the orders, by search attribute, once visibility caught
        up (only the expected ones still running), or the last listing at the deadline."""
        client: Client = self.stack.client
        result: dict[str, dict[str, list[str]]] = {}

        async def probe() -> str | None:
            result.clear()
            for key in orders:
                runs: dict[str, list[str]] = {}
                async for wf in client.list_workflows(f"OsacClusterOrder = '{key}'"):
                    runs.setdefault(wf.id, []).append(wf.status.name if wf.status else "UNKNOWN")
                result[key] = runs
            running = {i for runs in result.values() for i, s in runs.items() if "RUNNING" in s}
            return None if running == expected_open else f"running {sorted(running)[:4]}"

        await self._wait(probe, 60)
        return result


def _twin_logs_to(path: Path) -> None:
    """The twins' uvicorn servers log to stderr (a killed worker's dropped request is a traceback
    there): into the seed's work directory instead, so the output is the run and its invariants."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)


async def run_seed(config: ChaosConfig, seed: int, workdir: Path, log: Log) -> SeedRecord:
    """Everything of one seed in `workdir`: its own Temporal server, twins and worker process."""
    plan = make_plan(config, seed)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    started = time.monotonic()
    server = TemporalDevServer(workdir)
    await server.start()
    try:
        client = await server.client()
        async with running_stack(
            client,
            workdir,
            hosts=config.hosts,
            policy=chaos_policy(config),
            bmaas_timings=CHAOS_BMAAS_TIMINGS,
            in_process_worker=False,
        ) as stack:
            _twin_logs_to(workdir / "twins.log")
            worker = WorkerProcess(
                stack.settings, server.address, workdir / "worker.log", config.sticky_queue_timeout_s
            )
            twins = Twins(stack)
            worker.start()
            run = ChaosRun(config, plan, stack, twins, server, worker, log)
            try:
                record = await run.run()
            except Exception as err:
                run.record.errors.append(f"the harness failed: {err!r}")
                record = run.record
                record.kills, record.worker_starts = worker.kills, worker.starts
                record.unexpected_exits = list(worker.unexpected_exits)
                record.failed_starts = list(worker.failed_starts)
                record.temporal_restarts = server.restarts
            finally:
                await asyncio.to_thread(worker.stop)
                await twins.aclose()
    finally:
        await asyncio.to_thread(server.stop)
    record.seconds = time.monotonic() - started
    return record
