"""Worker and controller configuration, from the environment (see the README's reference)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.workflows import BMAAS_TASK_QUEUE, WORKFLOW_TASK_QUEUE


class Settings(BaseSettings):
    """`TEMPORAL_*` connection settings are read by `temporalio.envconfig` (profiles, TLS, API key)."""

    model_config = SettingsConfigDict(env_prefix="OSAC_", extra="ignore")

    fulfillment_url: str = Field(default="http://127.0.0.1:8100", description="BMaaS private API base URL")
    fulfillment_token_file: Path = Field(
        default=Path("/var/run/secrets/osac/fulfillment-token"), description="bearer token, re-read on change"
    )
    fulfillment_ca_file: Path | None = Field(default=None, description="CA bundle for the BMaaS API")
    kubeconfig: Path | None = Field(
        default=None, validation_alias="KUBECONFIG", description="hub kubeconfig; in-cluster when unset"
    )
    task_queue: str = WORKFLOW_TASK_QUEUE
    bmaas_task_queue: str = BMAAS_TASK_QUEUE
    # Upper bound on BMaaS activity starts per second across all workers of the task queue.
    bmaas_activities_per_second: float | None = Field(default=20.0, gt=0)
    max_concurrent_activities: int = Field(default=200, gt=0)
    blocking_threads: int = Field(default=32, gt=0)
    graceful_shutdown_seconds: float = Field(default=30.0, ge=0)
    controller_namespaces: list[str] = Field(default_factory=list, description="empty: all namespaces")
    controller_resync_seconds: float = Field(default=300.0, gt=0)
