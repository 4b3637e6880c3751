"""`osac-workers demo` (`make demo`): the product end to end on the embedded default.

`dev up`, then a tenant's ClusterOrder arrives through the hub API exactly as OSAC creates it
(3 x bm-standard, 1 x bm-gpu), and the controller and the workflows do the rest:
  1. every worker Ready (live progress),
  2. one named worker scaled down through the library/CLI path (signal, then the order's count),
  3. a node set scaled up by one (the order's numberOfNodes, the source of truth),
  4. the order deleted: the controller's finalizer decommissions and lets go once every host is
     wiped,
then a summary (time per phase, hosts allocated and wiped according to the BMaaS twin's audit log),
the Web UI URL and the kubectl and temporal commands to look around. Exits 0 only if every step
succeeded; stops the stack unless DEMO_KEEP=1.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.table import Table

from activities.kube import AGENTS, HubKube, dig
from contracts.refs import DNS_LABEL, OrderRef
from contracts.workflows import ClusterWorkersStatus, cluster_workflow_id
from lab import admin as lab_admin
from lab.fulfillment.seed import GPU_TYPE, RELEASE_IMAGE, STANDARD_TYPE
from lab.serve import ADMIN_TOKEN_FILE
from starter.api import WorkersApi
from starter.config import demo_policy
from starter.dev import (
    DEFAULT_STATE_DIR,
    TEMPORAL_NAMESPACE,
    DevError,
    DevOptions,
    Endpoints,
    StateDir,
    connect_local,
    down,
    up,
)
from starter.operations import OrderOperations
from starter.orders import HubOrders
from starter.render import follow, settled, status_feed

KEEP_ENV = "DEMO_KEEP"
INITIAL = {STANDARD_TYPE: 3, GPU_TYPE: 1}
PHASE_TIMEOUT = 150.0
# Stand-ins a tenant would send: the pull secret stays on the hub (only the workers' activities
# read it, to create the InfraEnv's Secret).
DEMO_PULL_SECRET = '{"auths": {"quay.io": {"auth": "ZGVtbzpub3QtYS1yZWFsLXNlY3JldA=="}}}'
DEMO_SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0wmN/Cr3JXqmLW7u+g9pTh+wyqDHpSQEIQczXkVx9q demo@osac"


class DemoFailed(Exception):
    pass


@dataclass
class PhaseResult:
    name: str
    seconds: float


@dataclass
class DemoReport:
    order: OrderRef
    phases: list[PhaseResult] = field(default_factory=list)
    allocated: dict[str, str] = field(default_factory=dict)  # BMI name -> host id
    wiped: dict[str, str] = field(default_factory=dict)


def order_body(order: OrderRef, node_sets: dict[str, int]) -> dict[str, Any]:
    """A ClusterOrder as OSAC's fulfillment service writes it for a tenant."""
    return {
        "metadata": {"name": order.name, "namespace": order.namespace},
        "spec": {
            "templateID": "ocp_4_18_small",
            "releaseImage": RELEASE_IMAGE,
            "pullSecret": DEMO_PULL_SECRET,
            "sshPublicKey": DEMO_SSH_KEY,
            "nodeRequests": [
                {"numberOfNodes": count, "bareMetal": {"instanceType": kind}}
                for kind, count in node_sets.items()
            ],
        },
    }


