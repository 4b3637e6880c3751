"""Configuration of the callers (controller, CLI, demo) beyond what `worker.settings` holds.

Everything shared with the worker (BMaaS URL and token file, KUBECONFIG, task queues, the
controller's namespaces and resync period) is read through `worker.settings.Settings`, so both
processes run from one environment. This adds what only callers decide: the timing policy the
controller gives every new workflow, and the per-order worker maximum its validator enforces.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from pathlib import Path

from pydantic import ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.worker import TimingPolicy
from contracts.workflows import DEFAULT_MAX_WORKERS_PER_ORDER
from worker.settings import ConfigError, env_variable


class TimingPreset(StrEnum):
    """Named timing policies: OSAC's production defaults, or one that fits the demo's lab timings."""

    PRODUCTION = "production"
    DEMO = "demo"


def _seconds(*values: float) -> list[timedelta]:
    return [timedelta(seconds=v) for v in values]


def demo_policy() -> TimingPolicy:
    """OSAC's shape, scaled to the lab's demo timings (a worker is Ready in about 15 s)."""
    return TimingPolicy(
        agent_registration_timeout=timedelta(seconds=90),
        agent_install_timeout=timedelta(seconds=180),
        agent_unbinding_timeout=timedelta(seconds=60),
        agent_watch_renewal=timedelta(seconds=20),
        transient_backoff=_seconds(1, 2, 4),
        transient_backoff_cap=timedelta(seconds=10),
        no_hosts_backoff=_seconds(2, 5, 10),
        no_hosts_backoff_cap=timedelta(seconds=15),
        registration_timeout_backoff=_seconds(2, 5),
        registration_timeout_backoff_cap=timedelta(seconds=10),
        attempt_reset_after_ready=timedelta(minutes=5),
        wipe_stuck_after=timedelta(minutes=2),
        prerequisite_recheck=timedelta(seconds=2),
    )


def _located(error: ErrorDetails) -> str:
    field = ".".join(str(part) for part in error["loc"])
    return f"{field}: {error['msg']}" if field else error["msg"]


PRESETS = {TimingPreset.PRODUCTION: TimingPolicy, TimingPreset.DEMO: demo_policy}


class _PolicyOverrides(TimingPolicy):
    """A file's overrides: a misspelt field is refused, not silently left at the preset's value."""

    model_config = ConfigDict(extra="forbid")


class StarterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OSAC_", extra="ignore")

    timing_policy: TimingPreset = Field(
        default=TimingPreset.PRODUCTION, description="policy given to every new workers workflow"
    )
    timing_policy_file: Path | None = Field(
        default=None, description="JSON of TimingPolicy fields overriding the preset's"
    )
    max_workers_per_order: int = Field(default=DEFAULT_MAX_WORKERS_PER_ORDER, gt=0)

    def policy(self) -> TimingPolicy:
        """The preset with the file's overrides; a file that cannot be read or is not a valid
        `TimingPolicy` is a `ConfigError` naming the variable, one line per problem."""
        base = PRESETS[self.timing_policy]()
        path = self.timing_policy_file
        if path is None:
            return base
        where = f"{env_variable(type(self), 'timing_policy_file')}={path}"
        try:
            text = path.read_text()
        except (OSError, ValueError) as err:  # missing, unreadable, a directory, not UTF-8
            raise ConfigError([f"{where}: cannot read it: {err}"]) from None
        try:
            overrides = _PolicyOverrides.model_validate_json(text)
        except ValidationError as err:
            raise ConfigError([f"{where}: {_located(e)}" for e in err.errors()]) from None
        policy = base.model_copy(update=overrides.model_dump(exclude_unset=True))
        if problems := policy.problems():
            raise ConfigError([f"{where}: {problem}" for problem in problems])
        return policy
