"""One measured stack: the twins process with a delay profile, and the worker as a real process
(`osac-workers worker`, configured by environment like in production), driven through the library
API (`starter.api.WorkersApi`) on the run's dev server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from bench.twins import BENCH_USER, TwinsInfo, TwinsProcess
from contracts.refs import OrderRef
from contracts.worker import TimingPolicy
from contracts.workflows import DEFAULT_MAX_WORKERS_PER_ORDER, NodeSetRequest
from lab import admin as lab_admin
from lab.hub.testing import CONTROLLER_USER
from starter.api import WorkersApi

T = TypeVar("T")

INSTANCE_TYPE = "bm-standard"
RELEASE_IMAGE = "quay.io/openshift-release-dev/ocp-release:4.18.0-x86_64"
PULL_SECRET = json.dumps({"auths": {"quay.io": {"auth": "YmVuY2g6bm90LWEtc2VjcmV0"}}})
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHr0ks3jOM2Yz0gK1cM9Yc9l7Wq9d4m2b0F5tJd4Vx0e bench@osac"
CLUSTER_ORDERS = "/apis/osac.openshift.io/v1alpha1"

# Samples the worker for --flamegraphs; installed by the `bench` extra.
PY_SPY = Path(sys.executable).parent / "py-spy"


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, timeout: float, interval: float = 0.25
) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")


def split(total: int, per_order: int = DEFAULT_MAX_WORKERS_PER_ORDER) -> list[int]:
    """Workers per order: orders of at most `per_order` (the product's per-order maximum)."""
    sizes = [per_order] * (total // per_order)
    if total % per_order:
        sizes.append(total % per_order)
    return sizes


@dataclass
class Order:
    ref: OrderRef
    workers: int


class BenchStack:
    def __init__(
        self,
        client: Client,
        info: TwinsInfo,
        twins: TwinsProcess,
        workers: list[subprocess.Popen[bytes]],
        task_queue: str,
        bmaas_task_queue: str,
        policy: TimingPolicy | None = None,
    ) -> None:
        self.client = client
        self.info = info
        self.twins = twins
        self.workers = workers
        self.task_queue = task_queue
        self.bmaas_task_queue = bmaas_task_queue
        self.api = WorkersApi(
            client, task_queue=task_queue, bmaas_task_queue=bmaas_task_queue, policy=policy or TimingPolicy()
        )
        self.hub = httpx.AsyncClient(
            base_url=info.hub_url, headers={"Authorization": f"Bearer {info.bench_token}"}, timeout=60.0
        )
        self.bmaas = httpx.AsyncClient(
            base_url=info.fulfillment_url,
            headers={"Authorization": f"Bearer {info.admin_token}"},
            timeout=60.0,
        )

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    # -- orders -----------------------------------------------------------------------------------

    async def create_orders(self, total: int) -> list[Order]:
        """ClusterOrders for `total` workers, each with its hosted cluster provisioned (not timed)."""
        orders = [Order(await self._create_order(count), count) for count in split(total)]
        for order in orders:
            await eventually(
                lambda order=order: self._cluster_ready(order.ref),  # type: ignore[misc]
                f"the hosted cluster of {order.ref.key}",
                timeout=120,
            )
        return orders

    async def _create_order(self, count: int) -> OrderRef:
        ref = OrderRef(namespace=f"b-{uuid.uuid4().hex[:8]}", name=f"o{uuid.uuid4().hex[:8]}")
        namespace = {"metadata": {"name": ref.namespace}}
        (await self.hub.post("/api/v1/namespaces", json=namespace)).raise_for_status()
        body = {
            "apiVersion": "osac.openshift.io/v1alpha1",
            "kind": "ClusterOrder",
            "metadata": {"name": ref.name, "namespace": ref.namespace},
            "spec": {
                "templateID": "ocp_4_18_small",
                "releaseImage": RELEASE_IMAGE,
                "pullSecret": PULL_SECRET,
                "sshPublicKey": SSH_KEY,
                "nodeRequests": [{"numberOfNodes": count, "bareMetal": {"instanceType": INSTANCE_TYPE}}],
            },
        }
        path = f"{CLUSTER_ORDERS}/namespaces/{ref.namespace}/clusterorders"
        (await self.hub.post(path, json=body)).raise_for_status()
        return ref

    async def _order_status(self, ref: OrderRef) -> dict[str, Any]:
        path = f"{CLUSTER_ORDERS}/namespaces/{ref.namespace}/clusterorders/{ref.name}"
        response = await self.hub.get(path)
        response.raise_for_status()
        status = response.json().get("status")
        return status if isinstance(status, dict) else {}

    async def _cluster_ready(self, ref: OrderRef) -> bool:
        return bool((await self._order_status(ref)).get("clusterReference"))

    async def apply(self, orders: list[Order]) -> None:
        await asyncio.gather(
            *(
                self.api.apply(
                    o.ref,
                    [NodeSetRequest(name=INSTANCE_TYPE, instance_type=INSTANCE_TYPE, count=o.workers)],
                    instance_types=(INSTANCE_TYPE,),
                )
                for o in orders
            )
        )

    async def wait_ready(self, orders: list[Order], timeout: float) -> None:
        """Until every order's ClusterOrder shows all its workers Ready, as the tenant sees it. Read
        from the hub (the harness's requests are not counted), not queried from the workflows: a
        query is answered by the worker under test, and polling it would load what is measured."""
        wanted = sum(o.workers for o in orders)
        seen = {"ready": 0}

        async def all_ready() -> bool:
            ready = current = 0
            for order in orders:
                try:
                    status = await self._order_status(order.ref)
                except httpx.HTTPError:  # a busy hub twin answering late or with 5xx: ask again
                    return False
                ready += min(int(status.get("readyWorkers") or 0), order.workers)
                current += int(status.get("currentWorkers") or 0)
            seen["ready"] = ready
            return ready == wanted and current == wanted

        try:
            await eventually(all_ready, f"{wanted} Ready workers", timeout, 0.5)
        except TimeoutError as err:
            raise TimeoutError(f"{err}; {seen['ready']} of {wanted} were Ready") from None

    async def ready_count(self, orders: list[Order]) -> int:
        statuses = [await self._order_status(order.ref) for order in orders]
        return sum(int(status.get("readyWorkers") or 0) for status in statuses)

    async def decommission(self, orders: list[Order], timeout: float) -> None:
        await asyncio.gather(*(self.api.decommission(o.ref) for o in orders))
        await asyncio.wait_for(asyncio.gather(*(self.api.wait_finished(o.ref) for o in orders)), timeout)

    # -- the twins' own records -------------------------------------------------------------------

    async def bmaas_stats(self) -> dict[str, Any]:
        return await lab_admin.stats(self.bmaas)

    async def hub_stats(self) -> dict[str, Any]:
        return await lab_admin.stats(self.hub, excludeUser=[CONTROLLER_USER, BENCH_USER])

    async def hub_watch_delay(self) -> dict[str, Any]:
        """Per user (the worker, the controllers, the harness): how long the hub twin's watch events
        waited between the write and the send. The harness's own watch dates the Agent changes."""
        return dict((await lab_admin.stats(self.hub)).get("watchDelay") or {})

    async def audit(self) -> list[dict[str, Any]]:
        return await lab_admin.audit(self.bmaas)

    async def audit_violations(self) -> list[Any]:
        return await lab_admin.audit_violations(self.bmaas)

    async def close(self) -> None:
        await self.hub.aclose()
        await self.bmaas.aclose()


def worker_env(client: Client, info: TwinsInfo, task_queue: str, bmaas_rate: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSAC_", "TEMPORAL_", "OTEL_"))}
    env.update(
        {
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "TEMPORAL_NAMESPACE": client.namespace,
            "OSAC_FULFILLMENT_URL": info.fulfillment_url,
            "OSAC_FULFILLMENT_TOKEN_FILE": str(info.admin_token_file),
            "KUBECONFIG": str(info.kubeconfig),
            "OSAC_TASK_QUEUE": task_queue,
            "OSAC_BMAAS_TASK_QUEUE": f"{task_queue}-bmaas",
            "OSAC_BMAAS_ACTIVITIES_PER_SECOND": str(bmaas_rate),
            "OSAC_GRACEFUL_SHUTDOWN_SECONDS": "1",
        }
    )
    return env


async def wait_pollers(client: Client, task_queues: list[str], timeout: float = 60.0) -> None:
    """Until a worker polls each queue, so no measured span includes a worker's start-up."""

    async def polled() -> bool:
        for queue in task_queues:
            for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
                response = await client.workflow_service.describe_task_queue(
                    DescribeTaskQueueRequest(
                        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
                    )
                )
                if not response.pollers:
                    if kind == TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW and queue.endswith("-bmaas"):
                        continue  # the BMaaS queue carries activities only
                    return False
        return True

    await eventually(polled, f"workers polling {', '.join(task_queues)}", timeout)


def default_worker_command() -> list[str]:
    return [str(Path(sys.executable).parent / "osac-workers"), "worker"]


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process with its output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=out)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _sample(pid: int, output: Path, log: Path) -> subprocess.Popen[bytes]:
    """py-spy on `pid` without pausing it, collapsed stacks (grep-able; speedscope or flamegraph.pl
    draw them) written to `output` on SIGINT."""
    command = [str(PY_SPY), "record", "--nonblocking", "--rate", "50", "--format", "raw"]
    return spawn([*command, "--pid", str(pid), "--output", str(output)], log)


@contextlib.asynccontextmanager
async def bench_stack(
    client: Client,
    workdir: Path,
    profile_name: str,
    hosts: int,
    *,
    bmaas_rate: float,
    flamegraph: Path | None = None,
    worker_command: list[str] | None = None,
    split_worker: bool = False,
    twins_nice: int = 0,
    policy: TimingPolicy | None = None,
) -> AsyncIterator[BenchStack]:
    """Fresh twins and a fresh worker, on task queues of their own: one process, or with
    `split_worker` a workflow process and an activity process (`OSAC_WORKER_ROLE`). With
    `flamegraph`, py-spy samples each worker process (and the twins) for as long as the stack runs."""
    twins = TwinsProcess(profile_name, hosts, workdir / "twins", workdir / "twins.log", nice=twins_nice)
    info = await asyncio.to_thread(twins.start)
    task_queue = f"bench-{profile_name}-{uuid.uuid4().hex[:6]}"
    workers: dict[str, subprocess.Popen[bytes]] = {}
    spies: list[subprocess.Popen[bytes]] = []
    stack: BenchStack | None = None
    try:
        env = worker_env(client, info, task_queue, bmaas_rate)
        for role in ("workflows", "activities") if split_worker else ("",):
            workers[role] = spawn(
                worker_command or default_worker_command(),
                workdir / (f"worker-{role}.log" if role else "worker.log"),
                {**env, "OSAC_WORKER_ROLE": role} if role else env,
            )
        await wait_pollers(client, [task_queue, f"{task_queue}-bmaas"])
        if flamegraph is not None:
            # The twins too: their CPU is most of the machine's, and the floor waits on their controllers.
            assert twins.proc is not None
            phase = flamegraph.name.removeprefix("worker-")
            spies = [
                _sample(
                    worker.pid,
                    flamegraph.with_name(f"worker-{role}-{phase}") if role else flamegraph,
                    workdir / f"py-spy-{role or 'worker'}.log",
                )
                for role, worker in workers.items()
            ]
            spies.append(
                _sample(twins.proc.pid, flamegraph.with_name(f"twins-{phase}"), workdir / "py-spy-twins.log")
            )
        stack = BenchStack(
            client, info, twins, list(workers.values()), task_queue, f"{task_queue}-bmaas", policy
        )
        yield stack
    finally:
        for spy in spies:
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for spy in spies:
            await asyncio.to_thread(spy.wait, 60)
        if stack is not None:
            await stack.close()
        for worker in workers.values():
            await asyncio.to_thread(stop_process, worker)
        await asyncio.to_thread(twins.stop)
