"""Building the clients a caller needs from the same environment as the worker."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from temporalio.client import Client

from activities.bmaas.client import BmaasClient
from activities.kube import HubKube
from starter.api import WorkersApi
from starter.config import StarterSettings
from starter.operations import OrderOperations
from starter.orders import HubOrders
from starter.validation import InstanceTypeCatalog
from worker.main import HubUnusable, bmaas_client, hub_kube
from worker.settings import ConfigError, Settings, load_settings
from worker.temporal_client import connect_patiently


class Unreachable(Exception):
    """Temporal or the hub cannot be reached, or is not configured."""


def load_configuration() -> tuple[Settings, StarterSettings]:
    """Both settings groups and the timing policy file, checked before anything connects; a
    `ConfigError` lists every problem of either at once."""
    problems: list[str] = []
    settings: Settings | None = None
    starter: StarterSettings | None = None
    try:
        settings = load_settings(Settings)
    except ConfigError as err:
        problems.extend(err.problems)
    try:
        starter = load_settings(StarterSettings)
        starter.policy()
    except ConfigError as err:
        problems.extend(err.problems)
    if problems or settings is None or starter is None:
        raise ConfigError(problems)
    return settings, starter


def open_hub(settings: Settings) -> HubKube:
    """KUBECONFIG when set; in a pod, its service account; else the default kubeconfig."""
    try:
        return hub_kube(settings)
    except HubUnusable as err:
        raise Unreachable(str(err)) from err


async def connect_temporal(retry_for: float = 0.0) -> Client:
    """Commands fail at once; the long-running controller passes a `retry_for` to wait for it."""
    try:
        return await connect_patiently(retry_for)
    except RuntimeError as err:
        address = os.environ.get("TEMPORAL_ADDRESS", "127.0.0.1:7233 (default)")
        raise Unreachable(f"cannot reach Temporal at {address}: {err}") from err


def workers_api(client: Client, settings: Settings, starter: StarterSettings) -> WorkersApi:
    return WorkersApi(
        client,
        task_queue=settings.task_queue,
        bmaas_task_queue=settings.bmaas_task_queue,
        policy=starter.policy(),
        max_workers_per_order=starter.max_workers_per_order,
    )


@dataclass
class Callers:
    settings: Settings
    starter: StarterSettings
    client: Client
    api: WorkersApi
    kube: HubKube
    bmaas: BmaasClient
    operations: OrderOperations


@contextlib.asynccontextmanager
async def open_callers(warn: Callable[[str], None] | None = None) -> AsyncIterator[Callers]:
    """Temporal, the hub and BMaaS for a CLI command; closed on exit."""
    settings, starter = load_configuration()
    client = await connect_temporal()
    api = workers_api(client, settings, starter)
    kube = open_hub(settings)
    bmaas = bmaas_client(settings)
    operations = OrderOperations(
        api,
        HubOrders(kube),
        InstanceTypeCatalog(bmaas),
        warn=warn or (lambda message: None),
    )
    try:
        yield Callers(settings, starter, client, api, kube, bmaas, operations)
    finally:
        await bmaas.aclose()
        await kube.close()
