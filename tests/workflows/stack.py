"""The whole product on one machine for tests: both twins over HTTP, the real activities, a worker.

The twins run on their own threads (ThreadedServer); the Temporal worker runs on the test's event loop
against the session's dev server. Tests talk to the hub with httpx and to BMaaS with httpx, exactly
as any client would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.worker import Interceptor, Replayer

from contracts.hub import PULL_SECRET_KEY, InfraEnvRef
from contracts.refs import OrderRef
from contracts.worker import TimingPolicy, WorkerPhase, WorkerReport, WorkerReports, WorkerStatus
from contracts.workflows import NodeSetRequest, cluster_workflow_id, worker_workflow_id
from lab import admin as lab_admin
from lab.fulfillment.testing import RunningFulfillmentTwin, start_fulfillment_twin
from lab.fulfillment.timings import Timings
from lab.hub_controllers.testing import Lab, start_lab
from lab.hub_controllers.timings import AgentTimings
from starter.api import StatusUnanswered, WorkersApi
from worker.main import run_worker
from worker.settings import Settings
from workflows.cluster_workers import ClusterWorkersWorkflow
from workflows.worker_node import WorkerNodeWorkflow

T = TypeVar("T")

RELEASE_IMAGE = "quay.io/openshift-release-dev/ocp-release:4.18.0-x86_64"
PULL_SECRET = json.dumps(
    {"auths": {"quay.io": {"auth": base64.b64encode(b"robot:sup3r-s3cret-pull").decode()}}}
)
INSTANCE_TYPES = ("bm-standard", "bm-gpu")
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHr0ks3jOM2Yz0gK1cM9Yc9l7Wq9d4m2b0F5tJd4Vx0e t@x"

CLUSTER_ORDERS = "/apis/osac.openshift.io/v1alpha1"
AGENT_API = "/apis/agent-install.openshift.io/v1beta1"


# Restarts of stopped workers in a test's time: a restarted worker waits out the stopped run's calls
# (their timeouts) before it looks, and leaving workers are looked after every second.
QUICK_RESTARTS: dict[str, timedelta] = {
    "ready_host_check": timedelta(seconds=1),
    "call_timeout": timedelta(seconds=5),
    "wait_heartbeat_timeout": timedelta(seconds=5),
}


def fast_policy(**overrides: Any) -> TimingPolicy:
    """OSAC's shape with every duration in (sub)seconds so a lifecycle runs in seconds."""
    base: dict[str, Any] = dict(
        agent_registration_timeout=timedelta(seconds=20),
        agent_install_timeout=timedelta(seconds=60),
        agent_unbinding_timeout=timedelta(seconds=20),
        agent_watch_renewal=timedelta(seconds=5),
        transient_backoff=[timedelta(seconds=0.5), timedelta(seconds=1)],
        transient_backoff_cap=timedelta(seconds=2),
        no_hosts_backoff=[timedelta(seconds=1), timedelta(seconds=2)],
        no_hosts_backoff_cap=timedelta(seconds=2),
        registration_timeout_backoff=[timedelta(seconds=0.5)],
        registration_timeout_backoff_cap=timedelta(seconds=1),
        prerequisite_recheck=timedelta(seconds=1),
    )
    base.update(overrides)
    return TimingPolicy(**base)


def timer_started(
    event: HistoryEvent, *, summary: str | None = None, lasting: timedelta | None = None
) -> bool:
    """A TimerStarted event, of that summary (the Web UI's) and that length if given."""
    if event.event_type != EventType.EVENT_TYPE_TIMER_STARTED:
        return False
    if (
        lasting is not None
        and event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta() != lasting
    ):
        return False
    return summary is None or (
        event.user_metadata.summary.data != b"" and json.loads(event.user_metadata.summary.data) == summary
    )


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The condition of that type in a ClusterOrder as read from the hub."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


