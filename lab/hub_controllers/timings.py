"""How long each simulated step of assisted-service, the agent and HyperShift takes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AgentTimings(BaseModel):
    """Durations in seconds. `demo()` is the default; `realistic()` is close to the PoC's six
    minutes from BMI creation to a joined worker; `zero()` makes every step as fast as the
    controllers can write it (tests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image_created_s: float = Field(0.5, ge=0, description="InfraEnv seen -> ImageCreated=True")
    registration_s: float = Field(1.5, ge=0, description="host booted -> agent registers")
    discovery_s: float = Field(1.0, ge=0, description="discovering(-unbound) -> known(-unbound)")
    binding_s: float = Field(0.5, ge=0, description="binding -> discovering")
    install_start_s: float = Field(0.5, ge=0, description="known+approved -> installing -> in progress")
    install_stage_s: float = Field(0.5, ge=0, description="each worker install stage")
    unbinding_s: float = Field(0.5, ge=0, description="unbinding -> discovering-unbound")
    cluster_provisioning_s: float = Field(1.0, ge=0, description="ClusterOrder -> hosted cluster + NodePools")

    @classmethod
    def demo(cls) -> AgentTimings:
        return cls()

    @classmethod
    def realistic(cls) -> AgentTimings:
        return cls(
            image_created_s=10,
            registration_s=150,  # POST, firmware, discovery ISO boot, agent container pull
            discovery_s=30,
            binding_s=10,
            install_start_s=15,
            install_stage_s=20,  # 9 stages: about 3 minutes of install and reboot
            unbinding_s=10,
            cluster_provisioning_s=600,
        )

    @classmethod
    def zero(cls) -> AgentTimings:
        return cls(
            image_created_s=0,
            registration_s=0,
            discovery_s=0,
            binding_s=0,
            install_start_s=0,
            install_stage_s=0,
            unbinding_s=0,
            cluster_provisioning_s=0,
        )
