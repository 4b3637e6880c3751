"""Admin-managed objects: BareMetalInstanceTypes, DiskImages, ClusterVersions, BMI catalog items, and
the Subnets and SecurityGroups a BMI's network attachment names.

One generic store per kind (CRUD, names unique per `(tenant, project, name)`, optimistic lock, events),
with per-kind hooks for validation, deletion guards and the public view. These objects are global
(tenant `""`) unless created otherwise; the public API only ever sees global ones and the caller's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from lab.fulfillment.errors import ApiError
from lab.fulfillment.events import EventBus
from lab.fulfillment.models import (
    CATALOG_NAME,
    SYSTEM_TENANT,
    BareMetalInstanceCatalogItem,
    BareMetalInstanceType,
    ClusterVersion,
    DiskImage,
    EventType,
    Resource,
    SecurityGroup,
    Subnet,
    render,
    utcnow,
)
from lab.fulfillment.objects import (
    Caller,
    apply_mask,
    as_object,
    check_lock,
    check_unchanged,
    merge_patch,
    new_id,
    parse_mask,
    stamp_new_metadata,
    strip_output_only,
    validate_as,
)

R = TypeVar("R", bound=Resource)


@dataclass
class KindHooks(Generic[R]):
    # Check (and normalise) an object before it is stored; raise ApiError naming the field.
    validate: Callable[[R], R] = lambda obj: obj
    # Why the object cannot be deleted now (referenced elsewhere), or None.
    in_use: Callable[[R], str | None] = lambda obj: None
    # The public API's view of a rendered object.
    public_view: Callable[[dict[str, Any]], dict[str, Any]] = lambda data: data
    # Name given when the creator left `metadata.name` empty; None means the name is required.
    default_name: Callable[[R], str] | None = None
    immutable: tuple[str, ...] = field(default_factory=tuple)  # dotted paths


class CatalogStore(Generic[R]):
    def __init__(self, kind: str, model: type[R], payload_field: str, bus: EventBus) -> None:
        self.kind = kind
        self.model = model
        self.payload_field = payload_field
        self.hooks: KindHooks[R] = KindHooks()
        self._bus = bus
        self._objects: dict[str, R] = {}

    # ------------------------------------------------------------------------------------ reading

    def all(self) -> list[R]:
        return list(self._objects.values())

    def visible(self, caller: Caller) -> list[R]:
        return [o for o in self._objects.values() if self._visible_to(o, caller)]

    @staticmethod
    def _visible_to(obj: Resource, caller: Caller) -> bool:
        if caller.is_admin:
            return True
        return obj.metadata.tenant != SYSTEM_TENANT and obj.metadata.tenant in ("", caller.tenant)

    def get(self, object_id: str, caller: Caller) -> R:
        obj = self._objects.get(object_id)
        if obj is None or not self._visible_to(obj, caller):
            raise ApiError.not_found(self.kind, object_id)
        return obj

    def by_id(self, object_id: str, caller: Caller) -> R | None:
        obj = self._objects.get(object_id)
        return obj if obj is not None and self._visible_to(obj, caller) else None

    def named(self, name: str, caller: Caller) -> list[R]:
        """Every object of that name the caller sees (names are unique per tenant and project)."""
        return [o for o in self.visible(caller) if o.metadata.name == name]

    def find(self, ref: str, caller: Caller) -> R | None:
        """By id, else by name (the way BMIs reference instance types and images)."""
        return self.by_id(ref, caller) or next(iter(self.named(ref, caller)), None)

    def render(self, obj: R, caller: Caller) -> dict[str, Any]:
        data = render(obj)
        return data if caller.is_admin else self.hooks.public_view(data)

    # ------------------------------------------------------------------------------------ writing

    def insert(self, obj: R) -> R:
        """Store a fully formed object (the seed); no validation beyond the model's."""
        self._objects[obj.id] = obj
        self._bus.publish(EventType.CREATED, self.payload_field, render(obj))
        return obj

    def _check_name(self, obj: R) -> R:
        name = obj.metadata.name
        if not name and self.hooks.default_name is not None:
            name = self.hooks.default_name(obj)
            obj = obj.model_copy(update={"metadata": obj.metadata.model_copy(update={"name": name})})
        if not CATALOG_NAME.match(name):
            raise ApiError.invalid(
                "metadata.name", f"'{name}' must be 1-63 lowercase letters, digits, '-', '.'"
            )
        m = obj.metadata
        for other in self._objects.values():
            if other.id != obj.id and (
                other.metadata.tenant,
                other.metadata.project,
                other.metadata.name,
            ) == (
                m.tenant,
                m.project,
                m.name,
            ):
                raise ApiError.already_exists(
                    f"{self.kind} '{m.name}' already exists in tenant '{m.tenant}' project '{m.project}'"
                )
        return obj

    def create(self, body: Any, caller: Caller) -> R:
        data = strip_output_only(as_object(body))
        obj = validate_as(self.model, data)
        tenant = obj.metadata.tenant if caller.is_admin else (caller.tenant or "")
        obj = obj.model_copy(
            update={"id": new_id(), "metadata": stamp_new_metadata(obj.metadata, tenant, "admin")}
        )
        obj = self.hooks.validate(self._check_name(obj))
        self._objects[obj.id] = obj
        self._bus.publish(EventType.CREATED, self.payload_field, render(obj))
        return obj

    def update(self, object_id: str, body: Any, caller: Caller, update_mask: str | None, lock: bool) -> R:
        current = self.get(object_id, caller)
        raw = as_object(body)
        check_lock(lock, raw, current.metadata.version)
        patch = strip_output_only(raw)
        validate_as(self.model, patch)  # type errors in the patch itself, named
        mask = parse_mask(update_mask)
        stored = current.model_dump(mode="json")
        merged = apply_mask(stored, patch, mask) if mask is not None else merge_patch(stored, patch)
        if merged["metadata"].get("tenant") != current.metadata.tenant:
            raise ApiError.invalid("metadata.tenant", "is immutable and cannot be changed")
        updated = validate_as(self.model, merged)
        for path in self.hooks.immutable:
            check_unchanged(path, _dig(render(current), path), _dig(render(updated), path))
        updated = self.hooks.validate(self._check_name(updated))
        updated.metadata.version = current.metadata.version + 1
        self._objects[object_id] = updated
        self._bus.publish(EventType.UPDATED, self.payload_field, render(updated))
        return updated

    def delete(self, object_id: str, caller: Caller) -> None:
        obj = self.get(object_id, caller)
        reason = self.hooks.in_use(obj)
        if reason is not None:
            raise ApiError.failed_precondition(f"{self.kind} '{obj.metadata.name}' is in use: {reason}")
        del self._objects[object_id]
        gone = obj.model_copy(
            update={"metadata": obj.metadata.model_copy(update={"deletion_timestamp": utcnow()})}
        )
        self._bus.publish(EventType.DELETED, self.payload_field, render(gone))


