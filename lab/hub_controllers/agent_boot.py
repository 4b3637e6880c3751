"""The host side of the lab: a booted bare-metal host "runs" its user data.

`AgentBootSeam` implements `lab.boot.BootSeam` for the fulfillment twin. When a host boots with a
discovery ignition of this hub (directly, or through `ignition.config.merge/replace` sources that
are data: URLs or http(s) URLs it can fetch), its discovery agent registers, after
`timings.registration_s`, at the registration URL named in the ignition with the ignition's agent
token, reporting the host's id and every NIC MAC. Anything else - not JSON, not Ignition v3, an
ignition without the agent unit, a token the service rejects - registers nothing, like real
hardware. A registration refused with 409 (the host id is an installed Agent's: the host was given to
a new BMI before its old Agent was released) is sent again until it is taken, as the agent does.
The host id becomes the Agent name (as given when it is a valid DNS name, else a uuid5
of it), so a host booting again re-registers the same Agent.

While the host runs the discovery image its agent keeps polling the service. Deleting its Agent
deregisters the host: the agent gets 404, restarts and registers again, so `timings.registration_s`
after the deletion the Agent is back (same name, same MACs, a new uid). `attach` gives the seam the
hub's Agents informer to see those deletions (one that lands while the host's registration is on
its way back counts once that registration is settled). Not once the install started (the host may
have booted its disk: `INSTALL_STARTED_STATES`) or while it waits to be rebooted
(`unbinding-pending-user-action`), and never once halted: `halt` (BMaaS powers the host off to wipe
it) cancels whatever registration is still pending and forgets the host.

Every boot leaves a `BootRecord` (never the user data: it carries secrets) so tests and the demo
can tell "not registered yet" from "will never register"; a registration again leaves one with
`again=True`, a host halted before its boot had an outcome one with `BootOutcome.HALTED`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import httpx

from lab.boot import BootedHost
from lab.hub_controllers.assisted_images import find_infra_env
from lab.hub_controllers.constants import AGENT_AUTH_HEADER, INSTALL_STARTED_STATES, HostState
from lab.hub_controllers.faults import FaultBook, FaultKind, normalise_mac
from lab.hub_controllers.ignition import (
    AGENT_IMAGE,
    DiscoveryAgentConfig,
    config_sources,
    decode_data_url,
    extract_agent_config,
    load_ignition,
)
from lab.hub_controllers.informer import Informer
from lab.hub_controllers.inventory import host_inventory
from lab.hub_controllers.kube import Obj, WatchEventType
from lab.hub_controllers.registration import host_state_of, valid_host_id
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
    # Powered off before its boot had an outcome (a registration already sent may still land).
    HALTED = "halted-before-registering"


@dataclass(frozen=True)
class BootRecord:
    host_id: str
    outcome: BootOutcome
    macs: tuple[str, ...] = ()  # the MACs the registration reported (the host's, or the phantom's)
    agent_name: str | None = None
    status_code: int | None = None
    duplicate_of: str | None = None  # set on the phantom Agent of the duplicate-MAC fault
    again: bool = False  # the host registered again after its Agent was deleted


def agent_host_id(host_id: str) -> str:
    candidate = host_id.strip().lower()
    if valid_host_id(candidate) and len(candidate) <= 63:
        return candidate
    return str(uuid.uuid5(_HOST_ID_NAMESPACE, host_id))


def still_in_discovery(agent: Obj) -> bool:
    """Whether the host behind `agent`, as last seen, may still run the discovery image: not once its
    install started (it may have booted its disk) nor while it waits to be rebooted."""
    state = host_state_of(agent)
    return state not in INSTALL_STARTED_STATES and state is not HostState.UNBINDING_PENDING_USER_ACTION


def _phantom_mac(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))  # locally administered


@dataclass(eq=False)
class _Run:
    """One boot of a host: what it runs, and what its agent needs to register again."""

    host_id: str
    macs: tuple[str, ...]
    halted: bool = False
    settled: bool = False  # the boot's outcome is recorded
    # Set once the primary Agent registered: the host runs the discovery image from then on.
    config: DiscoveryAgentConfig | None = field(default=None, repr=False)  # holds the agent token
    agent_name: str | None = None
    registered_macs: tuple[str, ...] = ()
    again: asyncio.Task[None] | None = None  # a registration again, pending
    # The primary registration on its way (its config), and whether its Agent was deleted before
    # the answer came back: the agent's next poll finds the host gone and registers again.
    registering: DiscoveryAgentConfig | None = field(default=None, repr=False)
    deleted_while_registering: bool = False


class AgentBootSeam:
    # Hosts are known by their id: twins that share one seam need hosts with ids of their own (a
    # `halt` of one host id stops that host wherever it was booted).
    #
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
        # Boots come on the fulfillment twin's loop, halts from its thread, Agent deletions on the
        # hub's loop: the tables below are shared by all of them.
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}  # host id -> its latest boot, until halted
        self._tasks: dict[asyncio.Task[None], _Run] = {}  # pending boots and registrations again
        self._infra_envs: Informer | None = None  # set while attached to a hub

    async def boot(self, host: BootedHost, user_data: str) -> None:
        # Return at once: the caller's provisioning flow must not wait for the agent.
        run = _Run(host.host_id, tuple(host.macs))
        loop = asyncio.get_running_loop()
        with self._lock:
            self._runs[host.host_id] = run
            task = loop.create_task(self._run(host, user_data, run), name=f"boot-{host.host_id}")
            self._tasks[task] = run
        task.add_done_callback(self._task_done)

    def halt(self, host_id: str) -> None:
        """The host was powered off (callable from any thread): cancel its pending registrations and
        forget it, so that nothing registers from it any more."""
        with self._lock:
            runs = [r for r in self._tasks.values() if r.host_id == host_id]
            current = self._runs.pop(host_id, None)
            if current is not None:
                runs.append(current)
            tasks = [t for t, r in self._tasks.items() if r.host_id == host_id]
            for run in dict.fromkeys(runs):
                if not run.halted and not run.settled:
                    self.records.append(BootRecord(host_id, BootOutcome.HALTED, run.macs))
                run.halted = True
        for task in tasks:
            _cancel(task)

    def attach(self, agents: Informer, infra_envs: Informer) -> None:
        """Watch the hub's Agents (on the hub's loop): a host still in discovery whose Agent is
        deleted registers again. `infra_envs` tells which namespace a host's InfraEnv is in."""
        with self._lock:
            self._infra_envs = infra_envs
        agents.add_handler(self._on_agent_event)

    async def detach(self) -> None:
        """The hub stops: no more registrations again; pending ones are cancelled (and awaited when
        they run on this loop)."""
        with self._lock:
            self._infra_envs = None
            tasks = [t for t in self._tasks if t.get_name().startswith("again-")]
        for task in tasks:
            _cancel(task)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*[t for t in tasks if t.get_loop() is loop], return_exceptions=True)

    def records_for(self, host_id: str) -> list[BootRecord]:
        return [r for r in list(self.records) if r.host_id == host_id]

    def pending(self, host_id: str) -> int:
        """How many of the host's boots and registrations again are still running."""
        with self._lock:
            return sum(1 for t, r in self._tasks.items() if r.host_id == host_id and not t.done())

    def close(self) -> None:
        """Cancel pending agent start-ups and registrations again (callable from any thread)."""
        with self._lock:
            tasks = list(self._tasks)
        for task in tasks:
            _cancel(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        with self._lock:
            run = self._tasks.pop(task, None)
            if run is not None and run.again is task:
                run.again = None

    def _settle(self, run: _Run, record: BootRecord, config: DiscoveryAgentConfig | None = None) -> bool:
        """Record an outcome unless the host was halted meanwhile (`halt` recorded that); with
        `config`, the record is the primary Agent's registration: the host now runs discovery."""
        with self._lock:
            if run.halted:
                return False
            self.records.append(record)
            run.settled = True
            if config is not None and record.outcome is BootOutcome.REGISTERED and record.agent_name:
                run.config, run.agent_name, run.registered_macs = config, record.agent_name, record.macs
            return True

    async def _run(self, host: BootedHost, user_data: str, run: _Run) -> None:
        started = asyncio.get_running_loop().time()
        try:
            config = await self._resolve(user_data, 0, asyncio.get_running_loop().time() + self._retry_for_s)
        except Exception:
            log.exception("host %s: reading user data failed", host.host_id)
            config = None
        if config is None:
            self._settle(run, BootRecord(host.host_id, BootOutcome.NOT_DISCOVERY, tuple(host.macs)))
            return
        if self.faults.decide(FaultKind.NEVER_REGISTER, host.host_id, host.macs):
            self._settle(run, BootRecord(host.host_id, BootOutcome.SUPPRESSED, tuple(host.macs)))
            return
        delay = self.timings.registration_s
        if self.faults.decide(FaultKind.SLOW_REGISTRATION, host.host_id, host.macs):
            delay += self.faults.config.slow_registration.extra_delay_s
        duplicate = self.faults.decide(FaultKind.DUPLICATE_MAC, host.host_id, host.macs)
        extra_nic = self.faults.decide(FaultKind.EXTRA_NIC, host.host_id, host.macs)
        await asyncio.sleep(max(0.0, started + delay - asyncio.get_running_loop().time()))

        agent_name = agent_host_id(host.host_id)
        nic_seed = "extra-nic" if self.faults.config.extra_nic.shared else f"extra-nic/{agent_name}"
        macs = [*host.macs, _phantom_mac(nic_seed)] if extra_nic else list(host.macs)
        await self._register_and_record(run, config, agent_name, macs, None)
        if duplicate and host.macs:
            phantom = str(uuid.uuid5(_HOST_ID_NAMESPACE, f"duplicate-of/{agent_name}"))
            macs = [host.macs[0], _phantom_mac(phantom)]
            await self._register_and_record(run, config, phantom, macs, agent_name)

    def _on_agent_event(self, kind: WatchEventType, agent: Obj) -> None:
        # Only a deletion deregisters a host (the informer replays ADDED to a late handler, and a
        # relist reports what vanished between two lists as DELETED too).
        if kind is not WatchEventType.DELETED or not still_in_discovery(agent):
            return
        meta = agent.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace")
        with self._lock:
            infra_envs = self._infra_envs
            # Only a primary Agent: the duplicate-MAC fault's phantom has another name.
            run = next(
                (r for r in self._runs.values() if r.agent_name == name and r.config is not None), None
            )
            if run is None:
                # Deleted between the registration's write and its answer (a released slot's
                # Agent, the host given to another slot meanwhile): registered again once settled.
                for r in self._runs.values():
                    config = r.registering
                    if config is None or agent_host_id(r.host_id) != name or infra_envs is None:
                        continue
                    infra_env = find_infra_env(infra_envs, config.infra_env_id)
                    if infra_env is not None and infra_env.get("metadata", {}).get("namespace") == namespace:
                        r.deleted_while_registering = True
        if infra_envs is None or run is None or run.config is None:
            return
        # Agent names repeat across namespaces (the same host in another lab run): this host's agent
        # polls its own InfraEnv, so only the Agent in that InfraEnv's namespace is its own.
        infra_env = find_infra_env(infra_envs, run.config.infra_env_id)
        if infra_env is None or infra_env.get("metadata", {}).get("namespace") != namespace:
            return
        loop = asyncio.get_running_loop()  # the hub's: informer handlers run on its loop
        with self._lock:
            if run.halted or run.again is not None or self._runs.get(run.host_id) is not run:
                return
            task = loop.create_task(self._register_again(run), name=f"again-{run.host_id}")
            run.again = task
            self._tasks[task] = run
        task.add_done_callback(self._task_done)

    async def _register_again(self, run: _Run) -> None:
        # The agent notices on its next poll, restarts and registers like at boot.
        await asyncio.sleep(self.timings.registration_s)
        with self._lock:
            if self._runs.get(run.host_id) is not run:
                return  # halted, or booted something else since
            # Registering now: a deletion from here on is of the Agent this brings back, and the
            # agent starts over once more (`_on_agent_event` waits only for one not yet sent).
            run.again = None
        config, agent_name = run.config, run.agent_name
        if config is None or agent_name is None:
            return
        await self._register_and_record(run, config, agent_name, run.registered_macs, None, again=True)

    async def _register_and_record(
        self,
        run: _Run,
        config: DiscoveryAgentConfig,
        agent_name: str,
        macs: Sequence[str],
        duplicate_of: str | None,
        *,
        again: bool = False,
    ) -> None:
        if run.halted:  # `halt` raced the cancellation it asked for: a powered-off host sends nothing
            return None
        primary = duplicate_of is None and not again
        if primary:
            with self._lock:
                run.registering = config
        code = await self._register(config, agent_name, macs, run if primary else None)
        if code is None:
            outcome = BootOutcome.UNREACHABLE
        elif code < 300:
            outcome = BootOutcome.REGISTERED
        else:
            outcome = BootOutcome.REJECTED
        record = BootRecord(run.host_id, outcome, tuple(macs), agent_name, code, duplicate_of, again)
        self._settle(run, record, config if primary else None)
        if primary:
            with self._lock:
                run.registering = None
        if primary and outcome is BootOutcome.REGISTERED and run.deleted_while_registering:
            with self._lock:
                run.deleted_while_registering = False
                if run.halted or run.again is not None or self._runs.get(run.host_id) is not run:
                    return
                task = asyncio.get_running_loop().create_task(
                    self._register_again(run), name=f"again-{run.host_id}"
                )
                run.again = task
                self._tasks[task] = run
            task.add_done_callback(self._task_done)

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
        self, config: DiscoveryAgentConfig, agent_name: str, macs: Sequence[str], run: _Run | None = None
    ) -> int | None:
        """POST the registration like the agent does, retrying while the service is unreachable or
        answers 409."""
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
                if run is not None:
                    with self._lock:  # only a deletion after this request went out counts
                        run.deleted_while_registering = False
                try:
                    response = await client.post(
                        config.registration_url, json=body, headers={AGENT_AUTH_HEADER: config.agent_token}
                    )
                    code = response.status_code
                except httpx.TimeoutException as exc:
                    log.warning("agent %s: registration unanswered, sending it again: %r", agent_name, exc)
                except httpx.HTTPError as exc:
                    log.debug("agent %s: registration failed: %r", agent_name, exc)
                # 409: the host id is an installed Agent's (the host was another slot's, wiped and
                # booted for a new one before that slot's release deleted it): the agent keeps
                # registering until the Agent is gone. Other 4xx: retrying cannot change them.
                if code is not None and code < 500 and code != 409:
                    return code
                if loop.time() >= deadline:
                    return code
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)


def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel a task from any thread."""
    if task.done():
        return
    try:
        task.get_loop().call_soon_threadsafe(task.cancel)
    except RuntimeError:  # its loop is closed: nothing runs there any more
        pass
