"""The seam where the fulfillment twin's hosts meet whatever runs on them.

When the fulfillment twin boots a host it hands the host and its BMI's `user_data` to a `BootSeam`.
Real hardware would execute the ignition; the hub twin plugs in an implementation that does what a
discovery ignition does (register an agent with the InfraEnv it names). Anything else registers
nothing, exactly like real hardware.

When the BMI is deleted the twin powers the host off for its wipe and tells the seam (`halt`): from
then on nothing the host booted runs, so nothing may register from it any more.
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

    def halt(self, host_id: str) -> None:
        """The host stopped running what it booted (powered off for its wipe).

        Synchronous and callable from any thread: the fulfillment twin may run on another event
        loop than whatever runs on its hosts.
        """
        ...


@dataclass
class RecordingBootSeam:
    """Remembers what was booted and halted; the default when no hub is attached."""

    boots: list[tuple[BootedHost, int]] = field(default_factory=list)
    halted: list[str] = field(default_factory=list)

    async def boot(self, host: BootedHost, user_data: str) -> None:
        # Keep only the size: user data carries secrets and must not sit in memory dumps or logs.
        self.boots.append((host, len(user_data.encode())))

    def halt(self, host_id: str) -> None:
        self.halted.append(host_id)
