"""The host side of the lab: a booted bare-metal host "runs" its user data.

`AgentBootSeam` implements `lab.boot.BootSeam` for the fulfillment twin. When a host boots with a
discovery ignition of this hub (directly, or through `ignition.config.merge/replace` sources that
are data: URLs or http(s) URLs it can fetch), its discovery agent registers, after
`timings.registration_s`, at the registration URL named in the ignition with the ignition's agent
token, reporting the host's id and every NIC MAC. Anything else - not JSON, not Ignition v3, an
ignition without the agent unit, a token the service rejects - registers nothing, like real
hardware. The host id becomes the Agent name (as given when it is a valid DNS name, else a uuid5
of it), so a host booting again re-registers the same Agent.

Every boot leaves a `BootRecord` (never the user data: it carries secrets) so tests and the demo
can tell "not registered yet" from "will never register".
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import httpx

from lab.boot import BootedHost
from lab.hub_controllers.constants import AGENT_AUTH_HEADER
from lab.hub_controllers.faults import FaultBook, FaultKind, normalise_mac
from lab.hub_controllers.ignition import (
    AGENT_IMAGE,
    DiscoveryAgentConfig,
    config_sources,
    decode_data_url,
    extract_agent_config,
    load_ignition,
)
from lab.hub_controllers.inventory import host_inventory
from lab.hub_controllers.registration import valid_host_id
from lab.hub_controllers.timings import AgentTimings

log = logging.getLogger(__name__)

_HOST_ID_NAMESPACE = uuid.UUID("0b6f6c1e-2d7e-4a59-8f3c-5e4d3c2b1a09")
_MAX_CONFIG_DEPTH = 3


class BootOutcome(StrEnum):
    REGISTERED = "registered"
    NOT_DISCOVERY = "not-a-discovery-ignition"
    SUPPRESSED = "suppressed-by-fault"
    REJECTED = "rejected"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class BootRecord:
    host_id: str
    outcome: BootOutcome
    macs: tuple[str, ...] = ()  # the MACs the registration reported (the host's, or the phantom's)
    agent_name: str | None = None
    status_code: int | None = None
    duplicate_of: str | None = None  # set on the phantom Agent of the duplicate-MAC fault


def agent_host_id(host_id: str) -> str:
    candidate = host_id.strip().lower()
    if valid_host_id(candidate) and len(candidate) <= 63:
        return candidate
    return str(uuid.uuid5(_HOST_ID_NAMESPACE, host_id))


def _phantom_mac(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))  # locally administered


class AgentBootSeam:
    # Ignition and the discovery agent retry until they get through; a loaded lab (a thousand hosts
    # booting at once) can take minutes to answer them all. A registration the service is still
    # answering is waited for (`answer_wait_s`), never sent again: each abandoned one that the
    # service completes later re-registers the host, which sends it back to discovery, and in a
    # burst those re-registrations made the service slower still (17,000 for 500 hosts).
    def __init__(
        self,
        faults: FaultBook,
        timings: AgentTimings,
        *,
        retry_for_s: float = 900.0,
        answer_wait_s: float = 300.0,
    ) -> None:
        self.faults = faults
        self.timings = timings
        self.records: list[BootRecord] = []
        self._retry_for_s = retry_for_s
        self._answer_wait_s = answer_wait_s
        self._tasks: set[asyncio.Task[None]] = set()

    async def boot(self, host: BootedHost, user_data: str) -> None:
        # Return at once: the caller's provisioning flow must not wait for the agent.
        task = asyncio.get_running_loop().create_task(self._run(host, user_data), name=f"boot-{host.host_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def records_for(self, host_id: str) -> list[BootRecord]:
        return [r for r in list(self.records) if r.host_id == host_id]

    def close(self) -> None:
        """Cancel pending agent start-ups (callable from any thread)."""
        for task in list(self._tasks):
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def _run(self, host: BootedHost, user_data: str) -> None:
        started = asyncio.get_running_loop().time()
        try:
            config = await self._resolve(user_data, 0, asyncio.get_running_loop().time() + self._retry_for_s)
        except Exception:
            log.exception("host %s: reading user data failed", host.host_id)
            config = None
        if config is None:
            self.records.append(BootRecord(host.host_id, BootOutcome.NOT_DISCOVERY, tuple(host.macs)))
            return
        if self.faults.decide(FaultKind.NEVER_REGISTER, host.host_id, host.macs):
            self.records.append(BootRecord(host.host_id, BootOutcome.SUPPRESSED, tuple(host.macs)))
            return
        delay = self.timings.registration_s
        if self.faults.decide(FaultKind.SLOW_REGISTRATION, host.host_id, host.macs):
            delay += self.faults.config.slow_registration.extra_delay_s
        duplicate = self.faults.decide(FaultKind.DUPLICATE_MAC, host.host_id, host.macs)
        extra_nic = self.faults.decide(FaultKind.EXTRA_NIC, host.host_id, host.macs)
        await asyncio.sleep(max(0.0, started + delay - asyncio.get_running_loop().time()))

        agent_name = agent_host_id(host.host_id)
        macs = [*host.macs, _phantom_mac(f"extra-nic/{agent_name}")] if extra_nic else list(host.macs)
        await self._register_and_record(host.host_id, config, agent_name, macs, None)
        if duplicate and host.macs:
            phantom = str(uuid.uuid5(_HOST_ID_NAMESPACE, f"duplicate-of/{agent_name}"))
            macs = [host.macs[0], _phantom_mac(phantom)]
            await self._register_and_record(host.host_id, config, phantom, macs, agent_name)

    async def _register_and_record(
        self,
        host_id: str,
        config: DiscoveryAgentConfig,
        agent_name: str,
        macs: Sequence[str],
        duplicate_of: str | None,
    ) -> None:
        code = await self._register(config, agent_name, macs)
        if code is None:
            outcome = BootOutcome.UNREACHABLE
        elif code < 300:
            outcome = BootOutcome.REGISTERED
        else:
            outcome = BootOutcome.REJECTED
        self.records.append(BootRecord(host_id, outcome, tuple(macs), agent_name, code, duplicate_of))

    async def _resolve(self, user_data: str, depth: int, deadline: float) -> DiscoveryAgentConfig | None:
        document = load_ignition(user_data)
        if document is None:
            return None
        config = extract_agent_config(document)
        if config is not None or depth >= _MAX_CONFIG_DEPTH:
            return config
        for source in config_sources(document):
            text = decode_data_url(source)
            if text is None and source.startswith(("http://", "https://")):
                text = await self._fetch(source, deadline)
            if text is not None:
                config = await self._resolve(text, depth + 1, deadline)
                if config is not None:
                    return config
        return None

    @staticmethod
    async def _fetch(url: str, deadline: float) -> str | None:
        """GET a merged config like Ignition: unreachable or 5xx is retried until `deadline`."""
        loop = asyncio.get_running_loop()
        pause = 0.1
        async with httpx.AsyncClient(timeout=10.0, verify=False) as client:
            while True:
                try:
                    response = await client.get(url)
                    if response.status_code < 500:
                        return response.text if response.status_code == 200 else None
                except httpx.HTTPError as exc:
                    log.debug("fetching %s failed: %r", url.split("?")[0], exc)
                if loop.time() >= deadline:
                    return None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _register(
        self, config: DiscoveryAgentConfig, agent_name: str, macs: Sequence[str]
    ) -> int | None:
        """POST the registration like the agent does, retrying while the service is unreachable."""
        body = {
            "host_id": agent_name,
            "discovery_agent_version": AGENT_IMAGE,
            "inventory": host_inventory(agent_name, [normalise_mac(m) for m in macs]),
        }
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_for_s
        pause = 0.1
        timeout = httpx.Timeout(self._answer_wait_s, connect=5.0)
        async with httpx.AsyncClient(timeout=timeout, verify=not config.insecure) as client:
            while True:
                code: int | None = None
                try:
                    response = await client.post(
                        config.registration_url, json=body, headers={AGENT_AUTH_HEADER: config.agent_token}
                    )
                    code = response.status_code
                except httpx.TimeoutException as exc:
                    log.warning("agent %s: registration unanswered, sending it again: %r", agent_name, exc)
                except httpx.HTTPError as exc:
                    log.debug("agent %s: registration failed: %r", agent_name, exc)
                if code is not None and code < 500:
                    return code  # success, or a refusal that retrying cannot change
                if loop.time() >= deadline:
                    return code
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
