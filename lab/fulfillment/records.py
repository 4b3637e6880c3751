"""The BareMetalInstance table: one record per live BMI, the only place BMI state is kept.

The record keeps what the API never answers: the user data (secret, only its size is ever logged),
the resolved instance type and the host the BMI holds. Every change goes through `changed()`, which
bumps `metadata.version` and publishes the watch event, so the version and the events never drift.
It also drops the record's cached renderings (`view()`), which List reuses until the next change.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import cel

from lab.fulfillment.celfilter import LIST_VARIABLE, activation
from lab.fulfillment.events import EventBus
from lab.fulfillment.models import BareMetalInstance, BmiState, EventType, render

PAYLOAD_FIELD = "bare_metal_instance"


class RecordView:
    """One rendering of a record's object at one version, with its CEL activation built on first use.

    Shared by every List until the record changes, so nobody may mutate `data`: answers hand out copies.
    """

    __slots__ = ("_activation", "data", "obj", "version")

    def __init__(self, obj: BareMetalInstance, data: dict[str, Any]) -> None:
        self.obj = obj
        self.version = obj.metadata.version
        self.data = data
        self._activation: cel.Context | None = None

    def is_current(self, obj: BareMetalInstance) -> bool:
        return self.obj is obj and self.version == obj.metadata.version

    def activation(self) -> cel.Context:
        if self._activation is None:
            self._activation = activation(LIST_VARIABLE, self.data)
        return self._activation


@dataclass(eq=False)
class BmiRecord:
    obj: BareMetalInstance  # `spec.user_data` is always None here
    user_data: str
    instance_type_id: str
    host_id: str | None = None
    task: asyncio.Task[None] | None = None
    deleting: bool = False
    # Cached renderings (private, public API); `InstanceTable.changed()` drops them.
    _views: dict[bool, RecordView] = field(default_factory=dict, init=False, repr=False)

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

    def view(self, public: bool) -> RecordView:
        """The object as the private (or public) API renders it now, rendered once per change.

        Besides the drop in `changed()`, a view is only reused for the same object at the same version,
        so a replaced `obj` or a bumped version can never be answered stale.
        """
        cached = self._views.get(public)
        if cached is not None and cached.is_current(self.obj):
            return cached
        data = render_public(self.obj) if public else render_private(self.obj)
        fresh = self._views[public] = RecordView(self.obj, data)
        return fresh

    def forget_views(self) -> None:
        self._views.clear()


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
        rec.forget_views()
        self._publish(EventType.UPDATED, rec)

    def remove(self, rec: BmiRecord) -> None:
        self._records.pop(rec.id, None)
        rec.forget_views()
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
