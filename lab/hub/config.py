"""Configuration of one hub twin."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class HubConfig(BaseModel):
    tokens: dict[str, str]  # bearer token -> user name, e.g. {"<tok>": "admin", "<tok2>": "lab-controllers"}
    crd_dirs: list[Path] = []  # extra CRD files/directories to serve and enforce (e.g. the real CRDs)
    packaged_crds: bool = True  # serve the project's own CRDs from lab/crds
    namespaces: list[str] = ["default"]  # created at start-up, as a fresh cluster has them
    # Watch: events retained per kind for resuming from a resourceVersion (older: 410 Gone), the
    # per-watcher queue bound (a watcher that falls this far behind has its stream closed), the
    # default stream length when the client gives no timeoutSeconds, and the bookmark period.
    watch_window: int = Field(default=10_000, ge=1)
    watch_queue_size: int = Field(default=4_096, ge=1)
    watch_timeout_seconds: float = Field(default=1800.0, gt=0)
    bookmark_interval_seconds: float = Field(default=60.0, gt=0)
    event_ttl_seconds: float | None = Field(default=3600.0, gt=0)  # Events expire like on a real cluster
    fault_seed: int = 0
    server_version: str = "v1.32.0"
