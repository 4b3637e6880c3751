"""Metadata-only representations (`Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`),
what client-go's metadata client asks for: every object reduced to its `metadata`, so a client that
needs names, labels and resourceVersions does not pay for specs and statuses."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

API_VERSION = "meta.k8s.io/v1"
OBJECT = "PartialObjectMetadata"
LIST = "PartialObjectMetadataList"


def _asks_for(accept: str, kind: str) -> bool:
    for part in accept.split(","):
        params = {}
        for param in part.split(";")[1:]:
            key, _, value = param.strip().partition("=")
            params[key] = value
        if params.get("as") == kind and params.get("g", "meta.k8s.io") == "meta.k8s.io":
            return True
    return False


def wants_object(accept: str) -> bool:
    return _asks_for(accept, OBJECT)


def wants_list(accept: str) -> bool:
    return _asks_for(accept, LIST)


def partial_object(obj: Obj) -> Obj:
    return {"kind": OBJECT, "apiVersion": API_VERSION, "metadata": obj.get("metadata", {})}


def partial_list(listed: Obj) -> Obj:
    return {
        "kind": LIST,
        "apiVersion": API_VERSION,
        "metadata": listed.get("metadata", {}),
        "items": [partial_object(item) for item in listed.get("items", [])],
    }
