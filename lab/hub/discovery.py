"""Legacy discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`), which kubectl accepts."""

from __future__ import annotations

import hashlib
from typing import Any

from lab.hub.resources import RESOURCE_VERBS, SUBRESOURCE_VERBS, Registry, ResourceType

Obj = dict[str, Any]


def _group_version(group: str, version: str) -> Obj:
    return {"groupVersion": f"{group}/{version}", "version": version}


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def api_group(group: str, versions: list[str]) -> Obj:
    entries = [_group_version(group, v) for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def api_group_list(registry: Registry) -> Obj:
    groups = [api_group(g, vs) for g, vs in registry.groups().items() if g]
    for entry in groups:
        entry.pop("kind")
        entry.pop("apiVersion")
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _storage_hash(rt: ResourceType) -> str:
    return hashlib.sha256(f"{rt.group}/{rt.version}/{rt.kind}".encode()).hexdigest()[:12]


def api_resource_list(registry: Registry, group: str, version: str) -> Obj | None:
    types = registry.in_group_version(group, version)
    if not types:
        return None
    resources: list[Obj] = []
    for rt in types:
        entry: Obj = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(RESOURCE_VERBS),
            "storageVersionHash": _storage_hash(rt),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.scale is not None:
            resources.append(
                {
                    "name": f"{rt.plural}/scale",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": list(SUBRESOURCE_VERBS),
                }
            )
        if rt.has_status:
            resources.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": list(SUBRESOURCE_VERBS),
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
