"""OpenAPI v3 documents (`/openapi/v3` and one per group-version).

kubectl apply/create/patch look here for the kind's PATCH operation carrying
`x-kubernetes-group-version-kind` and a `fieldValidation` query parameter: finding it, they leave
validation to the server (`fieldValidation=Strict`) instead of downloading `/openapi/v2`.
`kubectl explain` reads the component schemas.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from lab.hub.resources import Registry, ResourceType

Obj = dict[str, Any]

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_REF = "#/components/schemas/"

_OBJECT_META: Obj = {
    "description": "ObjectMeta is metadata that all persisted resources must have.",
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer", "format": "int64"},
        "creationTimestamp": {"type": "string", "format": "date-time"},
        "deletionTimestamp": {"type": "string", "format": "date-time"},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
        "finalizers": {
            "type": "array",
            "items": {"type": "string", "default": ""},
            "x-kubernetes-patch-strategy": "merge",
        },
        "ownerReferences": {
            "type": "array",
            "items": {"allOf": [{"$ref": f"{_REF}{META}.OwnerReference"}], "default": {}},
            "x-kubernetes-patch-merge-key": "uid",
            "x-kubernetes-patch-strategy": "merge",
        },
    },
}

_OWNER_REFERENCE: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "name", "uid"],
    "properties": {
        "apiVersion": {"type": "string", "default": ""},
        "kind": {"type": "string", "default": ""},
        "name": {"type": "string", "default": ""},
        "uid": {"type": "string", "default": ""},
        "controller": {"type": "boolean"},
        "blockOwnerDeletion": {"type": "boolean"},
    },
    "x-kubernetes-map-type": "atomic",
}

_LIST_META: Obj = {
    "type": "object",
    "properties": {
        "continue": {"type": "string"},
        "remainingItemCount": {"type": "integer", "format": "int64"},
        "resourceVersion": {"type": "string"},
    },
}

_STATUS: Obj = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "code": {"type": "integer", "format": "int32"},
        "message": {"type": "string"},
        "reason": {"type": "string"},
        "status": {"type": "string"},
        "details": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "metadata": {"allOf": [{"$ref": f"{_REF}{META}.ListMeta"}], "default": {}},
    },
    "x-kubernetes-group-version-kind": [{"group": "", "kind": "Status", "version": "v1"}],
}

_WATCH_EVENT: Obj = {
    "type": "object",
    "required": ["type", "object"],
    "properties": {"type": {"type": "string"}, "object": {"type": "object"}},
}

_DELETE_OPTIONS: Obj = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "dryRun": {"type": "array", "items": {"type": "string"}},
        "gracePeriodSeconds": {"type": "integer", "format": "int64"},
        "propagationPolicy": {"type": "string"},
        "preconditions": {
            "type": "object",
            "properties": {"resourceVersion": {"type": "string"}, "uid": {"type": "string"}},
        },
    },
}


def _query(name: str, description: str, type_: str = "string") -> Obj:
    return {
        "name": name,
        "in": "query",
        "description": description,
        "schema": {"type": type_, "uniqueItems": True},
    }


_P_DRY_RUN = _query("dryRun", "When present, indicates that modifications should not be persisted.")
_P_FIELD_MANAGER = _query(
    "fieldManager", "fieldManager is a name associated with the actor or entity making these changes."
)
_P_FIELD_VALIDATION = _query(
    "fieldValidation",
    "fieldValidation instructs the server on how to handle objects in the request containing unknown or "
    "duplicate fields. Valid values are: Ignore, Warn (the default) and Strict.",
)
_P_FORCE = _query("force", 'Force is going to "force" Apply requests.', "boolean")
_LIST_PARAMS = [
    _query(
        "allowWatchBookmarks", 'allowWatchBookmarks requests watch events with type "BOOKMARK".', "boolean"
    ),
    _query("continue", "The continue option should be set when retrieving more results from the server."),
    _query("fieldSelector", "A selector to restrict the list of returned objects by their fields."),
    _query("labelSelector", "A selector to restrict the list of returned objects by their labels."),
    _query("limit", "limit is a maximum number of responses to return for a list call.", "integer"),
    _query(
        "resourceVersion",
        "resourceVersion sets a constraint on what resource versions a request may be served from.",
    ),
    _query(
        "resourceVersionMatch",
        "resourceVersionMatch determines how resourceVersion is applied to list calls.",
    ),
    _query("sendInitialEvents", "`sendInitialEvents=true` may be set together with `watch=true`.", "boolean"),
    _query("timeoutSeconds", "Timeout for the list/watch call.", "integer"),
    _query("watch", "Watch for changes to the described resources.", "boolean"),
]
_PATH_NAME = {
    "name": "name",
    "in": "path",
    "description": "name of the object",
    "required": True,
    "schema": {"type": "string", "uniqueItems": True},
}
_PATH_NAMESPACE = {
    "name": "namespace",
    "in": "path",
    "description": "object name and auth scope",
    "required": True,
    "schema": {"type": "string", "uniqueItems": True},
}
_P_PRETTY = _query("pretty", "If 'true', then the output is pretty printed.")


def schema_name(rt: ResourceType, kind: str | None = None) -> str:
    """Kubernetes' naming of definitions: reversed group domain, version, kind."""
    kind = kind or rt.kind
    if not rt.group:
        return f"io.k8s.api.core.{rt.version}.{kind}"
    return ".".join(reversed(rt.group.split("."))) + f".{rt.version}.{kind}"


