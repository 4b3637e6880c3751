"""The hub twin: a Kubernetes-API-compatible server for the OSAC hub's kinds.

Public surface: `create_hub_app`, `HubConfig`, `HubService` (lab.hub.app), `write_kubeconfig`
(lab.hub.kubeconfig), `start_hub`/`running_hub` (lab.hub.testing), `hub_user` (lab.hub.auth, a
FastAPI dependency for routers mounted on the hub).
"""

from lab.hub.app import HubConfig, HubService, create_hub_app
from lab.hub.auth import hub_user
from lab.hub.kubeconfig import write_kubeconfig

__all__ = ["HubConfig", "HubService", "create_hub_app", "hub_user", "write_kubeconfig"]
