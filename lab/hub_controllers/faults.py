"""Fault knobs for hosts and agents, served at `/lab/v1/faults/agents` (GET / PUT / DELETE).

Every fault names its victims by NIC MAC, by Agent name (the host id) or by a rate drawn from one
seeded RNG, so a failing run can be replayed. A rate is drawn once per occasion (one boot, one
install), never per reconcile pass.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.hub.auth import hub_user
from lab.hub_controllers.constants import HostStage

FAULTS_PATH = "/lab/v1/faults/agents"


def normalise_mac(mac: str) -> str:
    """Lowercase colon form, whatever separators the caller used."""
    digits = "".join(ch for ch in mac.lower() if ch in "0123456789abcdef")
    if len(digits) != 12:
        return mac.strip().lower()
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


class FaultTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    macs: list[str] = Field(default_factory=list, description="hit hosts having any of these MACs")
    agents: list[str] = Field(default_factory=list, description="hit these Agent names (host ids)")
    rate: float = Field(0.0, ge=0.0, le=1.0, description="else hit with this probability")

    @field_validator("macs")
    @classmethod
    def _normalise(cls, value: list[str]) -> list[str]:
        return [normalise_mac(m) for m in value]

    @property
    def armed(self) -> bool:
        return bool(self.macs or self.agents or self.rate)


class SlowRegistration(FaultTarget):
    extra_delay_s: float = Field(0.0, ge=0.0, description="added to the registration delay")


class InstallError(FaultTarget):
    stage: HostStage = Field(HostStage.WRITING_IMAGE_TO_DISK, description="stage at which it fails")
    message: str = "Failed to write image to disk: input/output error"


class ExtraNic(FaultTarget):
    shared: bool = Field(
        False, description="the same MAC on every host hit (some BMCs' USB NICs); else one per host"
    )


class AgentFaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    never_register: FaultTarget = Field(default_factory=FaultTarget)
    slow_registration: SlowRegistration = Field(default_factory=SlowRegistration)
    install_error: InstallError = Field(default_factory=InstallError)
    # The host boots the discovery ISO again at the Rebooting stage (wrong boot order).
    installing_pending_user_action: FaultTarget = Field(default_factory=FaultTarget)
    # A second Agent reports one of the host's MACs, registered alongside the real one.
    duplicate_mac: FaultTarget = Field(default_factory=FaultTarget)
    # The host reports one more interface than its BMI's NICs, with a MAC no BMI has (a BMC's USB
    # NIC): benign, but only BMaaS can tell, so the orchestrator must ask before binding it.
    extra_nic: ExtraNic = Field(default_factory=ExtraNic)
    # A scale-down victim's drain never ends (a PodDisruptionBudget, `nodeDrainTimeout` 0): its
    # Machine stays, Deleting, and its Agent claimed, for as long as this fault stays armed.
    hanging_drain: FaultTarget = Field(default_factory=FaultTarget)


class FaultKind(StrEnum):
    NEVER_REGISTER = "never_register"
    SLOW_REGISTRATION = "slow_registration"
    INSTALL_ERROR = "install_error"
    INSTALLING_PENDING_USER_ACTION = "installing_pending_user_action"
    DUPLICATE_MAC = "duplicate_mac"
    EXTRA_NIC = "extra_nic"
    HANGING_DRAIN = "hanging_drain"


@dataclass(frozen=True)
class FaultHit:
    kind: FaultKind
    subject: str  # host id or Agent name


@dataclass
class FaultBook:
    """The live fault configuration plus its RNG; shared by the boot seam and the controllers."""

    config: AgentFaults = field(default_factory=AgentFaults)
    hits: list[FaultHit] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.config.seed)

    def replace(self, config: AgentFaults) -> None:
        self.config = config
        self._rng = random.Random(config.seed)

    def reset(self) -> None:
        self.replace(AgentFaults())

    def decide(self, kind: FaultKind, subject: str, macs: Iterable[str] = ()) -> bool:
        target: FaultTarget = getattr(self.config, kind.value)
        if not target.armed:
            return False
        wanted = set(target.macs)
        hit = subject in target.agents or any(normalise_mac(m) in wanted for m in macs)
        if not hit and target.rate > 0:
            hit = self._rng.random() < target.rate
        if hit:
            self.hits.append(FaultHit(kind, subject))
        return hit


def faults_router(book: FaultBook) -> APIRouter:
    # Like the hub's own lab routes: any user the hub knows (admin or the controllers' token).
    router = APIRouter(tags=["lab faults"], dependencies=[Depends(hub_user)])

    @router.get(FAULTS_PATH)
    async def get_faults() -> AgentFaults:
        return book.config

    @router.put(FAULTS_PATH)
    async def put_faults(config: AgentFaults) -> AgentFaults:
        book.replace(config)
        return book.config

    @router.delete(FAULTS_PATH)
    async def delete_faults() -> AgentFaults:
        book.reset()
        return book.config

    return router
