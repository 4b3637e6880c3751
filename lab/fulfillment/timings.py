"""How long each step of a BareMetalInstance's life takes in the twin.

Three profiles: `demo` (every step at most about 2 s, the default), `realistic` (OSAC-like: a worker's
host is up about 6 minutes after the BMI is created, a wipe takes about 10 minutes) and `zero` (no
waiting at all, for benchmarks and tests). Each duration can be overridden on its own. A step reads
its duration from the `TimingClock`, and a step already waiting re-reads it when the timings change,
so `PATCH /lab/v1/timings {"wipe_s": 0}` also finishes the wipes in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class TimingProfile(StrEnum):
    DEMO = "demo"
    REALISTIC = "realistic"
    ZERO = "zero"


class Timings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allocation_s: float = Field(default=0.0, ge=0, description="create until a host is picked")
    image_write_s: float = Field(default=0.0, ge=0, description="writing the disk image and user data")
    boot_s: float = Field(default=0.0, ge=0, description="power-on until the host boots its ignition")
    wipe_s: float = Field(default=0.0, ge=0, description="sanitising a released host (disk wipe)")
    deprovision_s: float = Field(default=0.0, ge=0, description="removing a BMI that never got a host")

    @classmethod
    def for_profile(cls, profile: TimingProfile) -> Timings:
        return _PROFILES[profile].model_copy()

    def with_overrides(self, overrides: dict[str, float]) -> Timings:
        return Timings.model_validate({**self.model_dump(), **overrides})


_PROFILES: dict[TimingProfile, Timings] = {
    TimingProfile.DEMO: Timings(
        allocation_s=0.5, image_write_s=1.5, boot_s=2.0, wipe_s=2.0, deprovision_s=0.5
    ),
    TimingProfile.REALISTIC: Timings(
        allocation_s=15.0, image_write_s=150.0, boot_s=180.0, wipe_s=600.0, deprovision_s=10.0
    ),
    TimingProfile.ZERO: Timings(),
}


class TimingClock:
    """The current timings, and waits that follow changes made while they run."""

    def __init__(self, timings: Timings) -> None:
        self._timings = timings
        self._changed = asyncio.Event()

    @property
    def current(self) -> Timings:
        return self._timings

    def set(self, timings: Timings) -> None:
        self._timings = timings
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, duration_of: Callable[[Timings], float]) -> None:
        """Wait until `duration_of(current timings)` seconds have passed since the call."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while (remaining := started + duration_of(self._timings) - loop.time()) > 0:
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return