async def wait_condition(
    stack: Stack, ref: OrderRef, kind: str, status: str, timeout: float = 60
) -> dict[str, Any]:
    """Until the ClusterOrder shows that condition with that status; the condition."""

    async def probe() -> dict[str, Any] | None:
        cond = await stack.order_condition(ref, kind)
        return cond if cond is not None and cond.get("status") == status else None

    return await eventually(probe, f"{kind}={status} on {ref.key}", timeout)


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 90.0, interval: float = 0.2
) -> T:
    """Poll until `probe` returns something truthy; generous deadlines for a noisy 2-core machine.
    A status query no worker answered in time (a long workflow task, a worker moving) is asked again."""
    deadline = time.monotonic() + timeout
    last: T | StatusUnanswered | None = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
        except StatusUnanswered as unanswered:
            last = unanswered
        else:
            if last:
                return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")


REGRESSIONS = Path(__file__).parent / "histories" / "regressions"


def record_regression(name: str, history: WorkflowHistory) -> None:
    """With OSAC_RECORD_HISTORIES=1, keep `history` as `regressions/<name>.json`: a run through a
    state the recorded lifecycle never reaches, replayed by test_histories on later code."""
    if os.environ.get("OSAC_RECORD_HISTORIES") == "1":
        (REGRESSIONS / f"{name}.json").write_text(history.to_json())


def signal_payloads(history: WorkflowHistory, name: str) -> list[bytes]:
    """The JSON of each `name` signal the run received, in order."""
    return [
        e.workflow_execution_signaled_event_attributes.input.payloads[0].data
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == name
    ]


def delivered_reports(history: WorkflowHistory) -> list[WorkerReport]:
    """The reports the worker processes delivered to an order's workflow run, in order."""
    return [
        report
        for payload in signal_payloads(history, "worker_reports")
        for report in WorkerReports.model_validate_json(payload).reports
    ]


