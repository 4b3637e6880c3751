"""Server-side printing (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), what `kubectl get` asks for.

Custom resources use their CRD's additionalPrinterColumns (evaluated with the simple JSONPath subset
CRDs allow); built-in kinds use the columns kube-apiserver prints for them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from lab.hub.builtin import age
from lab.hub.resources import PrinterColumn, ResourceType

Obj = dict[str, Any]

_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}
_AGE_COLUMN = PrinterColumn(
    "Age", "date", ".metadata.creationTimestamp", "CreationTimestamp is when this object was created."
)

_STEP = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_\-$]+)
    |\[(?P<index>-?\d+|\*)\]
    |\[\?\(@\.(?P<fpath>[A-Za-z0-9_.\-]+)\s*==\s*(?P<q>["'])(?P<fvalue>.*?)(?P=q)\)\]
    |\[(?P<q2>["'])(?P<key>.*?)(?P=q2)\]""",
    re.VERBOSE,
)


def wants_table(accept: str) -> bool:
    return any("as=Table" in part for part in accept.split(","))


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Evaluate `.a.b[0]`, `.a[*].b`, `.a[?(@.type=="X")].b` and `.a['k.with.dots']`."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if path.startswith("$"):
        path = path[1:]
    values: list[Any] = [obj]
    pos = 0
    while pos < len(path):
        match = _STEP.match(path, pos)
        if match is None:
            return []
        pos = match.end()
        nxt: list[Any] = []
        for value in values:
            if match.group("field") is not None or match.group("key") is not None:
                key = match.group("field") or match.group("key")
                if isinstance(value, dict) and key in value:
                    nxt.append(value[key])
            elif match.group("index") is not None:
                if isinstance(value, list):
                    if match.group("index") == "*":
                        nxt.extend(value)
                    else:
                        index = int(match.group("index"))
                        if -len(value) <= index < len(value):
                            nxt.append(value[index])
                elif isinstance(value, dict) and match.group("index") == "*":
                    nxt.extend(value.values())
            else:
                if isinstance(value, list):
                    for item in value:
                        found = jsonpath(item, "." + match.group("fpath"))
                        if found and str(found[0]) == match.group("fvalue"):
                            nxt.append(item)
        values = nxt
    return values


def _cell(column: PrinterColumn, obj: Obj) -> Any:
    if column.func is not None:
        return column.func(obj)
    found = jsonpath(obj, column.json_path)
    if not found:
        return None
    value = found[0]
    if column.type == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        return json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)
    if column.type == "integer":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if column.type == "number":
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if column.type == "boolean":
        return value if isinstance(value, bool) else None
    if column.type == "date":
        return age(value) if isinstance(value, str) else None
    return value


def _columns(rt: ResourceType) -> list[PrinterColumn]:
    if rt.builtin:
        return rt.printer_columns
    return rt.printer_columns or [_AGE_COLUMN]


def column_definitions(rt: ResourceType) -> list[Obj]:
    defs: list[Obj] = [] if rt.builtin else [dict(_NAME_COLUMN)]
    for column in _columns(rt):
        entry: Obj = {
            "name": column.name,
            "type": column.type,
            "format": column.format,
            "description": column.description,
            "priority": column.priority,
        }
        defs.append(entry)
    return defs


def _row(rt: ResourceType, obj: Obj, include_object: str) -> Obj:
    cells: list[Any] = [] if rt.builtin else [obj["metadata"].get("name", "")]
    cells.extend(_cell(c, obj) for c in _columns(rt))
    row: Obj = {"cells": cells}
    if include_object == "Object":
        row["object"] = obj
    elif include_object != "None":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
    return row


def table(rt: ResourceType, objects: list[Obj], list_meta: Obj, include_object: str = "Metadata") -> Obj:
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": column_definitions(rt),
        "rows": [_row(rt, obj, include_object) for obj in objects],
    }
