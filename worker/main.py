"""The worker process: builds each backend client once, registers workflows and activities, runs.

Two Temporal workers share the process: one on the workflow task queue (workflows and the hub
activities) and one on the BMaaS task queue, whose activity start rate is limited server-side so a
burst of scale-ups cannot flood the fulfillment service. `OSAC_WORKER_ROLE` splits that work over
two kinds of process: `workflows` (workflow tasks, and the local activities they run) and
`activities` (every activity task of both queues).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.worker import Worker

from activities.assisted import AssistedActivities
from activities.bmaas.activities import BmaasActivities
from activities.bmaas.client import BmaasClient
from activities.bmaas.errors import BmaasApiError
from activities.bmaas.watcher import BmiWatcher
from activities.hub import HubActivities
from activities.kube import HubKube
from activities.reporting import use_batch_window
from activities.workflows import WorkflowActivities
from contracts.activities import BmaasActivity, HubActivity
from contracts.bmaas import CAAS_CATALOG_ITEM, BmaasErrorType
from worker.compiled_code import compile_once
from worker.health import serve_health
from worker.settings import Settings, WorkerRole
from workflows.cluster_workers import ClusterWorkersWorkflow
from workflows.search_attributes import ALL_SEARCH_ATTRIBUTES
from workflows.worker_node import WorkerNodeWorkflow

log = logging.getLogger("osac.worker")

WORKFLOWS: Sequence[type] = (ClusterWorkersWorkflow, WorkerNodeWorkflow)


class MissingSearchAttributes(RuntimeError):
    pass


@dataclass
class Backends:
    """Every external system, wrapped once per process."""

    bmaas_client: BmaasClient
    bmi_watcher: BmiWatcher
    kube: HubKube
    ignition_http: httpx.AsyncClient
    bmaas: BmaasActivities
    assisted: AssistedActivities
    hub: HubActivities
    workflows: WorkflowActivities

    def bmaas_activities(self) -> list[Any]:
        return [getattr(self.bmaas, name.value) for name in BmaasActivity if hasattr(self.bmaas, name.value)]

    def hub_activities(self) -> list[Any]:
        owners = (self.assisted, self.workflows, self.hub)
        found = []
        for name in HubActivity:
            owner = next((o for o in owners if hasattr(o, name.value)), self.hub)
            found.append(getattr(owner, name.value))  # an AttributeError names one not implemented
        return found

    async def close(self) -> None:
        await self.hub.events.close()  # the Events still queued, before the hub client goes
        await self.assisted.aclose()
        await self.bmi_watcher.stop()
        await self.bmaas_client.aclose()
        await self.ignition_http.aclose()
        await self.kube.close()


class HubUnusable(RuntimeError):
    """No usable hub configuration (the README's exit 3)."""


def hub_kube(settings: Settings) -> HubKube:
    """The hub from KUBECONFIG; without one, inside a pod, the pod's service account, else the
    default kubeconfig (~/.kube/config)."""
    try:
        if settings.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return HubKube.in_cluster(max_workers=settings.blocking_threads)
        return HubKube.from_kubeconfig(
            str(settings.kubeconfig) if settings.kubeconfig else None, max_workers=settings.blocking_threads
        )
    except Exception as err:  # kubernetes.config.ConfigException, and file errors
        raise HubUnusable(f"no usable hub configuration (set KUBECONFIG): {err}") from err


def bmaas_client(settings: Settings) -> BmaasClient:
    """The BMaaS client of the worker and the controller: a NotFound counts as gone only while the
    token sees OSAC's system-owned catalog item (see BmaasClient's visibility_canary)."""
    return BmaasClient(
        settings.fulfillment_url,
        settings.fulfillment_token_file,
        ca_bundle=settings.fulfillment_ca_file,
        visibility_canary=CAAS_CATALOG_ITEM,
    )


@contextlib.asynccontextmanager
async def open_backends(settings: Settings, kube: HubKube | None = None) -> AsyncIterator[Backends]:
    """The backends' clients and activities, closed on exit; `kube`: a hub client built already."""
    kube = kube or hub_kube(settings)
    bmaas = bmaas_client(settings)
    watcher = BmiWatcher(bmaas)
    if settings.role != WorkerRole.WORKFLOWS:  # no BMaaS activity runs in a workflow process
        watcher.start()
    ignition_http = httpx.AsyncClient(timeout=30.0)
    assisted = AssistedActivities(kube, ignition_http, hosts=watcher)
    backends = Backends(
        bmaas_client=bmaas,
        bmi_watcher=watcher,
        kube=kube,
        ignition_http=ignition_http,
        bmaas=BmaasActivities(bmaas, watcher, assisted),
        assisted=assisted,
        hub=HubActivities(kube),
        workflows=WorkflowActivities(),
    )
    try:
        yield backends
    finally:
        await backends.close()


class BackendRejectedCredentials(RuntimeError):
    """A backend refused this process's credentials: no worker should start polling for work."""


async def check_credentials(backends: Backends, settings: Settings) -> None:
    """Probe BMaaS once with the configured token, so a wrong one stops the worker at start with a
    clear message instead of failing every order silently. An unreachable BMaaS is not fatal:
    activities wait it out with retries."""
    try:
        await backends.bmaas_client.request("GET", "/bare_metal_instance_types", params={"limit": 1})
    except BmaasApiError as err:
        if err.error_type == BmaasErrorType.TOKEN_UNAVAILABLE and settings.role != WorkerRole.WORKFLOWS:
            # Not an outage: the mounted Secret is missing or empty, and every BMaaS activity of
            # this process would be refused (a workflow process runs none, and may go without it).
            raise BackendRejectedCredentials(
                f"{err} (missing, unreadable or empty): OSAC_FULFILLMENT_TOKEN_FILE names the file"
                " holding the BMaaS bearer token"
            ) from None
        if err.error_type in (BmaasErrorType.UNAUTHENTICATED, BmaasErrorType.PERMISSION_DENIED):
            raise BackendRejectedCredentials(
                f"BMaaS at {settings.fulfillment_url} rejected the token read from"
                f" OSAC_FULFILLMENT_TOKEN_FILE={settings.fulfillment_token_file}"
                f" ({err.http_status} {err.error_type.value})"
            ) from None
        log.warning("BMaaS is not answering at start (%s); activities will retry", err.error_type.value)
        return
    try:
        visible = await backends.bmaas_client.sees_system_objects()
    except BmaasApiError as err:
        log.warning("BMaaS is not answering at start (%s); activities will retry", err.error_type.value)
        return
    if not visible:
        raise BackendRejectedCredentials(
            f"the token read from OSAC_FULFILLMENT_TOKEN_FILE={settings.fulfillment_token_file} does"
            f" not see the system-owned catalog item {CAAS_CATALOG_ITEM!r} at {settings.fulfillment_url}:"
            " it needs the private API's admin identity (an object it cannot see would look deleted,"
            " and its host wiped); or the installer did not seed the item"
        )


def check_registered_activities(backends: Backends) -> None:
    """Every activity a workflow calls must be registered, or workers would wait forever on it."""
    bmaas = {fn.__temporal_activity_definition.name for fn in backends.bmaas_activities()}
    missing = sorted(a.value for a in BmaasActivity if a.value not in bmaas)
    if missing:
        raise RuntimeError(f"activities not implemented: {', '.join(missing)}")


async def check_search_attributes(client: Client) -> None:
    """Fail fast with a clear message when the namespace lacks our search attributes."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    known = set(response.custom_attributes)
    missing = sorted(key.name for key in ALL_SEARCH_ATTRIBUTES if key.name not in known)
    if missing:
        hint = " ".join(
            f"--name {key.name} --type {key.indexed_value_type.name.title().replace('_', '')}"
            for key in ALL_SEARCH_ATTRIBUTES
            if key.name in missing
        )
        raise MissingSearchAttributes(
            f"namespace {client.namespace!r} lacks the search attributes {', '.join(missing)}; register them"
            f" with: temporal operator search-attribute create --namespace {client.namespace} {hint}"
        )


def build_workers(client: Client, settings: Settings, backends: Backends) -> list[Worker]:
    shutdown = timedelta(seconds=settings.graceful_shutdown_seconds)
    role = settings.role
    if role != WorkerRole.ACTIVITIES:
        compile_once()  # before the first sandbox imports a workflow module
    # Split processes name their role in their identity, which histories record per task.
    identity = client.identity if role == WorkerRole.ALL else f"{client.identity}/{role.value}"
    main = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=list(WORKFLOWS) if role != WorkerRole.ACTIVITIES else [],
        # A workflow process registers the hub activities for its workflows' local activities only,
        # and takes no activity task: neither polled nor handed over eagerly with a workflow task.
        activities=backends.hub_activities(),
        no_remote_activities=role == WorkerRole.WORKFLOWS,
        disable_eager_activity_execution=role == WorkerRole.WORKFLOWS,
        identity=identity,
        graceful_shutdown_timeout=shutdown,
        **settings.workflow_worker_tuning(),
    )
    if role == WorkerRole.WORKFLOWS:
        return [main]
    bmaas = Worker(
        client,
        task_queue=settings.bmaas_task_queue,
        activities=backends.bmaas_activities(),
        max_concurrent_activities=settings.max_concurrent_activities,
        max_task_queue_activities_per_second=settings.bmaas_activities_per_second,
        identity=identity,
        graceful_shutdown_timeout=shutdown,
    )
    return [main, bmaas]


async def run_worker(
    client: Client, settings: Settings, stop: asyncio.Event, kube: HubKube | None = None
) -> None:
    """Run until `stop` is set, then shut down gracefully (in-flight activities get the timeout).

    With OSAC_HEALTH_BIND set, serves /healthz (every Temporal worker still running) and /readyz
    (all started and not stopping) while it runs. A fatal worker error ends this call with it."""
    await check_search_attributes(client)
    async with open_backends(settings, kube) as backends:
        check_registered_activities(backends)
        await check_credentials(backends, settings)
        use_batch_window(client, settings.report_batch_window_seconds)
        workers = build_workers(client, settings, backends)
        started = asyncio.Event()

        def live() -> bool:
            # A worker that ended on its own is dead; answering at all proves the loop is not stuck.
            return stop.is_set() or not any(w.is_shutdown for w in workers)

        def ready() -> bool:
            return started.is_set() and not stop.is_set() and all(w.is_running for w in workers)

        async with serve_health(settings.health_bind, live, ready), contextlib.AsyncExitStack() as stack:
            for worker in workers:
                await stack.enter_async_context(worker)
            started.set()
            log.info(
                "worker running on task queues %s and %s (role %s)",
                settings.task_queue,
                settings.bmaas_task_queue,
                settings.role.value,
            )
            await stop.wait()
            log.info("stopping: finishing in-flight work (up to %ss)", settings.graceful_shutdown_seconds)
            # Both at once: one after the other (the exit stack's order), the drain would take a
            # grace period per worker, and the second would take new tasks during the first's.
            await asyncio.gather(*(worker.shutdown() for worker in workers))


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
