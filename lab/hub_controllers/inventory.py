"""Host inventories: what a discovery agent reports (REST, snake_case) and how the Agent CR shows it.

The agent side is deterministic per host id and MAC list, so a host that boots twice reports the
same hardware, as a real one does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from lab.hub_controllers.faults import normalise_mac

Inventory = dict[str, Any]


def _octet(seed: str, index: int) -> int:
    return hashlib.sha256(f"{seed}/{index}".encode()).digest()[0] % 200 + 20


def host_inventory(host_id: str, macs: Sequence[str], hostname: str | None = None) -> Inventory:
    """A plausible bare-metal inventory in the REST shape the real agent sends."""
    interfaces = []
    for index, mac in enumerate(macs):
        mac = normalise_mac(mac)
        interfaces.append(
            {
                "name": f"eno{index + 1}",
                "mac_address": mac,
                "ipv4_addresses": [f"10.{_octet(mac, 1)}.{_octet(mac, 2)}.{_octet(mac, 3)}/24"],
                "ipv6_addresses": [],
                "flags": ["up", "broadcast", "multicast"],
                "has_carrier": True,
                "mtu": 1500,
                "speed_mbps": 25000,
                "vendor": "0x15b3",
                "product": "0x1017",
                "biosdevname": f"em{index + 1}",
            }
        )
    return {
        "hostname": hostname or host_id,
        "interfaces": interfaces,
        "cpu": {
            "count": 32,
            "frequency": 2900,
            "architecture": "x86_64",
            "model_name": "Intel(R) Xeon(R) Gold 6326",
        },
        "memory": {"physical_bytes": 256 * 1024**3, "usable_bytes": 251 * 1024**3},
        "disks": [
            {
                "id": "/dev/disk/by-id/wwn-0x5002538e40a1b2c3",
                "name": "sda",
                "path": "/dev/sda",
                "by_id": "/dev/disk/by-id/wwn-0x5002538e40a1b2c3",
                "drive_type": "SSD",
                "size_bytes": 960 * 1000**3,
                "model": "SAMSUNG MZ7LH960",
                "vendor": "ATA",
                "bootable": True,
                "installation_eligibility": {"eligible": True, "not_eligible_reasons": []},
            }
        ],
        "boot": {"current_boot_mode": "uefi"},
        "system_vendor": {
            "manufacturer": "Dell Inc.",
            "product_name": "PowerEdge R650",
            "serial_number": hashlib.sha256(host_id.encode()).hexdigest()[:7].upper(),
            "virtual": False,
        },
    }


def inventory_macs(inventory: Inventory) -> list[str]:
    return [
        normalise_mac(i.get("mac_address", ""))
        for i in inventory.get("interfaces") or []
        if i.get("mac_address")
    ]


def to_agent_inventory(inventory: Inventory) -> dict[str, Any]:
    """REST inventory -> `status.inventory` of the Agent CR (camelCase, required lists present)."""
    cpu, memory = inventory.get("cpu") or {}, inventory.get("memory") or {}
    vendor, boot = inventory.get("system_vendor") or {}, inventory.get("boot") or {}
    result: dict[str, Any] = {
        "reportTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": inventory.get("hostname", ""),
        "interfaces": [
            {
                "name": i.get("name", ""),
                "macAddress": normalise_mac(i.get("mac_address", "")),
                "ipV4Addresses": list(i.get("ipv4_addresses") or []),
                "ipV6Addresses": list(i.get("ipv6_addresses") or []),
                "flags": list(i.get("flags") or []),
                "hasCarrier": bool(i.get("has_carrier", False)),
                "mtu": int(i.get("mtu", 1500)),
                "speedMbps": int(i.get("speed_mbps", 0)),
                "vendor": i.get("vendor", ""),
                "product": i.get("product", ""),
                "biosDevName": i.get("biosdevname", ""),
            }
            for i in inventory.get("interfaces") or []
        ],
        "cpu": {
            "count": int(cpu.get("count", 0)),
            "clockMegahertz": int(cpu.get("frequency", 0)),
            "architecture": cpu.get("architecture", "x86_64"),
            "modelName": cpu.get("model_name", ""),
        },
        "memory": {
            "physicalBytes": int(memory.get("physical_bytes", 0)),
            "usableBytes": int(memory.get("usable_bytes", 0)),
        },
        "disks": [
            {
                "id": d.get("id", d.get("path", "")),
                "name": d.get("name", ""),
                "path": d.get("path", ""),
                "byID": d.get("by_id", ""),
                "driveType": d.get("drive_type", ""),
                "sizeBytes": int(d.get("size_bytes", 0)),
                "model": d.get("model", ""),
                "vendor": d.get("vendor", ""),
                "bootable": bool(d.get("bootable", False)),
                "installationEligibility": {
                    "eligible": bool((d.get("installation_eligibility") or {}).get("eligible", True)),
                    "notEligibleReasons": list(
                        (d.get("installation_eligibility") or {}).get("not_eligible_reasons") or []
                    ),
                },
            }
            for d in inventory.get("disks") or []
        ],
        "boot": {"currentBootMode": boot.get("current_boot_mode", "")},
        "systemVendor": {
            "manufacturer": vendor.get("manufacturer", ""),
            "productName": vendor.get("product_name", ""),
            "serialNumber": vendor.get("serial_number", ""),
            "virtual": bool(vendor.get("virtual", False)),
        },
    }
    return result
