"""BareMetalInstance CRUD: validation, tenant scoping, immutable fields and the optimistic lock.

Rules (every error names the field first):
- `metadata.name` is a DNS label (1-63); `(tenant, project, name)` is unique → AlreadyExists.
- `spec.catalog_item` is required and must name an existing catalog item (by id or name) the caller
  may use; `spec.instance_type` must name an existing BareMetalInstanceType (by name or id).
- `spec.user_data` is at most 65,536 bytes; it is never answered, logged or put in events.
- `spec.image {source_type: "disk_image", source_ref: <DiskImage id>}` or the plain `spec.disk_image`
  must name an existing DiskImage; both may be given if they agree.
- More than one `spec.network_attachments` ⇒ exactly one has `primary: true`; an `interface` must be a
  non-lifecycle port of the instance type. Each `subnet` and `security_groups[]` reference must name
  an existing Subnet / SecurityGroup by `id` or by `name` (both: the same object), and is stored as
  the real service stores it, `{id, name}`.
- Immutable after create: catalog_item, ssh_public_key, user_data, template_parameters, image (and
  disk_image), auto_external_ip_attachment; `metadata.tenant` too.
- Admin creates default to tenant `system`; tenants create in their own tenant and see only it.
"""

from __future__ import annotations

from typing import Any

from lab.fulfillment.catalog import Catalogs, CatalogStore
from lab.fulfillment.errors import ApiError
from lab.fulfillment.lifecycle import Lifecycle, initial_conditions
from lab.fulfillment.models import (
    DNS_LABEL,
    IMAGE_SOURCE_DISK_IMAGE,
    SYSTEM_TENANT,
    USER_DATA_MAX_BYTES,
    BareMetalInstance,
    BareMetalInstanceSpec,
    BareMetalInstanceStatus,
    BareMetalInstanceType,
    BmiState,
    NamedReference,
    ObjectReference,
    PortRole,
)
from lab.fulfillment.objects import (
    Caller,
    apply_mask,
    as_object,
    check_lock,
    check_unchanged,
    copy_tree,
    list_answer,
    merge_patch,
    new_id,
    parse_mask,
    stamp_new_metadata,
    strip_output_only,
    validate_as,
)
from lab.fulfillment.records import BmiRecord, InstanceTable, render_private, render_public

KIND = "bare_metal_instance"
IMMUTABLE_SPEC_FIELDS = (
    "catalog_item",
    "ssh_public_key",
    "user_data",
    "template_parameters",
    "image",
    "disk_image",
    "auto_external_ip_attachment",
)
_SSH_KEY_PREFIXES = ("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-")