def _dig(data: dict[str, Any], path: str) -> Any:
    value: Any = data
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class Catalogs:
    """The admin-managed kinds, with the hooks that only need each other."""

    def __init__(self, bus: EventBus) -> None:
        self.types = CatalogStore(
            "bare_metal_instance_type", BareMetalInstanceType, "bare_metal_instance_type", bus
        )
        self.images = CatalogStore("disk_image", DiskImage, "disk_image", bus)
        self.versions = CatalogStore("cluster_version", ClusterVersion, "cluster_version", bus)
        self.items = CatalogStore(
            "bare_metal_instance_catalog_item",
            BareMetalInstanceCatalogItem,
            "bare_metal_instance_catalog_item",
            bus,
        )
        self.subnets = CatalogStore("subnet", Subnet, "subnet", bus)
        self.security_groups = CatalogStore("security_group", SecurityGroup, "security_group", bus)
        self.types.hooks = KindHooks(validate=_validate_type, public_view=_public_type)
        self.images.hooks = KindHooks(validate=_validate_image)
        self.versions.hooks = KindHooks(
            validate=self._validate_version,
            in_use=lambda cv: None,
            default_name=lambda cv: "".join(c if c.isalnum() else "-" for c in cv.spec.version.lower()),
            immutable=("spec.image", "spec.version"),
        )
        self.images.hooks.in_use = self._image_in_use

    def _validate_version(self, cv: ClusterVersion) -> ClusterVersion:
        if not cv.spec.image:
            raise ApiError.invalid("spec.image", "is required")
        if not cv.spec.version:
            raise ApiError.invalid("spec.version", "is required")
        if cv.spec.disk_image:
            image = self.images.find(cv.spec.disk_image, Caller())
            if image is None:
                raise ApiError.invalid("spec.disk_image", f"DiskImage '{cv.spec.disk_image}' does not exist")
            cv.spec.disk_image = image.id
        return cv

    def _image_in_use(self, image: DiskImage) -> str | None:
        users = [cv.metadata.name for cv in self.versions.all() if cv.spec.disk_image == image.id]
        return f"linked by ClusterVersion {', '.join(users)}" if users else None


def _validate_type(t: BareMetalInstanceType) -> BareMetalInstanceType:
    selector = t.spec.host_label_selector
    if selector is None or not selector.match_labels:
        raise ApiError.invalid("spec.host_label_selector.match_labels", "at least one label pair is required")
    names = [p.name for p in (t.spec.hardware.network_ports if t.spec.hardware else [])]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ApiError.invalid("spec.hardware.network_ports", f"port names must be unique: {duplicates}")
    return t


def _public_type(data: dict[str, Any]) -> dict[str, Any]:
    # `host_label_selector` is inventory plumbing: private API only.
    spec = {k: v for k, v in data.get("spec", {}).items() if k != "host_label_selector"}
    return {**data, "spec": spec}


def _validate_image(image: DiskImage) -> DiskImage:
    if not image.spec.source_ref:
        raise ApiError.invalid("spec.source_ref", "is required")
    return image
