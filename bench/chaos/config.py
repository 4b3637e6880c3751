"""What a chaos run does: the scenario's sizes, the fault levels, and the seeded plan of disruptions.

Everything random in a run is drawn here, up front, from `random.Random(seed)`: the moments the
worker is killed, when the Temporal server restarts, the latency spikes, which hosts fail their
wipe, and the seeds handed to the twins' own fault RNGs. The same seed gives the same plan; the
interleaving with the product's own concurrency is of course not replayed exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from contracts.worker import TimingPolicy
from lab.fulfillment.timings import Timings

INSTANCE_TYPE = "bm-standard"


class Phase(StrEnum):
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    SCALE_UP_MORE = "scale-up-more"
    DECOMMISSION = "decommission"


@dataclass(frozen=True)
class ChaosConfig:
    name: str
    workers_a: int  # order A starts here and is scaled down to `scale_down_a_to`
    workers_b: int  # order B starts here and grows by `scale_up_b_by`
    scale_down_a_to: int
    scale_up_b_by: int
    hosts: int  # the twin's pool; a quarter are GPU hosts the scenario does not use
    kills: dict[Phase, int]  # SIGKILLs of the worker process per phase
    temporal_restarts: int
    wipe_failures: int
    never_register_rate: float = 0.05  # share of host boots whose agent never registers
    bmaas_error_rate: float = 0.20  # fulfillment twin: 503 on this share of API calls
    bmaas_latency_spike_s: float = 1.5  # added to every BMaaS call while a spike lasts
    hub_write_error_rate: float = 0.10  # hub twin: 500/409 on this share of the worker's writes
    hub_watch_cut_rate: float = 0.05  # hub twin: chance per watch event to cut the worker's stream
    # Longer than a killed worker's wait takes to move (heartbeat 30 s) so a kill alone rarely
    # fails an attempt; the short run takes the churn for speed (the invariants hold either way).
    agent_registration_timeout_s: float = 45.0
    # One attempt of a call and a wait's heartbeat timeout: what a SIGKILL or a lost completion
    # costs before Temporal retries the activity. The full run keeps OSAC's defaults (60 s, 30 s).
    call_timeout_s: float = 60.0
    wait_heartbeat_timeout_s: float = 30.0
    # A workflow task sent to a killed worker's sticky queue waits this long before any worker may
    # take it (the worker's OSAC_STICKY_QUEUE_TIMEOUT_SECONDS; 60 s deployed).
    sticky_queue_timeout_s: float = 60.0
    # Per phase, after the phase's disruptions: generous for a loaded 2-core machine, where each
    # SIGKILL costs up to a call timeout before Temporal retries elsewhere, and cut hub watches
    # delay what the worker sees.
    phase_deadline_s: float = 1800.0
    kill_window_s: tuple[float, float] = (2.0, 20.0)  # a kill lands this long after the previous event

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    @property
    def peak_workers(self) -> int:
        return max(
            self.workers_a + self.workers_b, self.scale_down_a_to + self.workers_b + self.scale_up_b_by
        )


FULL = ChaosConfig(
    name="full",
    workers_a=25,
    workers_b=25,
    scale_down_a_to=10,
    scale_up_b_by=5,
    hosts=96,  # 72 standard: 50 live at the peak, room for retries and the quarantined ones
    kills={Phase.SCALE_UP: 2, Phase.SCALE_DOWN: 1, Phase.SCALE_UP_MORE: 1, Phase.DECOMMISSION: 1},
    temporal_restarts=1,
    wipe_failures=2,
)

SHORT = ChaosConfig(
    name="short",
    workers_a=6,
    workers_b=4,
    scale_down_a_to=2,
    scale_up_b_by=2,
    hosts=24,  # 18 standard
    kills={Phase.SCALE_UP: 1},
    temporal_restarts=1,
    wipe_failures=1,
    never_register_rate=0.1,  # at least a chance of one with so few boots
    agent_registration_timeout_s=20.0,
    # A kill costs one call timeout: 15 s is ten times the slowest call under a latency spike.
    call_timeout_s=15.0,
    wait_heartbeat_timeout_s=10.0,
    sticky_queue_timeout_s=10.0,
    phase_deadline_s=480.0,
    kill_window_s=(1.0, 6.0),
)


def chaos_policy(config: ChaosConfig) -> TimingPolicy:
    """OSAC's shape in seconds. Install and unbinding timeouts leave room for a killed worker's
    activities to time out (at most a call timeout)."""
    return TimingPolicy(
        call_timeout=timedelta(seconds=config.call_timeout_s),
        wait_heartbeat_timeout=timedelta(seconds=config.wait_heartbeat_timeout_s),
        agent_registration_timeout=timedelta(seconds=config.agent_registration_timeout_s),
        agent_install_timeout=timedelta(seconds=240),
        agent_unbinding_timeout=timedelta(seconds=120),
        agent_watch_renewal=timedelta(seconds=5),
        transient_backoff=[timedelta(seconds=0.5), timedelta(seconds=1)],
        transient_backoff_cap=timedelta(seconds=2),
        no_hosts_backoff=[timedelta(seconds=2), timedelta(seconds=4)],
        no_hosts_backoff_cap=timedelta(seconds=5),
        registration_timeout_backoff=[timedelta(seconds=0.5)],
        registration_timeout_backoff_cap=timedelta(seconds=1),
        wipe_stuck_after=timedelta(seconds=10),
        prerequisite_recheck=timedelta(seconds=1),
        # Often, so the Ready workers' hosts are checked through the kills, restarts and 503s: no
        # host breaks here, so any worker told its host was lost is a false alarm (an invariant).
        ready_host_check=timedelta(seconds=5),
    )


# Slow enough that kills and restarts land inside allocation, boot and wipe.
CHAOS_BMAAS_TIMINGS = Timings(allocation_s=0.3, image_write_s=0.5, boot_s=1.0, wipe_s=1.5, deprovision_s=0.3)


@dataclass(frozen=True)
class Disruption:
    """One planned event of a phase: `at_s` seconds after the phase's command was sent."""

    at_s: float
    kind: str  # "kill" or "restart-temporal"
    restart_after_s: float = 0.0  # kill: how long the worker stays dead