class InstanceService:
    def __init__(self, table: InstanceTable, catalogs: Catalogs, lifecycle: Lifecycle) -> None:
        self._table = table
        self._catalogs = catalogs
        self._lifecycle = lifecycle

    # ------------------------------------------------------------------------------------ reading

    def render(self, rec: BmiRecord, caller: Caller) -> dict[str, Any]:
        return render_private(rec.obj) if caller.is_admin else render_public(rec.obj)

    def _visible(self, caller: Caller) -> list[BmiRecord]:
        return [r for r in self._table.all() if caller.can_see(r.obj.metadata.tenant)]

    def record(self, bmi_id: str, caller: Caller) -> BmiRecord:
        rec = self._table.get(bmi_id)
        if rec is None or not caller.can_see(rec.obj.metadata.tenant):
            raise ApiError.not_found(KIND, bmi_id)
        return rec

    def get(self, bmi_id: str, caller: Caller) -> dict[str, Any]:
        return self.render(self.record(bmi_id, caller), caller)

    def list_objects(
        self,
        caller: Caller,
        *,
        filter_expr: str | None = None,
        order: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        # Cached renderings and CEL activations: a List costs a render and a CEL conversion per
        # changed BMI, not per BMI. Only the returned page is copied (the views are shared).
        views = [r.view(public=not caller.is_admin) for r in self._visible(caller)]
        answer = list_answer(
            [v.data for v in views],
            filter_expr=filter_expr,
            order=order,
            offset=offset,
            limit=limit,
            activations=[v.activation for v in views],
        )
        answer["items"] = [copy_tree(obj) for obj in answer["items"]]
        return answer

    # ------------------------------------------------------------------------------------ writing

    def create(self, body: Any, caller: Caller) -> dict[str, Any]:
        obj = validate_as(BareMetalInstance, strip_output_only(as_object(body)))
        if caller.is_admin:
            tenant = obj.metadata.tenant or SYSTEM_TENANT
        else:
            if obj.metadata.tenant and obj.metadata.tenant != caller.tenant:
                raise ApiError.permission_denied(
                    f"metadata.tenant: cannot create objects in tenant '{obj.metadata.tenant}'"
                )
            tenant = caller.tenant or ""
        self._check_name(obj.metadata.name)
        itype = self._resolve_refs(obj.spec, caller)
        user_data = obj.spec.user_data or ""
        self._check_user_data(user_data)
        obj.metadata = stamp_new_metadata(obj.metadata, tenant, "admin" if caller.is_admin else tenant)
        self._check_unique(obj, None)
        obj.id = new_id()
        obj.spec.user_data = None
        obj.status = BareMetalInstanceStatus(state=BmiState.PROVISIONING, conditions=initial_conditions())
        rec = BmiRecord(obj=obj, user_data=user_data, instance_type_id=itype.id)
        self._table.add(rec)
        self._lifecycle.start(rec)
        return self.render(rec, caller)

    def update(
        self, bmi_id: str, body: Any, caller: Caller, update_mask: str | None = None, lock: bool = False
    ) -> dict[str, Any]:
        rec = self.record(bmi_id, caller)
        raw = as_object(body)
        check_lock(lock, raw, rec.obj.metadata.version)
        patch = strip_output_only(raw)
        sent = validate_as(BareMetalInstance, patch)  # the patch's own type errors, named
        mask = parse_mask(update_mask)
        self._check_immutable(rec, patch, sent.spec, mask, caller)

        stored = rec.obj.model_dump(mode="json")
        merged = apply_mask(stored, patch, mask) if mask is not None else merge_patch(stored, patch)
        updated = validate_as(BareMetalInstance, merged)
        if updated.metadata.tenant != rec.obj.metadata.tenant:
            raise ApiError.invalid("metadata.tenant", "is immutable and cannot be changed")
        self._check_name(updated.metadata.name)
        itype = self._resolve_refs(updated.spec, caller)
        self._check_unique(updated, rec)
        # Server-owned parts stay as they are.
        updated.id = rec.obj.id
        updated.status = rec.obj.status
        updated.spec.user_data = None
        updated.metadata = updated.metadata.model_copy(
            update={
                "version": rec.obj.metadata.version,
                "creation_timestamp": rec.obj.metadata.creation_timestamp,
                "deletion_timestamp": rec.obj.metadata.deletion_timestamp,
                "creator": rec.obj.metadata.creator,
            }
        )
        rec.obj = updated
        rec.instance_type_id = itype.id
        self._table.changed(rec)
        return self.render(rec, caller)

    def delete(self, bmi_id: str, caller: Caller) -> None:
        self._lifecycle.delete(self.record(bmi_id, caller))

    # --------------------------------------------------------------------------------- validation

    @staticmethod
    def _check_name(name: str) -> None:
        if not DNS_LABEL.match(name):
            raise ApiError.invalid(
                "metadata.name", f"'{name}' is not a DNS label (1-63 lowercase letters, digits and '-')"
            )

    @staticmethod
    def _check_user_data(user_data: str) -> None:
        size = len(user_data.encode())
        if size > USER_DATA_MAX_BYTES:
            raise ApiError.invalid(
                "spec.user_data", f"is {size} bytes; at most {USER_DATA_MAX_BYTES} are allowed"
            )

    def _check_unique(self, obj: BareMetalInstance, current: BmiRecord | None) -> None:
        m = obj.metadata
        other = self._table.by_key((m.tenant, m.project, m.name))
        if other is not None and other is not current:
            raise ApiError.already_exists(
                f"{KIND} '{m.name}' already exists in tenant '{m.tenant}' project '{m.project}'"
            )

    def _catalog_item_id(self, ref: ObjectReference | None, caller: Caller) -> str | None:
        for value in (ref.id, ref.name) if ref is not None else ():
            item = self._catalogs.items.find(value, caller) if value else None
            if item is not None:
                return item.id
        return None

    def _image_id(self, spec: BareMetalInstanceSpec, caller: Caller) -> str | None:
        """The DiskImage the spec names (validated), or None when it names none."""
        from_image: str | None = None
        if spec.image is not None:
            if not spec.image.source_type:
                raise ApiError.invalid("spec.image.source_type", "is required")
            if spec.image.source_type == IMAGE_SOURCE_DISK_IMAGE:
                image = self._catalogs.images.find(spec.image.source_ref, caller)
                if image is None:
                    raise ApiError.invalid(
                        "spec.image.source_ref", f"DiskImage '{spec.image.source_ref}' does not exist"
                    )
                from_image = image.id
        if spec.disk_image:
            image = self._catalogs.images.find(spec.disk_image, caller)
            if image is None:
                raise ApiError.invalid("spec.disk_image", f"DiskImage '{spec.disk_image}' does not exist")
            if from_image is not None and from_image != image.id:
                raise ApiError.invalid("spec.disk_image", "names a different DiskImage than spec.image")
            return image.id
        return from_image

    def _resolve_refs(self, spec: BareMetalInstanceSpec, caller: Caller) -> BareMetalInstanceType:
        if spec.catalog_item is None or not (spec.catalog_item.id or spec.catalog_item.name):
            raise ApiError.invalid("spec.catalog_item", "is required")
        item_id = self._catalog_item_id(spec.catalog_item, caller)
        if item_id is None:
            ref = spec.catalog_item.id or spec.catalog_item.name
            raise ApiError.invalid("spec.catalog_item", f"catalog item '{ref}' does not exist")
        item = self._catalogs.items.get(item_id, caller)
        spec.catalog_item = spec.catalog_item.model_copy(update={"id": item.id, "name": item.metadata.name})
        if not spec.instance_type:
            raise ApiError.invalid("spec.instance_type", "is required")
        itype = self._catalogs.types.find(spec.instance_type, caller)
        if itype is None:
            raise ApiError.invalid(
                "spec.instance_type", f"BareMetalInstanceType '{spec.instance_type}' does not exist"
            )
        self._image_id(spec, caller)
        if spec.ssh_public_key and not (
            spec.ssh_public_key.startswith(_SSH_KEY_PREFIXES) and len(spec.ssh_public_key.split()) >= 2
        ):
            raise ApiError.invalid("spec.ssh_public_key", "is not an OpenSSH public key")
        self._check_network_attachments(spec, itype)
        self._resolve_network_refs(spec, caller)
        return itype

    def _resolve_network_refs(self, spec: BareMetalInstanceSpec, caller: Caller) -> None:
        for i, att in enumerate(spec.network_attachments):
            if att.subnet is not None:
                att.subnet = _resolved(
                    self._catalogs.subnets, att.subnet, f"spec.network_attachments[{i}].subnet", caller
                )
            att.security_groups = [
                _resolved(
                    self._catalogs.security_groups,
                    ref,
                    f"spec.network_attachments[{i}].security_groups[{j}]",
                    caller,
                )
                for j, ref in enumerate(att.security_groups)
            ]

    @staticmethod
    def _check_network_attachments(spec: BareMetalInstanceSpec, itype: BareMetalInstanceType) -> None:
        attachments = spec.network_attachments
        primaries = sum(1 for a in attachments if a.primary)
        if len(attachments) > 1 and primaries != 1:
            raise ApiError.invalid(
                "spec.network_attachments",
                f"with more than one attachment exactly one must be primary (found {primaries})",
            )
        ports = {p.name: p for p in (itype.spec.hardware.network_ports if itype.spec.hardware else [])}
        for i, att in enumerate(attachments):
            if not att.interface or not ports:
                continue
            port = ports.get(att.interface)
            if port is None:
                raise ApiError.invalid(
                    f"spec.network_attachments[{i}].interface",
                    f"'{att.interface}' is not a port of instance type "
                    f"'{itype.metadata.name}' ({sorted(ports)})",
                )
            if port.role == PortRole.LIFECYCLE:
                raise ApiError.invalid(
                    f"spec.network_attachments[{i}].interface", f"'{att.interface}' is a lifecycle port"
                )

    def _check_immutable(
        self,
        rec: BmiRecord,
        patch: dict[str, Any],
        sent: BareMetalInstanceSpec,
        mask: list[str] | None,
        caller: Caller,
    ) -> None:
        """Compare every immutable field the update touches against what is stored (normalised)."""
        if mask is not None:
            touched = {p.split(".")[1] for p in mask if p.startswith("spec.") and p.count(".") >= 1}
        else:
            touched = set((patch.get("spec") or {}).keys())
        stored = rec.obj.spec
        for field in IMMUTABLE_SPEC_FIELDS:
            if field not in touched:
                continue
            name = f"spec.{field}"
            if field == "catalog_item":
                stored_id = stored.catalog_item.id if stored.catalog_item else None
                check_unchanged(name, stored_id, self._catalog_item_id(sent.catalog_item, caller))
            elif field == "user_data":
                check_unchanged(name, rec.user_data, sent.user_data or "")
            elif field in ("image", "disk_image"):
                # The same DiskImage by another spelling (name for id, the other field) is no change.
                check_unchanged(name, self._image_id(stored, caller), self._safe_image_id(sent, caller))
            else:
                check_unchanged(name, getattr(stored, field), getattr(sent, field))

    def _safe_image_id(self, spec: BareMetalInstanceSpec, caller: Caller) -> str | None:
        try:
            return self._image_id(spec, caller)
        except ApiError:
            return "<unresolvable>"


def _resolved(store: CatalogStore[Any], ref: NamedReference, field: str, caller: Caller) -> NamedReference:
    """`ref` resolved to `{id, name}`: by its id (a name beside it must be that object's), else by
    its name, which must name exactly one object the caller sees (names are unique per tenant and
    project only). Anything else is refused (InvalidArgument, naming the field)."""
    if ref.id:
        found = store.by_id(ref.id, caller)
        if found is not None and ref.name and found.metadata.name != ref.name:
            raise ApiError.invalid(
                field, f"{store.kind} '{ref.id}' is named '{found.metadata.name}', not '{ref.name}'"
            )
    elif ref.name:
        named = store.named(ref.name, caller)
        if len(named) > 1:
            raise ApiError.invalid(field, f"{len(named)} {store.kind}s are named '{ref.name}'; give its id")
        found = named[0] if named else None
    else:
        raise ApiError.invalid(field, "names no object (neither id nor name)")
    if found is None:
        shown = f"id '{ref.id}'" if ref.id else f"name '{ref.name}'"
        raise ApiError.invalid(field, f"no {store.kind} with {shown}")
    return NamedReference(id=found.id, name=found.metadata.name)
