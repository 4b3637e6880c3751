"""What every resource kind shares: body parsing, metadata on create, PATCH merging, optimistic lock,
List answers (`filter`, `order`, `offset`, `limit` → `{size, total, items}`) and caller scoping."""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import cel
from pydantic import BaseModel, ValidationError

from lab.fulfillment.celfilter import LIST_VARIABLE, compile_filter, untranslatable
from lab.fulfillment.errors import ApiError, field_path
from lab.fulfillment.models import Metadata, utcnow

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 100

# Proto maps: a PATCH replaces them whole instead of merging key by key.
MAP_FIELDS = frozenset(
    {"labels", "annotations", "template_parameters", "match_labels", "capabilities", "allowed_upgrades"}
)
# Output-only metadata the server owns; whatever a client sends there is ignored.
SERVER_METADATA = ("creation_timestamp", "deletion_timestamp", "version", "creator")


@dataclass(frozen=True)
class Caller:
    """Who is asking: the admin service account (private API) or one tenant (public API)."""

    tenant: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.tenant is None

    def can_see(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


ADMIN = Caller()


def new_id() -> str:
    return str(uuid.uuid4())


def validate_as(model: type[M], data: Any, prefix: str = "") -> M:
    """Validate with pydantic; the first error becomes InvalidArgument naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = field_path(tuple(err["loc"]), prefix)
        raise ApiError.invalid(path, err["msg"]) from None


def as_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError.invalid("body", "must be a JSON object")
    return body


def strip_output_only(body: dict[str, Any]) -> dict[str, Any]:
    """Drop what clients may echo back but never set: `id`, `status`, server-owned metadata."""
    out = {k: v for k, v in body.items() if k not in ("id", "status")}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items() if k not in SERVER_METADATA}
    return out


def stamp_new_metadata(meta: Metadata, tenant: str, creator: str) -> Metadata:
    return meta.model_copy(
        update={
            "tenant": tenant,
            "version": 1,
            "creation_timestamp": utcnow(),
            "deletion_timestamp": None,
            "creator": creator,
        }
    )


def merge_patch(stored: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The gateway's inferred update mask: every leaf present in the body replaces the stored one."""
    out = copy.deepcopy(stored)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in MAP_FIELDS:
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_mask(stored: dict[str, Any], body: dict[str, Any], mask: list[str]) -> dict[str, Any]:
    """An explicit `update_mask`: each path takes the body's value, or is cleared when absent there."""
    out = copy.deepcopy(stored)
    for path in mask:
        parts = path.split(".")
        src: Any = body
        for part in parts:
            src = src.get(part) if isinstance(src, dict) else None
        dst = out
        for part in parts[:-1]:
            nxt = dst.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                dst[part] = nxt
            dst = nxt
        if src is None:
            dst.pop(parts[-1], None)
        else:
            dst[parts[-1]] = copy.deepcopy(src)
    return out


def parse_mask(update_mask: str | None) -> list[str] | None:
    if update_mask is None or not update_mask.strip():
        return None
    paths = [p.strip() for p in update_mask.split(",") if p.strip()]
    for p in paths:
        if p in ("id", "status") or p.startswith("status."):
            raise ApiError.invalid("update_mask", f"'{p}' is not updatable")
    return paths


def check_lock(lock: bool, body: dict[str, Any], current_version: int) -> None:
    """With `lock=true` the submitted `metadata.version` must still be the stored one."""
    if not lock:
        return
    sent = (body.get("metadata") or {}).get("version")
    if sent is None:
        raise ApiError.invalid("metadata.version", "required when lock is set")
    try:
        sent_version = int(sent)
    except (TypeError, ValueError):
        raise ApiError.invalid("metadata.version", f"not a number: {sent!r}") from None
    if sent_version != current_version:
        raise ApiError.aborted(
            f"metadata.version: the object changed (sent version {sent_version}, current {current_version})"
        )


def check_unchanged(field: str, stored: Any, sent: Any) -> None:
    if stored != sent:
        raise ApiError.invalid(field, "is immutable and cannot be changed")


def copy_tree(value: Any) -> Any:
    """A deep copy of rendered JSON (dicts, lists, scalars); much cheaper than `copy.deepcopy`."""
    if isinstance(value, dict):
        return {k: copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_tree(v) for v in value]
    return value


def list_answer(
    items: Sequence[dict[str, Any]],
    *,
    filter_expr: str | None,
    order: str | None,
    offset: int | None,
    limit: int | None,
    activations: Sequence[Callable[[], cel.Context]] | None = None,
) -> dict[str, Any]:
    """`{size, total, items}` over already-rendered, caller-visible objects, ordered by id.

    As the real service (generic_dao_list.go): the SQL always orders by id, and `order` is accepted but
    never read, so a client can page by keyset (`this.id > '<last id>'`). A filter the real SQL
    translator cannot translate fails the List as the real generic server does: Internal, "failed to
    list" (the reason goes to the log only).

    `activations`, if given, parallels `items`: each returns the item's CEL activation for `this`
    (see `celfilter.activation`), so a caller that caches them skips the per-item CEL conversion.
    """
    del order  # never read by the real server either
    if offset is not None and offset < 0:
        raise ApiError.invalid("offset", "must not be negative")
    if limit is not None and limit < 0:
        raise ApiError.invalid("limit", "must not be negative")
    predicate = compile_filter(filter_expr, LIST_VARIABLE)
    if filter_expr and (reason := untranslatable(filter_expr)) is not None:
        log.warning("List filter %r cannot be translated to SQL: %s", filter_expr, reason)
        raise ApiError.internal("failed to list")
    if activations is None or predicate.matches_everything:
        matched = [obj for obj in items if predicate(obj)]
    else:
        matched = [
            obj
            for obj, context in zip(items, activations, strict=True)
            if predicate.matches_activation(context())
        ]
    matched.sort(key=lambda obj: str(obj.get("id") or ""))
    start = offset or 0
    count = DEFAULT_LIST_LIMIT if limit is None or limit == 0 else limit
    page = matched[start : start + count]
    return {"size": len(page), "total": len(matched), "items": page}
