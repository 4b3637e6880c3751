"""One way to reach Temporal for every process: envconfig profile + the project's data converter.

Connection (address, namespace, TLS, mTLS, API key, profiles) comes from `temporalio.envconfig`:
TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS, TEMPORAL_TLS_CLIENT_CERT_PATH,
TEMPORAL_TLS_CLIENT_KEY_PATH, TEMPORAL_TLS_SERVER_CA_CERT_PATH, TEMPORAL_TLS_SERVER_NAME,
TEMPORAL_PROFILE / TEMPORAL_CONFIG_FILE. The data converter is the pydantic one, with the AES-GCM
payload codec when OSAC_CODEC_KEYS(_FILE) is set; the metrics runtime and the tracing interceptor
come from `worker.telemetry.setup_telemetry()` when the process ran it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS

from worker.codec import data_converter_from_env
from worker.telemetry import Telemetry, process_telemetry

log = logging.getLogger(__name__)


async def connect(
    address: str | None = None,
    namespace: str | None = None,
    *,
    telemetry: Telemetry | None = None,
    **overrides: Any,
) -> Client:
    """Connect using TEMPORAL_ADDRESS/NAMESPACE/TLS/API key (env or profile), with explicit overrides."""
    config: dict[str, Any] = dict(ClientConfigProfile.load().to_client_connect_config())
    if address:
        config["target_host"] = address
    if namespace:
        config["namespace"] = namespace
    config.setdefault("target_host", "127.0.0.1:7233")
    telemetry = telemetry if telemetry is not None else process_telemetry()
    if telemetry is not None:
        config.update(telemetry.client_options())
    if "data_converter" not in overrides:
        config["data_converter"] = data_converter_from_env()
    config.update(overrides)
    return await Client.connect(**config)


async def connect_patiently(retry_for: float, **kwargs: Any) -> Client:
    """`connect`, retried for `retry_for` seconds: long-running processes are often started before
    Temporal is up, or while it restarts, and should not need their supervisor to try again."""
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + retry_for, 0.5
    while True:
        try:
            return await connect(**kwargs)
        except RuntimeError as err:
            if loop.time() + delay > deadline:
                raise
            log.warning("Temporal is not reachable yet (%s); retrying in %.1fs", err, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


def tls_files() -> list[Path]:
    """The files the connection's TLS material comes from (envconfig), read once at connect: a
    rotation needs a restart (`worker.rotation`)."""
    tls = ClientConfigProfile.load().tls
    if not isinstance(tls, ClientConfigTLS):
        return []
    sources = (tls.server_root_ca_cert, tls.client_cert, tls.client_private_key)
    return [source for source in sources if isinstance(source, Path)]