@dataclass(frozen=True)
class LatencySpike:
    after_s: float  # quiet time before the spike
    lasts_s: float


@dataclass(frozen=True)
class ChaosPlan:
    seed: int
    disruptions: dict[Phase, list[Disruption]]
    spikes: list[LatencySpike]
    victim_pick: int  # seeds the choice of the hosts whose wipe fails
    bmaas_fault_seed: int
    hub_fault_seed: int
    agent_fault_seed: int
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        for phase, events in self.disruptions.items():
            if events:
                text = ", ".join(
                    f"{e.kind}@{e.at_s:.1f}s"
                    + (f"(down {e.restart_after_s:.1f}s)" if e.kind == "kill" else "")
                    for e in events
                )
                parts.append(f"{phase.value}: {text}")
        return "; ".join(parts)


def make_plan(config: ChaosConfig, seed: int) -> ChaosPlan:
    rng = random.Random(f"osac-chaos/{config.name}/{seed}")
    lo, hi = config.kill_window_s
    restart_phase = Phase.SCALE_UP if config.temporal_restarts else None
    disruptions: dict[Phase, list[Disruption]] = {}
    for phase in Phase:
        events: list[Disruption] = []
        at = 0.0
        for _ in range(config.kills.get(phase, 0)):
            at += rng.uniform(lo, hi)
            events.append(
                Disruption(at_s=round(at, 2), kind="kill", restart_after_s=round(rng.uniform(0.2, 3), 2))
            )
        if phase == restart_phase:
            restart_at = round(rng.uniform(lo, max(at, hi)), 2)
            events.append(Disruption(at_s=restart_at, kind="restart-temporal"))
        disruptions[phase] = sorted(events, key=lambda e: e.at_s)
    spikes = [
        LatencySpike(after_s=round(rng.uniform(3, 12), 2), lasts_s=round(rng.uniform(1, 4), 2))
        for _ in range(200)
    ]
    return ChaosPlan(
        seed=seed,
        disruptions=disruptions,
        spikes=spikes,
        victim_pick=rng.randrange(2**31),
        bmaas_fault_seed=rng.randrange(2**31),
        hub_fault_seed=rng.randrange(2**31),
        agent_fault_seed=rng.randrange(2**31),
    )
