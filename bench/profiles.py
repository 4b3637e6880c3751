"""The benchmark's delay profiles, mapped onto both twins' timings.

`zero`: every twin delay 0. `1x`: the real durations divided by 60, as the benchmark issue states them
(about 6 s provisioning, 2 s agent registration, 5 s install, 3 s wipe). `10x`: ten times `1x`.
The steps the issue does not name take the twins' `realistic` figures divided by 60.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.fulfillment.timings import Timings
from lab.hub_controllers.timings import AgentTimings

ZERO = "zero"
ONE_X = "1x"
TEN_X = "10x"
PROFILES = (ZERO, ONE_X, TEN_X)


@dataclass(frozen=True)
class Profile:
    name: str
    bmaas: Timings
    agents: AgentTimings

    def describe(self) -> dict[str, dict[str, float]]:
        return {"bmaas": self.bmaas.model_dump(), "agents": self.agents.model_dump()}


# 1x: provisioning 0.25 + 2.5 + 3.0 = 5.75 s (realistic 345 s / 60); wipe 3 s as the issue says.
_BMAAS_1X = Timings(allocation_s=0.25, image_write_s=2.5, boot_s=3.0, wipe_s=3.0, deprovision_s=10 / 60)
# 1x: registration 2 s; install once handed = binding 0.15 + discovery 0.5 + 2 x start 0.35
# + 9 stages x 0.4 = 4.95 s.
_AGENTS_1X = AgentTimings(
    image_created_s=10 / 60,
    registration_s=2.0,
    discovery_s=0.5,
    binding_s=0.15,
    install_start_s=0.35,
    install_stage_s=0.4,
    unbinding_s=10 / 60,
    # Not part of a worker's life: the bench waits for the hosted cluster before it starts the clock.
    cluster_provisioning_s=0.5,
)


def _scaled(timings: Timings, factor: float) -> Timings:
    return Timings.model_validate({k: v * factor for k, v in timings.model_dump().items()})


def _scaled_agents(timings: AgentTimings, factor: float) -> AgentTimings:
    fields = {k: v * factor for k, v in timings.model_dump().items()}
    fields["cluster_provisioning_s"] = timings.cluster_provisioning_s  # outside the measured span
    return AgentTimings.model_validate(fields)


def profile(name: str) -> Profile:
    if name == ZERO:
        return Profile(ZERO, Timings(), AgentTimings.zero())
    if name == ONE_X:
        return Profile(ONE_X, _BMAAS_1X, _AGENTS_1X)
    if name == TEN_X:
        return Profile(TEN_X, _scaled(_BMAAS_1X, 10), _scaled_agents(_AGENTS_1X, 10))
    raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