def _content(ref: str) -> Obj:
    schema = {"$ref": f"{_REF}{ref}"}
    return {
        "application/json": {"schema": schema},
        "application/yaml": {"schema": schema},
    }


def _responses(ref: str, *codes: str) -> Obj:
    return {
        code: {"description": "OK" if code == "200" else "Created", "content": _content(ref)}
        for code in codes
    }


def _gvk(rt: ResourceType) -> Obj:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _operation(
    rt: ResourceType,
    action: str,
    op_id: str,
    ref: str,
    params: list[Obj],
    codes: tuple[str, ...],
    body: Obj | None = None,
) -> Obj:
    op: Obj = {
        "tags": [rt.api_version.replace("/", "_").replace(".", "")],
        "description": f"{action} {rt.kind}",
        "operationId": op_id,
        "parameters": params,
        "responses": _responses(ref, *codes),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(rt),
    }
    if body is not None:
        op["requestBody"] = body
    return op


def _patch_body(rt: ResourceType) -> Obj:
    # kubectl apply sends a strategic merge patch only where the document lists its media type: as on a
    # real server, built-in kinds do and custom resources do not (they get a JSON merge patch).
    schema = {"$ref": f"{_REF}{META}.Patch"}
    types = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
    if rt.builtin:
        types.insert(2, "application/strategic-merge-patch+json")
    return {"content": {t: {"schema": schema} for t in types}, "required": True}


def _paths(rt: ResourceType) -> Obj:
    kind_ref, list_ref = schema_name(rt), schema_name(rt, rt.list_kind)
    scope = "Namespaced" if rt.namespaced else ""
    root = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    collection = f"{root}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{root}/{rt.plural}"
    item = f"{collection}/{{name}}"
    body = {"content": _content(kind_ref), "required": True}
    write = [_P_DRY_RUN, _P_FIELD_MANAGER, _P_FIELD_VALIDATION]
    common = [_PATH_NAMESPACE, _P_PRETTY] if rt.namespaced else [_P_PRETTY]
    paths: Obj = {
        collection: {
            "get": _operation(rt, "list", f"list{scope}{rt.kind}", list_ref, _LIST_PARAMS, ("200",)),
            "post": _operation(rt, "post", f"create{scope}{rt.kind}", kind_ref, write, ("200", "201"), body),
            "delete": _operation(
                rt,
                "deletecollection",
                f"deletecollection{scope}{rt.kind}",
                f"{META}.Status",
                [*_LIST_PARAMS, _P_DRY_RUN],
                ("200",),
            ),
            "parameters": common,
        },
        item: {
            "get": _operation(rt, "get", f"read{scope}{rt.kind}", kind_ref, [], ("200",)),
            "put": _operation(rt, "put", f"replace{scope}{rt.kind}", kind_ref, write, ("200", "201"), body),
            "patch": _operation(
                rt,
                "patch",
                f"patch{scope}{rt.kind}",
                kind_ref,
                [*write, _P_FORCE],
                ("200", "201"),
                _patch_body(rt),
            ),
            "delete": _operation(
                rt,
                "delete",
                f"delete{scope}{rt.kind}",
                f"{META}.Status",
                [
                    _P_DRY_RUN,
                    _query("propagationPolicy", "Whether and how garbage collection will be performed."),
                ],
                ("200",),
            ),
            "parameters": [_PATH_NAME, *common],
        },
    }
    if rt.has_status:
        paths[f"{item}/status"] = {
            "get": _operation(rt, "get", f"read{scope}{rt.kind}Status", kind_ref, [], ("200",)),
            "put": _operation(
                rt, "put", f"replace{scope}{rt.kind}Status", kind_ref, write, ("200", "201"), body
            ),
            "patch": _operation(
                rt,
                "patch",
                f"patch{scope}{rt.kind}Status",
                kind_ref,
                [*write, _P_FORCE],
                ("200", "201"),
                _patch_body(rt),
            ),
            "parameters": [_PATH_NAME, *common],
        }
    if rt.namespaced:
        paths[f"{root}/{rt.plural}"] = {
            "get": _operation(rt, "list", f"list{rt.kind}ForAllNamespaces", list_ref, _LIST_PARAMS, ("200",)),
            "parameters": [_P_PRETTY],
        }
    return paths


