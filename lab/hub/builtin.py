"""The core/v1 kinds the hub serves (namespaces, secrets, events), with schemas written for the twin.

Real servers decode these into Go structs; a structural schema with the same fields gives the same
effect here (unknown fields dropped, wrong types rejected).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lab.hub.resources import PrinterColumn, ResourceType
from lab.hub.schema import CrdSchema

_STRING = {"type": "string"}
_TIME = {"type": "string", "format": "date-time"}
_STRING_MAP = {"type": "object", "additionalProperties": _STRING}

_OBJECT_REFERENCE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": _STRING,
        "kind": _STRING,
        "name": _STRING,
        "namespace": _STRING,
        "uid": _STRING,
        "resourceVersion": _STRING,
        "fieldPath": _STRING,
    },
}

_CONDITION: dict[str, Any] = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": _STRING,
        "status": _STRING,
        "lastTransitionTime": _TIME,
        "reason": _STRING,
        "message": _STRING,
    },
}

NAMESPACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": _STRING,
        "kind": _STRING,
        "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {"finalizers": {"type": "array", "items": _STRING}}},
        "status": {
            "type": "object",
            "properties": {
                "phase": {"type": "string", "enum": ["Active", "Terminating"]},
                "conditions": {"type": "array", "items": _CONDITION},
            },
        },
    },
}

SECRET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": _STRING,
        "kind": _STRING,
        "metadata": {"type": "object"},
        "data": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
        "stringData": _STRING_MAP,
        "type": _STRING,
        "immutable": {"type": "boolean"},
    },
}

EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["involvedObject"],
    "properties": {
        "apiVersion": _STRING,
        "kind": _STRING,
        "metadata": {"type": "object"},
        "involvedObject": _OBJECT_REFERENCE,
        "reason": _STRING,
        "message": _STRING,
        "source": {"type": "object", "properties": {"component": _STRING, "host": _STRING}},
        "firstTimestamp": {**_TIME, "nullable": True},
        "lastTimestamp": {**_TIME, "nullable": True},
        "count": {"type": "integer", "format": "int32"},
        "type": {"type": "string", "enum": ["Normal", "Warning"]},
        "eventTime": {**_TIME, "nullable": True},
        "series": {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "lastObservedTime": _TIME},
        },
        "action": _STRING,
        "related": _OBJECT_REFERENCE,
        "reportingComponent": _STRING,
        "reportingInstance": _STRING,
    },
}


def age(timestamp: str | None) -> str:
    """A timestamp's age the way the apiserver prints it (apimachinery's HumanDuration)."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return human_duration(int((datetime.now(UTC) - then).total_seconds()))


def human_duration(seconds: int) -> str:
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _age_cell(obj: dict[str, Any]) -> str:
    return age(obj.get("metadata", {}).get("creationTimestamp"))


def _event_last_seen(obj: dict[str, Any]) -> str:
    stamp = (
        obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("metadata", {}).get("creationTimestamp")
    )
    return age(stamp)


def _event_object(obj: dict[str, Any]) -> str:
    ref = obj.get("involvedObject") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _event_source(obj: dict[str, Any]) -> str:
    source = obj.get("source") or {}
    text = source.get("component") or obj.get("reportingComponent") or ""
    if source.get("host"):
        text = f"{text}, {source['host']}"
    return str(text)


def _name(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def builtin_types() -> list[ResourceType]:
    name_col = PrinterColumn("Name", "string", func=_name, format="name")
    age_col = PrinterColumn("Age", "string", func=_age_cell)
    return [
        ResourceType(
            group="",
            version="v1",
            kind="Namespace",
            plural="namespaces",
            singular="namespace",
            namespaced=False,
            short_names=("ns",),
            has_status=True,
            schemas=[CrdSchema(NAMESPACE_SCHEMA, "builtin")],
            printer_columns=[
                name_col,
                PrinterColumn("Status", "string", func=lambda o: o.get("status", {}).get("phase", "")),
                age_col,
            ],
            selectable_fields={"status.phase": "status.phase"},
            builtin=True,
            tracks_generation=False,
        ),
        ResourceType(
            group="",
            version="v1",
            kind="Secret",
            plural="secrets",
            singular="secret",
            namespaced=True,
            schemas=[CrdSchema(SECRET_SCHEMA, "builtin")],
            printer_columns=[
                name_col,
                PrinterColumn("Type", "string", func=lambda o: o.get("type", "")),
                PrinterColumn("Data", "string", func=lambda o: len(o.get("data") or {})),
                age_col,
            ],
            selectable_fields={"type": "type"},
            builtin=True,
            allow_unconditional_update=True,
            tracks_generation=False,
        ),
        ResourceType(
            group="",
            version="v1",
            kind="Event",
            plural="events",
            singular="event",
            namespaced=True,
            short_names=("ev",),
            schemas=[CrdSchema(EVENT_SCHEMA, "builtin")],
            printer_columns=[
                PrinterColumn("Last Seen", "string", func=_event_last_seen),
                PrinterColumn("Type", "string", func=lambda o: o.get("type", "")),
                PrinterColumn("Reason", "string", func=lambda o: o.get("reason", "")),
                PrinterColumn("Object", "string", func=_event_object),
                PrinterColumn(
                    "Subobject",
                    "string",
                    priority=1,
                    func=lambda o: (o.get("involvedObject") or {}).get("fieldPath", ""),
                ),
                PrinterColumn("Source", "string", priority=1, func=_event_source),
                PrinterColumn("Message", "string", func=lambda o: o.get("message", "")),
                PrinterColumn(
                    "First Seen",
                    "string",
                    priority=1,
                    func=lambda o: age(o.get("firstTimestamp") or o.get("eventTime")),
                ),
                PrinterColumn("Count", "string", priority=1, func=lambda o: o.get("count", 1)),
                PrinterColumn("Name", "string", priority=1, func=_name, format="name"),
            ],
            selectable_fields={
                **{f"involvedObject.{f}": f"involvedObject.{f}" for f in _OBJECT_REFERENCE["properties"]},
                "reason": "reason",
                "reportingComponent": "reportingComponent",
                "source": "source.component",
                "type": "type",
            },
            builtin=True,
            allow_create_on_update=True,
            allow_unconditional_update=True,
            tracks_generation=False,
        ),
    ]
