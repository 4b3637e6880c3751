"""The BareMetalInstance table: one record per live BMI, the only place BMI state is kept.

The record keeps what the API never answers: the user data (secret, only its size is ever logged),
the resolved instance type and the host the BMI holds. Every change goes through `changed()`, which
bumps `metadata.version` and publishes the watch event, so the version and the events never drift.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from lab.fulfillment.events import EventBus
from lab.fulfillment.models import BareMetalInstance, BmiState, EventType, render

PAYLOAD_FIELD = "bare_metal_instance"


@dataclass(eq=False)
class BmiRecord:
    obj: BareMetalInstance  # `spec.user_data` is always None here
    user_data: str
    instance_type_id: str
    host_id: str | None = None
    task: asyncio.Task[None] | None = None
    deleting: bool = False

    @property
    def id(self) -> str:
        return self.obj.id

    @property
    def name(self) -> str:
        return self.obj.metadata.name

    @property
    def state(self) -> BmiState:
        return self.obj.status.state

    def key(self) -> tuple[str, str, str]:
        m = self.obj.metadata
        return (m.tenant, m.project, m.name)


class InstanceTable:
    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._records: dict[str, BmiRecord] = {}

    def all(self) -> list[BmiRecord]:
        return list(self._records.values())

    def get(self, bmi_id: str) -> BmiRecord | None:
        return self._records.get(bmi_id)

    def by_key(self, key: tuple[str, str, str]) -> BmiRecord | None:
        return next((r for r in self._records.values() if r.key() == key), None)

    def add(self, rec: BmiRecord) -> None:
        self._records[rec.id] = rec
        self._publish(EventType.CREATED, rec)

    def changed(self, rec: BmiRecord) -> None:
        rec.obj.metadata.version += 1
        self._publish(EventType.UPDATED, rec)

    def remove(self, rec: BmiRecord) -> None:
        self._records.pop(rec.id, None)
        self._publish(EventType.DELETED, rec)

    def _publish(self, event_type: EventType, rec: BmiRecord) -> None:
        self._bus.publish(event_type, PAYLOAD_FIELD, render_private(rec.obj))


def render_private(obj: BareMetalInstance) -> dict[str, Any]:
    return render(obj)


def render_public(obj: BareMetalInstance) -> dict[str, Any]:
    data = render(obj)
    # `status.hub` is a private-API field.
    data["status"] = {k: v for k, v in data.get("status", {}).items() if k != "hub"}
    return data
