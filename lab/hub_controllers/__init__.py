"""The hub twin's behaviour: what assisted-service, the HyperShift agent provider and OSAC's
cluster-provisioning job do on the real hub, as HTTP clients of the hub API, plus the boot seam
where hosts of the fulfillment twin "run" their discovery ignition.

Wiring (see `compose.build_hub_behaviour`):

    behaviour = build_hub_behaviour(hub_url, controller_token, AgentTimings.demo(), AgentFaults())
    app = create_hub_app(config, routers=behaviour.routers, services=behaviour.services)
    FulfillmentLab(config, boot_seam=behaviour.boot_seam)

Modules, one job each:
    compose               build_hub_behaviour; HubControllers (the HubService running everything)
    kube, informer        REST client (CAS updates, merge patches, watch) and list/watch caches
    workqueue             de-duplicating work queue + reconcile loop with per-key backoff
    assisted_images       InfraEnv -> boot artifacts, ImageCreated (the InfraEnv id: uuid5 of its uid)
    assisted_api          HTTP: ignition download, agent registration, ISO stand-in
    registration          what a registration does to the Agent CR
    host_state            the host state machine on Agent CRs (bind, install stages, unbind)
    agent_status          Agent status and conditions per state (assisted-service's tables)
    agent_provider        NodePool replicas -> Machines + AgentMachines -> claimed Agents,
                          scale-down, status
    cluster_provisioning  ClusterOrder -> hosted-cluster namespace, NodePools, clusterReference
    agent_boot            the BootSeam: a booted host registers its agent if its ignition says so,
                          again when its Agent is deleted in discovery, never once halted
    ignition, inventory, tokens   the discovery ignition, host inventories, signed tokens
    faults, timings       fault knobs (/lab/v1/faults/agents) and step durations
    testing               a hub with all of this on a free port, and blocking test helpers

Routes mounted on the hub: `GET /api/assisted-install/v2/infra-envs/{id}/downloads/files`,
`POST /api/assisted-install/v2/infra-envs/{id}/hosts`, `GET /images/{id}`,
`GET|PUT|DELETE /lab/v1/faults/agents`.
"""

from lab.hub_controllers.agent_boot import AgentBootSeam, BootOutcome, BootRecord
from lab.hub_controllers.compose import HubBehaviour, HubControllers, build_hub_behaviour
from lab.hub_controllers.faults import (
    FAULTS_PATH,
    AgentFaults,
    FaultBook,
    FaultTarget,
    InstallError,
    SlowRegistration,
)
from lab.hub_controllers.ignition import DiscoveryAgentConfig, extract_agent_config, render_discovery_ignition
from lab.hub_controllers.timings import AgentTimings

__all__ = [
    "FAULTS_PATH",
    "AgentBootSeam",
    "AgentFaults",
    "AgentTimings",
    "BootOutcome",
    "BootRecord",
    "DiscoveryAgentConfig",
    "FaultBook",
    "FaultTarget",
    "HubBehaviour",
    "HubControllers",
    "InstallError",
    "SlowRegistration",
    "build_hub_behaviour",
    "extract_agent_config",
    "render_discovery_ignition",
]