class Scenario:
    def __init__(self, state: StateDir, endpoints: Endpoints, console: Console, namespace: str) -> None:
        self.state = state
        self.endpoints = endpoints
        self.console = console
        self.order = OrderRef(namespace=namespace, name=f"demo-{secrets.token_hex(3)}")
        self.report = DemoReport(order=self.order)

    async def run(self) -> DemoReport:
        client = await connect_local(self.endpoints.temporal_address)
        kube = HubKube.from_kubeconfig(str(self.state.kubeconfig))
        token = (self.state.lab / ADMIN_TOKEN_FILE).read_text().strip()
        bmaas = httpx.AsyncClient(
            base_url=self.endpoints.fulfillment_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30.0,
        )
        try:
            # Queries and signals only: the controller starts the workflow with its own policy.
            api = WorkersApi(client, policy=demo_policy())
            await self._scenario(api, HubOrders(kube), OrderOperations(api, HubOrders(kube)), kube, bmaas)
        finally:
            await bmaas.aclose()
            await kube.close()
        return self.report

    async def _phase(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        self.console.rule(f"[bold]{name}")
        started = time.monotonic()
        await body()
        self.report.phases.append(PhaseResult(name, time.monotonic() - started))

    async def _until(
        self, api: WorkersApi, what: str, done: Callable[[ClusterWorkersStatus], bool]
    ) -> ClusterWorkersStatus:
        fetch = status_feed(api.status, self.order, self.console.print)
        status = await follow(fetch, done=done, timeout=PHASE_TIMEOUT, console=self.console)
        if status is None or not done(status):
            raise DemoFailed(f"{what}: not reached within {PHASE_TIMEOUT:.0f}s")
        return status

    async def _scenario(
        self,
        api: WorkersApi,
        orders: HubOrders,
        ops: OrderOperations,
        kube: HubKube,
        bmaas: httpx.AsyncClient,
    ) -> None:
        order = self.order

        def all_ready(count: int) -> Callable[[ClusterWorkersStatus], bool]:
            return lambda s: settled(s) and s.desired_workers == count and s.ready_workers == count

        async def create() -> None:
            await orders.ensure_namespace(order.namespace)
            await orders.create(order_body(order, INITIAL))
            wanted = ", ".join(f"{n} x {k}" for k, n in INITIAL.items())
            self.console.print(f"ClusterOrder {order.key} created on the hub ({wanted})")
            await self._until(api, "4 Ready workers", all_ready(sum(INITIAL.values())))

            async def published() -> bool:
                obj = await orders.get(order)
                return obj is not None and dig(obj, "status", "readyWorkers") == sum(INITIAL.values())

            await _eventually(published, "the ClusterOrder status shows 4 ready workers")
            self.console.print("status.workers[] on the ClusterOrder: 4 Ready")

        await self._phase("1. Order arrives: provision 3 x bm-standard + 1 x bm-gpu", create)

        async def scale_down() -> None:
            status = await api.status(order)
            standard = sorted(
                (w.name for w in status.workers if w.node_set == STANDARD_TYPE),
                key=lambda n: int(n.rsplit("-", 1)[1]),
            )
            victim = standard[len(standard) // 2]
            lowered = await ops.scale_down_worker(order, victim)
            self.console.print(f"scale-down {order.key} {victim}: {lowered.name} now {lowered.count}")
            await self._until(
                api,
                f"{victim} released",
                lambda s: all_ready(3)(s) and victim not in {w.name for w in s.workers},
            )

        await self._phase("2. Scale down one named worker", scale_down)

        async def scale_up() -> None:
            self.console.print(f"scale {order.key} --node-set {GPU_TYPE} --count 2")
            await ops.scale(order, GPU_TYPE, 2, timeout=PHASE_TIMEOUT)
            await self._until(api, "4 Ready workers again", all_ready(4))

        await self._phase(f"3. Scale {GPU_TYPE} up by one", scale_up)

        async def delete() -> None:
            await orders.delete(order)
            self.console.print(
                f"ClusterOrder {order.key} deleted; the controller's finalizer decommissions it"
            )
            await self._until(api, "decommissioned", lambda s: s.finished)

            async def gone() -> bool:
                return await orders.get(order) is None

            await _eventually(gone, "the ClusterOrder to be gone (finalizer removed)")
            self.console.print("every host wiped and released; finalizer removed; ClusterOrder gone")

        await self._phase("4. Delete the order (decommission)", delete)
        await self._check(kube, bmaas)

    async def _check(self, kube: HubKube, bmaas: httpx.AsyncClient) -> None:
        order = self.order
        prefix = f"{order.name}-worker-"
        listing = await bmaas.get(
            "/api/private/v1/baremetal_instances",
            params={"filter": f"this.metadata.labels['osac.openshift.io/cluster-order'] == '{order.name}'"},
        )
        listing.raise_for_status()
        if listing.json().get("items"):
            raise DemoFailed("BMIs of the order are left on BMaaS")
        agents = await kube.list(
            AGENTS, order.namespace, label_selector=f"osac.openshift.io/clusterorder={order.name}"
        )
        if agents.items:
            raise DemoFailed("Agents of the order are left on the hub")
        for record in await lab_admin.audit(bmaas):
            name = str(record.get("bmi_name") or "")
            if not name.startswith(prefix):
                continue
            if record["kind"] == "HOST_ALLOCATED":
                self.report.allocated[name] = str(record.get("host_id"))
            elif record["kind"] == "WIPE_FINISHED":
                self.report.wiped[name] = str(record.get("host_id"))
        violations = await lab_admin.audit_violations(bmaas)
        if violations:
            raise DemoFailed(f"the BMaaS audit found violations: {violations}")
        unwiped = sorted(set(self.report.allocated) - set(self.report.wiped))
        if unwiped or not self.report.allocated:
            raise DemoFailed(f"hosts allocated but not wiped: {unwiped or 'no allocation recorded'}")


async def _eventually(
    probe: Callable[[], Awaitable[bool]], what: str, timeout: float = PHASE_TIMEOUT
) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


def print_summary(
    console: Console, report: DemoReport, endpoints: Endpoints, state_dir: Path, keep: bool
) -> None:
    order = report.order
    table = Table(title="Demo summary", title_justify="left")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for phase in report.phases:
        table.add_row(phase.name, f"{phase.seconds:.1f}")
    table.add_row("total", f"{sum(p.seconds for p in report.phases):.1f}")
    console.print(table)
    console.print(
        f"Hosts allocated: {len(report.allocated)}, wiped and released: {len(report.wiped)}"
        f" (BMaaS twin audit log; BMIs {', '.join(sorted(report.allocated, key=_index))})"
    )
    state = StateDir(state_dir)
    temporal = str(Path(sys.executable).parent / "temporal")
    address = f"--address {endpoints.temporal_address}"
    query = quote(f'OsacClusterOrder="{order.key}"')
    console.print(
        "\n[bold]Look around[/]" + ("" if keep else " (run with DEMO_KEEP=1 to keep the stack up for these)")
    )
    kubectl = f"kubectl --kubeconfig {state.kubeconfig}"
    by_order = f"OsacClusterOrder='{order.key}'"
    lines = [
        f"Web UI:   {endpoints.temporal_ui_url}/namespaces/{TEMPORAL_NAMESPACE}/workflows?query={query}",
        f"{kubectl} get clusterorders,infraenvs,agents,nodepools -n {order.namespace}",
        f"{kubectl} get events -n {order.namespace} --sort-by=.lastTimestamp",
        f'{temporal} workflow list {address} --query "{by_order}"',
        f"{temporal} workflow list {address} --query \"{by_order} AND OsacNodeSet='{GPU_TYPE}'\"",
        f"{temporal} workflow show {address} --workflow-id {cluster_workflow_id(order)}",
    ]
    for line in lines:
        console.print(f"  {line}", highlight=False, soft_wrap=True)
    if keep:
        console.print(
            f"\nThe stack is still up ({KEEP_ENV}=1);"
            f" stop it with: osac-workers dev down --state-dir {state_dir}"
        )


def _index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def demo_command(
    state_dir: Path = typer.Option(DEFAULT_STATE_DIR, "--state-dir", help="The dev stack's state dir."),
    namespace: str = typer.Option("demo", "--namespace", help="Hub namespace of the demo order."),
    free_ports: bool = typer.Option(
        False, "--free-ports", help="Any free ports instead of 7233/8233/8100/8101."
    ),
) -> None:
    """Run the end-to-end demo on the embedded default (stops the stack unless DEMO_KEEP=1)."""
    if not re.fullmatch(DNS_LABEL, namespace):  # refused before a stack is started for nothing
        raise typer.BadParameter(f"{namespace!r} is not a DNS label", param_hint="'--namespace'")
    console = Console(soft_wrap=True)
    keep = os.environ.get(KEEP_ENV) == "1"
    options = DevOptions(state_dir=state_dir)
    if free_ports:
        options = options.model_copy(
            update={"temporal_port": 0, "ui_port": 0, "fulfillment_port": 0, "hub_port": 0}
        )
    started = time.monotonic()
    failure: str | None = None
    try:
        console.rule("[bold]0. dev up")
        endpoints = asyncio.run(up(options, console.print))
        console.print(f"stack up in {time.monotonic() - started:.1f}s; Web UI {endpoints.temporal_ui_url}")
        report = asyncio.run(Scenario(StateDir(state_dir), endpoints, console, namespace).run())
        print_summary(console, report, endpoints, state_dir, keep)
    except (DevError, DemoFailed) as err:
        failure = str(err)
    except Exception as err:  # any other failure still stops the stack and exits non-zero
        failure = f"{type(err).__name__}: {err}"
    finally:
        if not keep:
            console.rule("[bold]dev down")
            down(state_dir, echo=console.print)
    if failure is not None:
        console.print(f"[bold red]demo failed:[/] {failure}", highlight=False)
        if keep:
            console.print(f"logs: {StateDir(state_dir).path}/*.log")
        raise typer.Exit(1)
    console.print(f"[bold green]demo succeeded[/] in {time.monotonic() - started:.0f}s")
