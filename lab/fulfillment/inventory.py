"""The twin's physical hosts: labels, NICs and who holds them.

Host JSON (`/lab/v1/hosts`): `{"id", "labels", "nics": [{"name", "mac", "role"}], "state", "bmi_id",
"quarantine_reason"}` with `state` one of FREE, ALLOCATED, WIPING, QUARANTINED. MACs are lowercase
colon form and unique across the inventory. Callers hold the lab's lock around allocate/release; the
methods themselves never await, so each state change is atomic on the event loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.fulfillment.errors import ApiError
from lab.fulfillment.models import PortRole

# A NIC's hardware address as BMaaS may report it: Ethernet's 6 bytes, EUI-64's 8, or
# IP-over-InfiniBand's 20 (GPU hosts' fabrics).
MAC = re.compile(r"^[0-9a-f]{2}((:[0-9a-f]{2}){5}|(:[0-9a-f]{2}){7}|(:[0-9a-f]{2}){19})$")

# The two ports every generated host has; the seeded instance types describe the same ports.
MANAGEMENT_PORT = "mgmt-0"
FABRIC_PORT = "data-0"


class HostState(StrEnum):
    FREE = "FREE"
    ALLOCATED = "ALLOCATED"
    WIPING = "WIPING"
    QUARANTINED = "QUARANTINED"


class HostNic(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    mac: str
    role: PortRole = PortRole.FABRIC

    @field_validator("mac")
    @classmethod
    def _normalise_mac(cls, value: str) -> str:
        mac = value.strip().lower().replace("-", ":")
        if not MAC.match(mac):
            raise ValueError(
                f"{value!r} is not a MAC address (aa:bb:cc:dd:ee:ff; 8 or 20 bytes for EUI-64 or InfiniBand)"
            )
        return mac


class NewHost(BaseModel):
    """Body of `POST /lab/v1/hosts`: without `nics` the host gets a management and a fabric NIC."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
    labels: dict[str, str] = Field(default_factory=dict)
    nics: list[HostNic] | None = None

    @field_validator("nics")
    @classmethod
    def _one_fabric_port(cls, nics: list[HostNic] | None) -> list[HostNic] | None:
        if nics is not None and not any(n.role == PortRole.FABRIC for n in nics):
            raise ValueError("a host needs at least one NIC with role 'fabric'")
        return nics


class Host(BaseModel):
    id: str
    labels: dict[str, str]
    nics: list[HostNic]
    state: HostState = HostState.FREE
    bmi_id: str | None = None
    quarantine_reason: str | None = None

    @property
    def macs(self) -> tuple[str, ...]:
        return tuple(n.mac for n in self.nics)


class Inventory:
    def __init__(self) -> None:
        self._hosts: dict[str, Host] = {}
        self._macs: set[str] = set()
        self._next_mac = 1
        self._next_id = 1

    def all(self) -> list[Host]:
        return list(self._hosts.values())

    def __len__(self) -> int:
        return len(self._hosts)

    def get(self, host_id: str) -> Host | None:
        return self._hosts.get(host_id)

    def _fresh_mac(self) -> str:
        # Locally administered unicast prefix 02:5f; skips MACs a caller added by hand.
        while True:
            n, self._next_mac = self._next_mac, self._next_mac + 1
            mac = "02:5f:" + ":".join(f"{(n >> shift) & 0xFF:02x}" for shift in (24, 16, 8, 0))
            if mac not in self._macs:
                return mac

    def _fresh_id(self) -> str:
        while True:
            n, self._next_id = self._next_id, self._next_id + 1
            host_id = f"host-{n:03d}"
            if host_id not in self._hosts:
                return host_id

    def add(self, new: NewHost) -> Host:
        host_id = new.id or self._fresh_id()
        if host_id in self._hosts:
            raise ApiError.already_exists(f"host '{host_id}' already exists")
        if new.nics is None:
            nics = [
                HostNic(name=MANAGEMENT_PORT, mac=self._fresh_mac(), role=PortRole.MANAGEMENT),
                HostNic(name=FABRIC_PORT, mac=self._fresh_mac(), role=PortRole.FABRIC),
            ]
        else:
            nics = list(new.nics)
        macs = [n.mac for n in nics]
        clashes = sorted({m for m in macs if m in self._macs or macs.count(m) > 1})
        if clashes:
            raise ApiError.already_exists(f"nics: MAC {', '.join(clashes)} already in the inventory")
        host = Host(id=host_id, labels=dict(new.labels), nics=nics)
        self._hosts[host_id] = host
        self._macs.update(macs)
        return host

    def allocate(self, selector: Mapping[str, str], bmi_id: str) -> Host | None:
        """Give the first free host whose labels contain every selector pair to `bmi_id`."""
        for host in self._hosts.values():
            if host.state == HostState.FREE and all(host.labels.get(k) == v for k, v in selector.items()):
                host.state, host.bmi_id = HostState.ALLOCATED, bmi_id
                return host
        return None

    def start_wipe(self, host_id: str) -> Host:
        host = self._hosts[host_id]
        host.state = HostState.WIPING
        return host

    def release(self, host_id: str) -> Host:
        host = self._hosts[host_id]
        if host.state == HostState.QUARANTINED:
            raise RuntimeError(f"quarantined host {host_id} must never be released")
        host.state, host.bmi_id = HostState.FREE, None
        return host

    def quarantine(self, host_id: str, reason: str) -> Host:
        host = self._hosts[host_id]
        host.state, host.quarantine_reason = HostState.QUARANTINED, reason
        return host
