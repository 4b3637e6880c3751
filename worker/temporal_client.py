"""One way to reach Temporal for every process: envconfig profile + the pydantic data converter."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile


async def connect(address: str | None = None, namespace: str | None = None, **overrides: Any) -> Client:
    """Connect using TEMPORAL_ADDRESS/NAMESPACE/TLS/API key (env or profile), with explicit overrides."""
    config: dict[str, Any] = dict(ClientConfigProfile.load().to_client_connect_config())
    if address:
        config["target_host"] = address
    if namespace:
        config["namespace"] = namespace
    config.setdefault("target_host", "127.0.0.1:7233")
    config.update(overrides)
    return await Client.connect(data_converter=pydantic_data_converter, **config)
