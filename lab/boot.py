"""The seam where the fulfillment twin's hosts meet whatever runs on them.

When the fulfillment twin boots a host it hands the host and its BMI's `user_data` to a `BootSeam`.
Real hardware would execute the ignition; the hub twin plugs in an implementation that does what a
discovery ignition does (register an agent with the InfraEnv it names). Anything else registers
nothing, exactly like real hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class BootedHost:
    host_id: str
    macs: tuple[str, ...]  # lowercase colon form, every NIC of the host
    labels: Mapping[str, str] = field(default_factory=dict)


class BootSeam(Protocol):
    async def boot(self, host: BootedHost, user_data: str) -> None: ...


@dataclass
class RecordingBootSeam:
    """Remembers what was booted; the default when no hub is attached."""

    boots: list[tuple[BootedHost, int]] = field(default_factory=list)

    async def boot(self, host: BootedHost, user_data: str) -> None:
        # Keep only the size: user data carries secrets and must not sit in memory dumps or logs.
        self.boots.append((host, len(user_data.encode())))