def scheduled_activities(events: Sequence[HistoryEvent]) -> list[str]:
    """The activity types a history scheduled, in order (local activities are markers, not here)."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


@dataclass
class Stack:
    fulfillment: RunningFulfillmentTwin
    lab: Lab
    client: Client
    api: WorkersApi
    settings: Settings
    hub_http: httpx.AsyncClient
    bmaas_http: httpx.AsyncClient

    # ------------------------------------------------------------------------------- orders

    async def create_order(
        self,
        node_sets: dict[str, int],
        *,
        namespace: str | None = None,
        name: str | None = None,
        release_image: str | None = RELEASE_IMAGE,
        annotations: dict[str, str] | None = None,
        network: dict[str, Any] | None = None,
    ) -> OrderRef:
        """`release_image=None`: the order names none (its template's default applies); `network`
        is the order's `spec.networkAttachment`."""
        namespace = namespace or f"t-{uuid.uuid4().hex[:8]}"
        name = name or f"o{uuid.uuid4().hex[:8]}"
        response = await self.hub_http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
        if response.status_code != 409:
            response.raise_for_status()
        body: dict[str, Any] = {
            "apiVersion": "osac.openshift.io/v1alpha1",
            "kind": "ClusterOrder",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {
                "templateID": "ocp_4_18_small",
                **({"releaseImage": release_image} if release_image else {}),
                **({"networkAttachment": network} if network else {}),
                "pullSecret": PULL_SECRET,
                "sshPublicKey": SSH_KEY,
                "nodeRequests": [
                    {"numberOfNodes": count, "bareMetal": {"instanceType": kind}}
                    for kind, count in node_sets.items()
                ],
            },
        }
        response = await self.hub_http.post(
            f"{CLUSTER_ORDERS}/namespaces/{namespace}/clusterorders", json=body
        )
        response.raise_for_status()
        return OrderRef(namespace=namespace, name=name)

    async def apply(self, order: OrderRef, node_sets: dict[str, int], api: WorkersApi | None = None) -> Any:
        """`api`: another library API than the stack's (its own TimingPolicy: `with_policy`)."""
        return await (api or self.api).apply(
            order,
            [NodeSetRequest(name=k, instance_type=k, count=v) for k, v in node_sets.items()],
            instance_types=INSTANCE_TYPES,
        )

    def with_policy(self, **overrides: Any) -> WorkersApi:
        """The stack's library API, starting workflows with `fast_policy(**overrides)`."""
        return WorkersApi(
            self.client,
            task_queue=self.api.task_queue,
            bmaas_task_queue=self.api.bmaas_task_queue,
            policy=fast_policy(**overrides),
        )

    async def link_boot_image(self, release: str, version: str) -> None:
        """A ClusterVersion for `release` linked to the lab's disk image (as an admin adds one)."""
        images = (await self.bmaas_http.get("/api/private/v1/disk_images")).json()["items"]
        response = await self.bmaas_http.post(
            "/api/private/v1/cluster_versions",
            json={
                "metadata": {"name": version},
                "spec": {"image": release, "version": version, "disk_image": images[0]["id"]},
            },
        )
        response.raise_for_status()

    async def order_object(self, order: OrderRef) -> dict[str, Any]:
        response = await self.hub_http.get(
            f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}"
        )
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def order_condition(self, order: OrderRef, kind: str) -> dict[str, Any] | None:
        """The ClusterOrder's condition of that type (None: not there, or the order is gone)."""
        response = await self.hub_http.get(
            f"{CLUSTER_ORDERS}/namespaces/{order.namespace}/clusterorders/{order.name}"
        )
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return condition(response.json(), kind)

    async def agents(self, namespace: str) -> list[dict[str, Any]]:
        response = await self.hub_http.get(f"{AGENT_API}/namespaces/{namespace}/agents")
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def infraenvs(self, namespace: str) -> list[dict[str, Any]]:
        response = await self.hub_http.get(f"{AGENT_API}/namespaces/{namespace}/infraenvs")
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def infraenv_inputs(self, order: OrderRef) -> tuple[str | None, str | None]:
        """What the order's InfraEnv makes hosts boot with: its pull Secret's content (decoded) and
        its SSH key."""
        ref = InfraEnvRef.for_order(order)
        secret = await self.hub_http.get(f"/api/v1/namespaces/{ref.namespace}/secrets/{ref.pull_secret_name}")
        secret.raise_for_status()
        encoded = secret.json().get("data", {}).get(PULL_SECRET_KEY)
        infraenv = await self.hub_http.get(f"{AGENT_API}/namespaces/{ref.namespace}/infraenvs/{ref.name}")
        infraenv.raise_for_status()
        return (
            base64.b64decode(encoded).decode() if encoded else None,
            infraenv.json().get("spec", {}).get("sshAuthorizedKey"),
        )

    async def bmis(self, order: OrderRef) -> list[dict[str, Any]]:
        response = await self.bmaas_http.get(
            "/api/private/v1/baremetal_instances",
            params={"filter": f"this.metadata.labels['osac.openshift.io/cluster-order'] == '{order.name}'"},
        )
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json().get("items") or []
        return items

    async def security_groups(self, order: OrderRef) -> dict[str, list[str]]:
        """The security groups of each BMI of the order (by BMI id), as BMaaS has them (by name)."""
        return {
            bmi["id"]: [
                group["name"]
                for attachment in bmi["spec"].get("network_attachments") or []
                for group in attachment.get("security_groups") or []
            ]
            for bmi in await self.bmis(order)
        }

    async def histories(self, order: OrderRef) -> list[WorkflowHistory]:
        """Every run of the order's workflows (cluster and workers) that visibility lists now."""
        return [
            await self.client.get_workflow_handle(e.id, run_id=e.run_id).fetch_history()
            async for e in self.client.list_workflows(f"OsacClusterOrder = '{order.key}'")
        ]

    async def audit(self) -> list[dict[str, Any]]:
        return await lab_admin.audit(self.bmaas_http)

    async def audit_violations(self) -> list[Any]:
        return await lab_admin.audit_violations(self.bmaas_http)

    async def set_bmaas_faults(self, **faults: Any) -> None:
        (await self.bmaas_http.put("/lab/v1/faults", json=faults)).raise_for_status()

    async def clear_bmaas_faults(self) -> None:
        (await self.bmaas_http.delete("/lab/v1/faults")).raise_for_status()

    async def set_agent_faults(self, faults: dict[str, Any]) -> None:
        (await self.hub_http.put("/lab/v1/faults/agents", json=faults)).raise_for_status()

    async def clear_agent_faults(self) -> None:
        (await self.hub_http.delete("/lab/v1/faults/agents")).raise_for_status()

    async def wait_ready(self, order: OrderRef, ready: int, timeout: float = 120.0) -> Any:
        async def probe() -> Any:
            try:
                status = await self.api.status(order)
            except RPCError:  # e.g. a query timing out while a killed worker's tasks move elsewhere
                return None
            return status if status.ready_workers == ready and status.current_workers == ready else None

        return await eventually(probe, f"{ready} ready workers of {order.key}", timeout)

    async def wait_worker_phase(self, order: OrderRef, name: str, phase: WorkerPhase) -> WorkerStatus:
        async def in_phase() -> WorkerStatus | None:
            worker = {w.name: w for w in (await self.api.status(order)).workers}.get(name)
            return worker if worker and worker.phase == phase else None

        found: WorkerStatus = await eventually(in_phase, f"{name} {phase.value}")
        return found

    async def order_run_ended(self, order: OrderRef) -> WorkflowExecutionStatus:
        """Wait until the order's workflow run has ended; how it ended."""
        handle = self.client.get_workflow_handle(cluster_workflow_id(order))

        async def ended() -> WorkflowExecutionStatus | None:
            status = (await handle.describe()).status
            return status if status != WorkflowExecutionStatus.RUNNING else None

        found: WorkflowExecutionStatus = await eventually(ended, f"the run of {order.key} ended")
        return found

    async def terminate_worker(self, order: OrderRef, name: str) -> str:
        """Terminate the worker's workflow as an operator would (the Web UI); the run id stopped."""
        handle = self.client.get_workflow_handle(worker_workflow_id(order, name))
        run_id = (await handle.describe()).run_id
        assert run_id is not None
        await handle.terminate(reason="test")
        return run_id

    async def wait_terminated_worker_replaced(
        self, order: OrderRef, name: str, stopped_run: str, held_bmi: str | None, replacement: str
    ) -> None:
        """The terminated worker started again, its host released (wiped), and `replacement` Ready
        in its place (an order of one worker)."""

        async def replaced() -> bool:
            status = await self.api.status(order)
            return status.ready_workers == 1 and [w.name for w in status.workers] == [replacement]

        await eventually(replaced, f"{name} started again, released and replaced", timeout=120)
        await self.wait_restarted_run_released(order, name, stopped_run, held_bmi)

    async def wait_restarted_run_released(
        self, order: OrderRef, name: str, stopped_run: str, held_bmi: str | None
    ) -> None:
        """A run of the worker after `stopped_run` completed, and `held_bmi` was wiped."""

        async def completed() -> bool:  # its last report goes out a workflow task before its end
            latest = await self.client.get_workflow_handle(worker_workflow_id(order, name)).describe()
            return latest.run_id != stopped_run and latest.status == WorkflowExecutionStatus.COMPLETED

        await eventually(completed, f"the restarted run of {name} completed")
        assert held_bmi in {r["bmi_id"] for r in await self.audit() if r["kind"] == "WIPE_FINISHED"}

    async def decommission_and_wait(self, order: OrderRef, timeout: float = 180.0) -> Any:
        await self.api.decommission(order)
        return await asyncio.wait_for(self.api.wait_finished(order), timeout)


