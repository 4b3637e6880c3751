"""The kinds the hub serves: resource types, the registry, and loading CustomResourceDefinitions."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.hub.schema import CrdSchema

CellFunc = Callable[[dict[str, Any]], Any]

# Verbs every served kind supports; real servers list them in discovery in this order.
RESOURCE_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")

PACKAGED_CRD_DIR = Path(__file__).resolve().parent.parent / "crds"


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str = ""
    description: str = ""
    priority: int = 0
    format: str = ""
    # Built-in kinds compute some cells in code (e.g. a Secret's DATA count), as kube-apiserver does.
    func: CellFunc | None = None


@dataclass(frozen=True)
class ScaleSpec:
    """A CRD's scale subresource: where replicas live (dotted paths without the leading dot)."""

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str = ""


@dataclass(eq=False)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    list_kind: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status: bool = False
    scale: ScaleSpec | None = None
    schemas: list[CrdSchema] = field(default_factory=list)
    printer_columns: list[PrinterColumn] = field(default_factory=list)
    # Extra field-selector labels beyond metadata.name/metadata.namespace, mapped to dotted paths.
    selectable_fields: dict[str, str] = field(default_factory=dict)
    builtin: bool = False
    # Behaviour that differs between built-in kinds and custom resources on a real server.
    allow_create_on_update: bool = False
    allow_unconditional_update: bool = False
    tracks_generation: bool = True

    def __post_init__(self) -> None:
        if not self.list_kind:
            self.list_kind = f"{self.kind}List"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`plural.group` (or just `plural` for the core group): how errors and stats name the kind."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    def base_path(self, namespace: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{namespace}/{self.plural}"
        return f"{root}/{self.plural}"

    def field_selector_paths(self) -> dict[str, str]:
        fields = {"metadata.name": "metadata.name"}
        if self.namespaced:
            fields["metadata.namespace"] = "metadata.namespace"
        fields.update(self.selectable_fields)
        return fields


class Registry:
    """Served resource types, indexed the ways discovery, routing and garbage collection need."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}

    def add(self, rt: ResourceType) -> ResourceType:
        existing = self._types.get(rt.key)
        if existing is None:
            self._types[rt.key] = rt
            self._by_kind[(rt.api_version, rt.kind)] = rt
            return rt
        if existing.kind != rt.kind or existing.namespaced != rt.namespaced:
            raise ValueError(f"conflicting definitions of {rt.group_resource}/{rt.version}")
        # Same kind defined twice (ours and the real CRD): objects must satisfy both schemas.
        existing.schemas.extend(rt.schemas)
        existing.has_status = existing.has_status or rt.has_status
        existing.scale = existing.scale or rt.scale
        if rt.printer_columns:
            existing.printer_columns = rt.printer_columns
        existing.selectable_fields.update(rt.selectable_fields)
        existing.short_names = tuple(dict.fromkeys([*existing.short_names, *rt.short_names]))
        existing.categories = tuple(dict.fromkeys([*existing.categories, *rt.categories]))
        return existing

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((api_version, kind))

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(self._types.values())

    def groups(self) -> dict[str, list[str]]:
        """Group name -> served versions, core group ("") included, in registration order."""
        out: dict[str, list[str]] = {}
        for rt in self._types.values():
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self._types.values() if rt.group == group and rt.version == version]

    # -- CRD loading -----------------------------------------------------------------------------

    def load_crd_paths(self, paths: Iterable[Path]) -> None:
        for path in paths:
            files = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")) if path.is_dir() else [path]
            for file in files:
                self.load_crd_file(file)

    def load_crd_file(self, path: Path) -> None:
        with path.open() as handle:
            for doc in yaml.safe_load_all(handle):
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                    for rt in resource_types_from_crd(doc, str(path)):
                        self.add(rt)


def resource_types_from_crd(crd: dict[str, Any], source: str) -> list[ResourceType]:
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        raw_schema = (version.get("schema") or {}).get("openAPIV3Schema") or {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        columns = [
            PrinterColumn(
                name=c["name"],
                type=c.get("type", "string"),
                json_path=c["jsonPath"],
                description=c.get("description", ""),
                priority=int(c.get("priority", 0)),
                format=c.get("format", ""),
            )
            for c in version.get("additionalPrinterColumns") or []
        ]
        scale = (version.get("subresources") or {}).get("scale")
        selectable = {
            f["jsonPath"].lstrip("."): f["jsonPath"].lstrip(".")
            for f in version.get("selectableFields") or []
        }
        out.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                kind=names["kind"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                list_kind=names.get("listKind") or f"{names['kind']}List",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                has_status="status" in (version.get("subresources") or {}),
                scale=None
                if not isinstance(scale, dict)
                else ScaleSpec(
                    spec_replicas_path=scale["specReplicasPath"].lstrip("."),
                    status_replicas_path=scale["statusReplicasPath"].lstrip("."),
                    label_selector_path=str(scale.get("labelSelectorPath") or "").lstrip("."),
                ),
                schemas=[CrdSchema(raw_schema, source)],
                printer_columns=columns,
                selectable_fields=selectable,
            )
        )
    return out
