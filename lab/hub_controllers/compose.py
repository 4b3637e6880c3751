"""Wiring: the controllers as one hub service, the HTTP routers, and the boot seam.

    behaviour = build_hub_behaviour(hub_url, controller_token, AgentTimings.demo(), AgentFaults())
    app = create_hub_app(config, routers=behaviour.routers, services=behaviour.services)
    fulfillment twin: boot_seam=behaviour.boot_seam

The controllers reach the hub over HTTP at `hub_url` with `controller_token`, like the real
assisted-service and CAPI provider do; they start inside the hub app's lifespan and keep retrying
until the server answers (it starts listening only after the lifespan started). The boot seam
watches the hub's Agents through their informer while the controllers run: a host still in
discovery whose Agent is deleted registers again.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import NamedTuple

from fastapi import APIRouter

from lab.hub_controllers.agent_boot import AgentBootSeam
from lab.hub_controllers.agent_provider import NodePoolController
from lab.hub_controllers.assisted_api import AssistedDeps, assisted_router
from lab.hub_controllers.assisted_images import InfraEnvController
from lab.hub_controllers.cluster_provisioning import ClusterOrderController
from lab.hub_controllers.events import EventRecorder
from lab.hub_controllers.faults import AgentFaults, FaultBook, faults_router
from lab.hub_controllers.host_state import AgentStateController
from lab.hub_controllers.informer import InformerSet
from lab.hub_controllers.kube import KubeApi
from lab.hub_controllers.registration import AgentRegistrar
from lab.hub_controllers.resources import (
    AGENT_MACHINES,
    AGENTS,
    CLUSTER_ORDERS,
    INFRA_ENVS,
    MACHINES,
    NODE_POOLS,
    SECRETS,
)
from lab.hub_controllers.timings import AgentTimings
from lab.hub_controllers.tokens import TokenSigner
from lab.hub_controllers.workqueue import Controller

log = logging.getLogger(__name__)


class HubControllers:
    """A `HubService`: `start()`/`stop()` run inside the hub app's lifespan (same event loop)."""

    def __init__(
        self,
        hub_url: str,
        controller_token: str,
        timings: AgentTimings,
        faults: FaultBook,
        signer: TokenSigner,
        *,
        seed: int = 0,
        ca_file: Path | None = None,
        boot_seam: AgentBootSeam | None = None,
    ) -> None:
        self.hub_url = hub_url.rstrip("/")
        self.boot_seam = boot_seam
        self._ca_file = ca_file
        self._token = controller_token
        self.timings = timings
        self.faults = faults
        self.signer = signer
        self._seed = seed
        self.api: KubeApi | None = None
        self.informers: InformerSet | None = None
        self.controllers: list[Controller] = []
        self.assisted: AssistedDeps | None = None

    async def start(self) -> None:
        # Read the CA only now: the hub may write its certificate after this object was built.
        verify = ssl.create_default_context(cafile=str(self._ca_file)) if self._ca_file else True
        api = self.api = KubeApi(self.hub_url, self._token, verify=verify)
        informers = self.informers = InformerSet(api)
        events = EventRecorder(api, "assisted-service")
        capi_events = EventRecorder(api, "capi-provider-agent")
        self.controllers = [
            InfraEnvController(
                api,
                informers.get(INFRA_ENVS),
                informers.get(SECRETS),
                base_url=self.hub_url,
                signer=self.signer,
                timings=self.timings,
                events=events,
            ),
            AgentStateController(
                api, informers.get(AGENTS), timings=self.timings, faults=self.faults, events=events
            ),
            NodePoolController(
                api,
                informers.get(NODE_POOLS),
                informers.get(AGENTS),
                informers.get(MACHINES),
                informers.get(AGENT_MACHINES),
                events=capi_events,
                faults=self.faults,
                seed=self._seed,
            ),
            ClusterOrderController(
                api,
                informers.get(CLUSTER_ORDERS),
                informers.get(NODE_POOLS),
                timings=self.timings,
                events=EventRecorder(api, "osac-cluster-provisioning"),
            ),
        ]
        self.assisted = AssistedDeps(
            infra_envs=informers.get(INFRA_ENVS),
            secrets=informers.get(SECRETS),
            registrar=AgentRegistrar(api, events),
            signer=self.signer,
            base_url=self.hub_url,
        )
        if self.boot_seam is not None:
            # Before the informers start, so that no Agent deletion goes unseen.
            self.boot_seam.attach(informers.get(AGENTS), informers.get(INFRA_ENVS))
        informers.start()
        for controller in self.controllers:
            controller.start()

    async def stop(self) -> None:
        self.assisted = None
        if self.boot_seam is not None:
            # Registrations again run on this loop; boots belong to the fulfillment twin (`close`).
            await self.boot_seam.detach()
        for controller in self.controllers:
            await controller.stop()
        self.controllers = []
        if self.informers is not None:
            await self.informers.stop()
        if self.api is not None:
            await self.api.aclose()
        self.api = self.informers = None

    async def wait_synced(self) -> None:
        if self.informers is not None:
            await self.informers.wait_synced()


class HubBehaviour(NamedTuple):
    services: list[HubControllers]
    routers: list[APIRouter]
    boot_seam: AgentBootSeam


def build_hub_behaviour(
    hub_url: str,
    controller_token: str,
    timings: AgentTimings | None = None,
    faults: AgentFaults | None = None,
    *,
    signing_key: bytes | None = None,
    seed: int = 0,
    ca_file: Path | None = None,
) -> HubBehaviour:
    """Everything the lab composer mounts on the hub app and hands the fulfillment twin.

    `hub_url` is the hub's externally reachable base URL (the controllers' API endpoint and the base
    of the ignition and registration URLs); `signing_key` pins the InfraEnv tokens (default: random
    per process); `seed` makes the CAPI provider's random victim choice reproducible; `ca_file` is
    the CA the controllers trust when `hub_url` is https (the agents run `--insecure=true`).
    """
    timings = timings or AgentTimings.demo()
    book = FaultBook(faults or AgentFaults())
    signer = TokenSigner(signing_key)
    boot_seam = AgentBootSeam(book, timings)
    controllers = HubControllers(
        hub_url, controller_token, timings, book, signer, seed=seed, ca_file=ca_file, boot_seam=boot_seam
    )
    routers = [assisted_router(lambda: controllers.assisted), faults_router(book)]
    return HubBehaviour([controllers], routers, boot_seam)