@contextlib.asynccontextmanager
async def worker_running(stack: Stack, settings: Settings | None = None) -> AsyncIterator[None]:
    """A worker (the stack's settings, or `settings`) in this process for the duration of the block."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_worker(stack.client, settings or stack.settings, stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


@contextlib.asynccontextmanager
async def running_stack(
    client: Client,
    workdir: Path,
    *,
    hosts: int = 24,
    policy: TimingPolicy | None = None,
    bmaas_timings: Timings | None = None,
    in_process_worker: bool = True,
    worker_interceptors: Sequence[ClientInterceptor] = (),
) -> AsyncIterator[Stack]:
    """Both twins and the library API; a worker in this process unless the test runs its own
    (`worker_interceptors`: on the in-process worker's client, which hands its worker interceptors
    to the worker: to hold a workflow at a chosen point)."""
    lab = start_lab(workdir, AgentTimings.zero())
    fulfillment = start_fulfillment_twin(
        hosts=hosts, timings=bmaas_timings or Timings(), boot_seam=lab.boot_seam
    )
    token_file = workdir / "fulfillment-token"
    token_file.write_text(fulfillment.admin_token)
    token_file.chmod(0o600)
    task_queue = f"osac-workers-{uuid.uuid4().hex[:6]}"
    settings = Settings(
        fulfillment_url=fulfillment.url,
        fulfillment_token_file=token_file,
        kubeconfig=lab.hub.kubeconfig,
        task_queue=task_queue,
        bmaas_task_queue=f"{task_queue}-bmaas",
        bmaas_activities_per_second=None,
        graceful_shutdown_seconds=1,
    )
    stop = asyncio.Event()
    config = client.config()
    config["interceptors"] = [*config["interceptors"], *worker_interceptors]
    worker_client = Client(**config)
    worker = asyncio.create_task(
        run_worker(worker_client, settings, stop) if in_process_worker else stop.wait()
    )
    hub_http = httpx.AsyncClient(base_url=lab.url, headers=lab.hub.headers(), timeout=30.0)
    bmaas_http = httpx.AsyncClient(base_url=fulfillment.url, headers=fulfillment.admin_headers, timeout=30.0)
    api = WorkersApi(
        client,
        task_queue=task_queue,
        bmaas_task_queue=settings.bmaas_task_queue,
        policy=policy or fast_policy(),
    )
    try:
        yield Stack(fulfillment, lab, client, api, settings, hub_http, bmaas_http)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(worker, 30)
        if worker.done() and not worker.cancelled() and worker.exception() is not None:
            raise worker.exception()  # type: ignore[misc]
        await hub_http.aclose()
        await bmaas_http.aclose()
        fulfillment.stop()
        lab.stop()


# Where `replay_clean` keeps a history that fails to replay.
FAILED_REPLAYS = Path(tempfile.gettempdir()) / "osac-failed-replays"


def patches_recorded(history: WorkflowHistory) -> list[str]:
    """The ids of the history's `workflow.patched` markers, in order."""
    ids = []
    for event in history.events:
        marker = event.marker_recorded_event_attributes
        if event.HasField("marker_recorded_event_attributes") and marker.marker_name == "core_patch":
            ids.append(json.loads(marker.details["patch-data"].payloads[0].data)["id"])
    return ids


