"""The hub API kinds the controllers read and write, and how their REST paths are built."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ApiResource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def _base(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection_path(self, namespace: str | None = None) -> str:
        if self.namespaced and namespace:
            return f"{self._base()}/namespaces/{namespace}/{self.plural}"
        return f"{self._base()}/{self.plural}"

    def object_path(self, namespace: str | None, name: str, subresource: str | None = None) -> str:
        path = f"{self.collection_path(namespace)}/{name}"
        return f"{path}/{subresource}" if subresource else path


NAMESPACES = ApiResource("", "v1", "namespaces", "Namespace", namespaced=False)
SECRETS = ApiResource("", "v1", "secrets", "Secret")
EVENTS = ApiResource("", "v1", "events", "Event")
CLUSTER_ORDERS = ApiResource("osac.openshift.io", "v1alpha1", "clusterorders", "ClusterOrder")
INFRA_ENVS = ApiResource("agent-install.openshift.io", "v1beta1", "infraenvs", "InfraEnv")
AGENTS = ApiResource("agent-install.openshift.io", "v1beta1", "agents", "Agent")
NODE_POOLS = ApiResource("hypershift.openshift.io", "v1beta1", "nodepools", "NodePool")
MACHINES = ApiResource("cluster.x-k8s.io", "v1beta1", "machines", "Machine")
AGENT_MACHINES = ApiResource(
    "capi-provider.agent-install.openshift.io", "v1beta1", "agentmachines", "AgentMachine"
)