def _kind_schema(rt: ResourceType) -> Obj:
    # The last schema loaded is the most authoritative one (the real CRD when crd_dirs supplies it).
    schema: Obj = copy.deepcopy(rt.schemas[-1].raw) if rt.schemas else {"type": "object"}
    props: Obj = schema.setdefault("properties", {})
    props["metadata"] = {"allOf": [{"$ref": f"{_REF}{META}.ObjectMeta"}], "default": {}}
    props.setdefault("apiVersion", {"type": "string"})
    props.setdefault("kind", {"type": "string"})
    schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
    return schema


def _list_schema(rt: ResourceType) -> Obj:
    return {
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "items": {"type": "array", "items": {"$ref": f"{_REF}{schema_name(rt)}"}},
            "metadata": {"allOf": [{"$ref": f"{_REF}{META}.ListMeta"}], "default": {}},
        },
        "x-kubernetes-group-version-kind": [{**_gvk(rt), "kind": rt.list_kind}],
    }


def group_version_document(registry: Registry, group: str, version: str, server_version: str) -> Obj | None:
    types = registry.in_group_version(group, version)
    if not types:
        return None
    paths: Obj = {}
    schemas: Obj = {
        f"{META}.ObjectMeta": _OBJECT_META,
        f"{META}.OwnerReference": _OWNER_REFERENCE,
        f"{META}.ListMeta": _LIST_META,
        f"{META}.Status": _STATUS,
        f"{META}.WatchEvent": _WATCH_EVENT,
        f"{META}.DeleteOptions": _DELETE_OPTIONS,
        f"{META}.Patch": {
            "type": "object",
            "description": "Patch is provided to give a concrete name and type to "
            "the Kubernetes PATCH request body.",
        },
    }
    for rt in types:
        paths.update(_paths(rt))
        schemas[schema_name(rt)] = _kind_schema(rt)
        schemas[schema_name(rt, rt.list_kind)] = _list_schema(rt)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": server_version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def document_key(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


class OpenApiDocs:
    """Documents are built once (the served kinds are fixed for the server's life) and hashed for caching."""

    def __init__(self, registry: Registry, server_version: str) -> None:
        self.documents: dict[str, bytes] = {}
        self.hashes: dict[str, str] = {}
        for group, versions in registry.groups().items():
            for version in versions:
                doc = group_version_document(registry, group, version, server_version)
                if doc is None:
                    continue
                key = document_key(group, version)
                data = json.dumps(doc, separators=(",", ":")).encode()
                self.documents[key] = data
                self.hashes[key] = hashlib.sha512(data).hexdigest()[:64].upper()

    def root(self) -> Obj:
        return {
            "paths": {
                key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={h}"} for key, h in self.hashes.items()
            }
        }