async def replay_clean(
    histories: Iterable[WorkflowHistory], interceptors: Sequence[Interceptor] = ()
) -> None:
    """Replay each history on today's workflows (with the worker's `interceptors` it ran with): a
    change that breaks one fails the test."""
    replayer = Replayer(
        workflows=[ClusterWorkersWorkflow, WorkerNodeWorkflow],
        data_converter=pydantic_data_converter,
        interceptors=interceptors,
    )
    replayed = 0
    for history in histories:
        try:
            await replayer.replay_workflow(history)
        except Exception as failure:
            # Kept: a rare failure cannot be studied from its message alone.
            kept = FAILED_REPLAYS / f"{history.workflow_id.replace('/', '_')}-{time.time_ns()}.json"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(history.to_json())
            failure.add_note(f"the history that failed to replay is kept in {kept}")
            raise
        replayed += 1
    assert replayed, "no history to replay"


async def order_run_continued_as_new(stack: Stack, order: OrderRef, run_id: str, ready: WorkerStatus) -> str:
    """Reports the order ignores (of a slot it does not have: an event in its history, nothing
    else), sent until its run `run_id`, past the server's suggestion, continues as new at one.
    Returns the new run's id."""
    handle = stack.api.handle(order)
    ignored = WorkerReports(reports=[WorkerReport(status=ready.model_copy(update={"name": "nobody"}))])

    async def continued() -> str | None:
        latest = (await handle.describe()).run_id
        if latest != run_id:
            return latest
        await handle.signal(ClusterWorkersWorkflow.worker_reports, ignored)
        return None

    return await eventually(continued, f"run {run_id} of {handle.id} continuing as new")
