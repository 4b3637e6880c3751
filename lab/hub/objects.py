"""Object semantics of the API server: create/update/patch/delete/list/get on top of the store.

Mirrors kube-apiserver's generic registry for custom resources: status subresource split, generation,
optimistic concurrency, finalizers and deletionTimestamp, pruning/defaulting/validation, namespaces.
Built-in kinds differ where the real server differs (create-on-update for Events, unconditional
updates for Secrets and Events, strategic merge patch accepted).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import random
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import yaml

from lab.hub import errors, protobuf
from lab.hub.errors import ApiError, Cause, CauseType
from lab.hub.patch import PatchError, PatchType, json_patch, merge_patch, strip_directives
from lab.hub.resources import Registry, ResourceType
from lab.hub.selectors import FieldSelector, LabelSelector, label_key_error, label_value_error
from lab.hub.store import Obj, Store

NAMESPACE_FINALIZER = "kubernetes"
STANDARD_FINALIZERS = frozenset({NAMESPACE_FINALIZER, "orphan", "foregroundDeletion"})
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName
_MAX_ANNOTATIONS_BYTES = 256 * 1024


class FieldValidation(StrEnum):
    STRICT = "Strict"
    WARN = "Warn"
    IGNORE = "Ignore"


class Propagation(StrEnum):
    BACKGROUND = "Background"
    FOREGROUND = "Foreground"
    ORPHAN = "Orphan"


class Subresource(StrEnum):
    NONE = ""
    STATUS = "status"
    SCALE = "scale"


@dataclass
class WriteOptions:
    validation: FieldValidation = FieldValidation.WARN
    dry_run: bool = False
    warnings: list[str] = field(default_factory=list)


@dataclass
class DeleteOptions:
    propagation: Propagation = Propagation.BACKGROUND
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False


@dataclass
class DeleteResult:
    obj: Obj
    deleted: bool  # False: it stays until its finalizers are removed


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_body(raw: bytes, content_type: str) -> Any:
    media = content_type.split(";")[0].strip().lower()
    if media == protobuf.MEDIA_TYPE:
        return protobuf.decode(raw)
    if "protobuf" in media:
        raise errors.unsupported_media_type(media, ["application/json", "application/yaml"])
    try:
        if media in ("application/yaml", "application/apply-patch+yaml"):
            return yaml.safe_load(raw.decode())
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise errors.bad_request(f"the body of the request could not be decoded: {exc}") from exc


def _spec_of(obj: Obj) -> Obj:
    """Everything generation tracks: the object without metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _same_content(a: Obj, b: Obj) -> bool:
    def strip(o: Obj) -> Obj:
        meta = {k: v for k, v in o["metadata"].items() if k not in ("resourceVersion", "managedFields")}
        return {**o, "metadata": meta}

    return strip(a) == strip(b)


class ObjectApi:
    def __init__(self, registry: Registry, store: Store) -> None:
        self.registry = registry
        self.store = store
        namespaces = registry.get("", "v1", "namespaces")
        assert namespaces is not None, "the core namespaces kind is always served"
        self.namespaces = namespaces

    # -- reads -----------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.store.get(rt, namespace, name)
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return obj

    def list_objects(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> Obj:
        if namespace is None and rt.namespaced:
            namespace = fields.equals("metadata.namespace")
        items = [
            o
            for o in self.store.select(rt, namespace, fields.equals("metadata.name"))
            if labels.matches(o["metadata"].get("labels")) and fields.matches(o)
        ]
        rv = self.store.rv
        if continue_token:
            rv, start = _decode_continue(continue_token)
            items = [o for o in items if _sort_key(o) > start]
        meta: Obj = {"resourceVersion": str(rv)}
        if limit and limit > 0 and len(items) > limit:
            meta["continue"] = _encode_continue(rv, _sort_key(items[limit - 1]))
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": meta, "items": items}

    # -- create ----------------------------------------------------------------------------------

    def create(self, rt: ResourceType, namespace: str, body: Any, opts: WriteOptions) -> Obj:
        obj = self._decode(rt, body)
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise errors.internal_error("resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(rt, namespace, str(meta["generateName"]))
        name = str(meta.get("name") or "")
        if rt.namespaced and name:
            self._check_namespace_open(rt, namespace, name)
        for server_field in (
            "uid",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "managedFields",
        ):
            meta.pop(server_field, None)
        if rt.has_status and not rt.builtin:
            obj.pop("status", None)  # the status subresource owns status: a create cannot set it
        self._prune_and_default(rt, obj, opts)
        self._normalize_builtin(rt, obj, None, Subresource.NONE)
        causes = self._validate_meta(rt, obj, None, opts)
        for schema in rt.schemas:
            causes.extend(schema.validate(obj, None))
        causes = _unique(causes)
        if causes:
            raise errors.invalid(rt.kind, rt.group, name, causes)
        if self.store.get(rt, namespace if rt.namespaced else "", name) is not None:
            raise errors.already_exists(rt.plural, rt.group, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if rt.tracks_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if opts.dry_run:
            return obj
        meta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(rt, obj, None)
        return obj

    def _generate_name(self, rt: ResourceType, namespace: str, prefix: str) -> str:
        prefix = prefix[: 63 - 5] if rt is self.namespaces else prefix[: 253 - 5]
        while True:
            name = prefix + "".join(random.choices(_NAME_SUFFIX_ALPHABET, k=5))
            if self.store.get(rt, namespace if rt.namespaced else "", name) is None:
                return name

    def _check_namespace_open(self, rt: ResourceType, namespace: str, name: str) -> None:
        ns = self.store.get(self.namespaces, "", namespace)
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.forbidden_terminating(rt.plural, rt.group, name, namespace)

    # -- update / patch --------------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        subresource: Subresource,
        opts: WriteOptions,
    ) -> tuple[Obj, bool]:
        """PUT. Returns the stored object and whether it was created."""
        obj = self._decode(rt, body)
        meta = obj["metadata"]
        if meta.get("name") != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
            )
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        old = self.store.get(rt, namespace if rt.namespaced else "", name)
        if old is None:
            if rt.allow_create_on_update and subresource is Subresource.NONE:
                meta.pop("resourceVersion", None)
                return self.create(rt, namespace, obj, opts), True
            raise errors.not_found(rt.plural, rt.group, name)
        given_rv = meta.get("resourceVersion")
        if given_rv:
            if str(given_rv) != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, rt.group, name)
        elif not rt.allow_unconditional_update:
            raise errors.invalid(
                rt.kind,
                rt.group,
                name,
                [
                    Cause(
                        CauseType.INVALID,
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        return self._commit_update(rt, old, obj, subresource, opts), False

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        raw: bytes,
        subresource: Subresource,
        opts: WriteOptions,
    ) -> Obj:
        if subresource is Subresource.SCALE:
            return self._patch_scale(rt, namespace, name, content_type, raw, opts)
        old = self.get(rt, namespace if rt.namespaced else "", name)
        patched = _apply_patch(old, content_type, raw, strategic=rt.builtin)
        patched_rv = patched["metadata"].get("resourceVersion")
        if patched_rv and str(patched_rv) != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name)
        patched["apiVersion"], patched["kind"] = rt.api_version, rt.kind
        patched["metadata"]["name"] = name
        if rt.namespaced:
            patched["metadata"]["namespace"] = namespace
        return self._commit_update(rt, old, patched, subresource, opts)

    # -- scale subresource (autoscaling/v1 Scale over the CRD's replicas paths) -------------------

    def get_scale(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        return self._scale_view(rt, self.get(rt, namespace if rt.namespaced else "", name))

    def update_scale(self, rt: ResourceType, namespace: str, name: str, body: Any, opts: WriteOptions) -> Obj:
        assert rt.scale is not None
        old = self.get(rt, namespace if rt.namespaced else "", name)
        replicas = body.get("spec", {}).get("replicas") if isinstance(body, dict) else None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid(
                "Scale",
                "autoscaling",
                name,
                [
                    Cause(
                        CauseType.INVALID,
                        "spec.replicas",
                        f"Invalid value: {json.dumps(replicas)}: must be greater than or equal to 0",
                    )
                ],
            )
        given_rv = (body.get("metadata") or {}).get("resourceVersion")
        if given_rv and str(given_rv) != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name)
        updated = copy.deepcopy(old)
        _set_path(updated, rt.scale.spec_replicas_path, replicas)
        return self._scale_view(rt, self._commit_update(rt, old, updated, Subresource.NONE, opts))

    def _patch_scale(
        self, rt: ResourceType, namespace: str, name: str, content_type: str, raw: bytes, opts: WriteOptions
    ) -> Obj:
        # Scale is a built-in type: strategic merge patches apply to it even for custom resources.
        patched = _apply_patch(self.get_scale(rt, namespace, name), content_type, raw, strategic=True)
        return self.update_scale(rt, namespace, name, patched, opts)

    def _scale_view(self, rt: ResourceType, obj: Obj) -> Obj:
        assert rt.scale is not None
        meta = obj["metadata"]
        status: Obj = {"replicas": _get_path(obj, rt.scale.status_replicas_path) or 0}
        if rt.scale.label_selector_path:
            selector = _get_path(obj, rt.scale.label_selector_path)
            if selector:
                status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": _get_path(obj, rt.scale.spec_replicas_path) or 0},
            "status": status,
        }

    def _commit_update(
        self, rt: ResourceType, old: Obj, new: Obj, subresource: Subresource, opts: WriteOptions
    ) -> Obj:
        old_meta = old["metadata"]
        name = old_meta["name"]
        if subresource is Subresource.STATUS:
            # A status write changes nothing but status (customResourceStatusStrategy).
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            if new["metadata"].get("uid") and new["metadata"]["uid"] != old_meta["uid"]:
                raise errors.invalid(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        Cause(
                            CauseType.INVALID,
                            "metadata.uid",
                            f'Invalid value: "{new["metadata"]["uid"]}": field is immutable',
                        )
                    ],
                )
            meta = result["metadata"]
            for kept in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if kept in old_meta:
                    meta[kept] = old_meta[kept]
                else:
                    meta.pop(kept, None)
            if rt.has_status:
                # The main resource ignores status changes (written only through /status).
                if "status" in old:
                    result["status"] = copy.deepcopy(old["status"])
                else:
                    result.pop("status", None)
        self._prune_and_default(rt, result, opts)
        self._normalize_builtin(rt, result, old, subresource)
        causes = self._validate_meta(rt, result, old, opts)
        for schema in rt.schemas:
            causes.extend(schema.validate(result, old))
        causes = _unique(causes)
        if causes:
            raise errors.invalid(rt.kind, rt.group, name, causes)
        meta = result["metadata"]
        if rt.tracks_generation and _spec_of(result) != _spec_of(old):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if _same_content(result, old):
            return old  # a no-op write is not stored and makes no event, as on a real server
        if opts.dry_run:
            return result
        meta["resourceVersion"] = str(self.store.next_rv())
        if self._should_remove(rt, result):
            self.store.remove(rt, result)
        else:
            self.store.put(rt, result, old)
        return result

    def _should_remove(self, rt: ResourceType, obj: Obj) -> bool:
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return False
        if rt is self.namespaces:
            return not (obj.get("spec") or {}).get("finalizers")
        return True

    # -- delete ----------------------------------------------------------------------------------

    def delete(self, rt: ResourceType, namespace: str, name: str, opts: DeleteOptions) -> DeleteResult:
        old = self.get(rt, namespace if rt.namespaced else "", name)
        meta = old["metadata"]
        if opts.precondition_uid and opts.precondition_uid != meta["uid"]:
            raise errors.conflict(
                rt.plural,
                rt.group,
                name,
                f"Precondition failed: UID in precondition: {opts.precondition_uid}, "
                f"UID in object meta: {meta['uid']}",
            )
        if opts.precondition_rv and opts.precondition_rv != meta["resourceVersion"]:
            raise errors.conflict(
                rt.plural,
                rt.group,
                name,
                f"Precondition failed: ResourceVersion in precondition: {opts.precondition_rv}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
            )
        if opts.dry_run:
            return DeleteResult(old, not meta.get("finalizers") and rt is not self.namespaces)
        if opts.propagation is Propagation.ORPHAN:
            self._orphan_dependents(meta["uid"])
        pending = bool(meta.get("finalizers")) or (
            rt is self.namespaces and bool((old.get("spec") or {}).get("finalizers"))
        )
        if pending:
            if meta.get("deletionTimestamp"):
                return DeleteResult(old, False)
            marked = copy.deepcopy(old)
            marked_meta = marked["metadata"]
            marked_meta["deletionTimestamp"] = now_rfc3339()
            marked_meta["deletionGracePeriodSeconds"] = 0
            if marked_meta.get("generation"):
                marked_meta["generation"] = int(marked_meta["generation"]) + 1
            if rt is self.namespaces:
                marked.setdefault("status", {})["phase"] = "Terminating"
            marked_meta["resourceVersion"] = str(self.store.next_rv())
            self.store.put(rt, marked, old)
            return DeleteResult(marked, False)
        final = copy.deepcopy(old)
        final["metadata"]["resourceVersion"] = str(self.store.next_rv())
        self.store.remove(rt, final)
        return DeleteResult(final, True)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for dep_rt, dep in self.store.dependents(owner_uid):
            self.remove_owner_reference(dep_rt, dep, owner_uid)

    def remove_owner_reference(self, rt: ResourceType, obj: Obj, owner_uid: str) -> None:
        updated = copy.deepcopy(obj)
        refs = [r for r in updated["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
        if refs:
            updated["metadata"]["ownerReferences"] = refs
        else:
            updated["metadata"].pop("ownerReferences", None)
        self._commit_update(
            rt, obj, updated, Subresource.NONE, WriteOptions(validation=FieldValidation.IGNORE)
        )

    def finalize_namespace(self, name: str) -> None:
        """What the namespace controller does once a terminating namespace is empty."""
        ns = self.store.get(self.namespaces, "", name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        final = copy.deepcopy(ns)
        final["spec"] = {"finalizers": []}
        final["metadata"]["resourceVersion"] = str(self.store.next_rv())
        if final["metadata"].get("finalizers"):
            self.store.put(self.namespaces, final, ns)
        else:
            self.store.remove(self.namespaces, final)

    # -- helpers ---------------------------------------------------------------------------------

    def _decode(self, rt: ResourceType, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        obj = copy.deepcopy(body)
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if not rt.builtin:
            snippet = json.dumps(body)[:200]
            if not kind:
                raise errors.bad_request(f"Object 'Kind' is missing in '{snippet}'")
            if not api_version:
                raise errors.bad_request(f"Object 'apiVersion' is missing in '{snippet}'")
        if kind and kind != rt.kind:
            raise errors.bad_request(f"the kind in the body ({kind}) does not match the resource ({rt.kind})")
        if api_version and api_version != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.api_version})"
            )
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is None:
                meta.pop(key, None)
            elif not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise errors.bad_request(f"metadata.{key} must be a map of strings")
        for key in ("finalizers", "ownerReferences"):
            if meta.get(key) is None:
                meta.pop(key, None)
            elif not isinstance(meta[key], list):
                raise errors.bad_request(f"metadata.{key} must be a list")
        return obj

    def _prune_and_default(self, rt: ResourceType, obj: Obj, opts: WriteOptions) -> None:
        dropped: list[str] = []
        for schema in rt.schemas:
            dropped.extend(p for p in schema.prune(obj) if p not in dropped)
        if dropped and opts.validation is FieldValidation.STRICT:
            raise errors.bad_request(
                "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in dropped)
            )
        if opts.validation is FieldValidation.WARN:
            opts.warnings.extend(f'unknown field "{p}"' for p in dropped)
        for schema in rt.schemas:
            schema.apply_defaults(obj)

    def _normalize_builtin(
        self, rt: ResourceType, obj: Obj, old: Obj | None, subresource: Subresource
    ) -> None:
        if rt.builtin and rt.kind == "Secret":
            string_data = obj.pop("stringData", None) or {}
            if string_data:
                data = obj.setdefault("data", {}) or {}
                obj["data"] = data
                for key, value in string_data.items():
                    data[key] = base64.b64encode(str(value).encode()).decode()
            if not obj.get("type"):
                obj["type"] = "Opaque"
        elif rt is self.namespaces:
            meta = obj["metadata"]
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
            if old is None:
                obj["spec"] = {"finalizers": [NAMESPACE_FINALIZER]}
                obj["status"] = {"phase": "Active"}
            else:
                # Namespace spec (finalizers) is the namespace controller's business, not a client's.
                obj["spec"] = copy.deepcopy(old.get("spec") or {})
                if subresource is not Subresource.STATUS:
                    obj["status"] = copy.deepcopy(old.get("status") or {"phase": "Active"})

    def _validate_meta(self, rt: ResourceType, obj: Obj, old: Obj | None, opts: WriteOptions) -> list[Cause]:
        meta = obj["metadata"]
        causes: list[Cause] = []
        name = meta.get("name")
        if not name:
            causes.append(
                Cause(CauseType.REQUIRED, "metadata.name", "Required value: name or generateName is required")
            )
        elif not isinstance(name, str):
            causes.append(
                Cause(
                    CauseType.INVALID, "metadata.name", f"Invalid value: {json.dumps(name)}: must be a string"
                )
            )
        elif rt is self.namespaces:
            if len(name) > 63 or not _DNS_LABEL.match(name):
                causes.append(
                    Cause(
                        CauseType.INVALID,
                        "metadata.name",
                        f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case '
                        "alphanumeric characters or '-', and must start and end with an alphanumeric "
                        "character",
                    )
                )
        elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            causes.append(
                Cause(
                    CauseType.INVALID,
                    "metadata.name",
                    f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                    "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                    "character",
                )
            )
        for key, value in (meta.get("labels") or {}).items():
            problem = label_key_error(key)
            if problem:
                causes.append(
                    Cause(CauseType.INVALID, "metadata.labels", f'Invalid value: "{key}": {problem}')
                )
            problem = label_value_error(value)
            if problem:
                causes.append(
                    Cause(CauseType.INVALID, "metadata.labels", f'Invalid value: "{value}": {problem}')
                )
        annotations = meta.get("annotations") or {}
        for key in annotations:
            problem = label_key_error(key.lower())
            if problem:
                causes.append(
                    Cause(CauseType.INVALID, "metadata.annotations", f'Invalid value: "{key}": {problem}')
                )
        if sum(len(k) + len(v) for k, v in annotations.items()) > _MAX_ANNOTATIONS_BYTES:
            causes.append(
                Cause(
                    CauseType.TOO_LONG,
                    "metadata.annotations",
                    f"Too long: must have at most {_MAX_ANNOTATIONS_BYTES} bytes",
                )
            )
        finalizers = meta.get("finalizers") or []
        for index, finalizer in enumerate(finalizers):
            if not isinstance(finalizer, str) or label_key_error(finalizer):
                causes.append(
                    Cause(
                        CauseType.INVALID,
                        f"metadata.finalizers[{index}]",
                        f"Invalid value: {json.dumps(finalizer)}: must be a qualified name",
                    )
                )
            elif "/" not in finalizer and finalizer not in STANDARD_FINALIZERS:
                opts.warnings.append(
                    f'metadata.finalizers: "{finalizer}": prefer a domain-qualified finalizer name '
                    "including a path (/) to avoid accidental conflicts with other finalizer writers"
                )
        if old is not None and old["metadata"].get("deletionTimestamp"):
            before = set(old["metadata"].get("finalizers") or [])
            if any(f not in before for f in finalizers):
                causes.append(
                    Cause(
                        CauseType.FORBIDDEN,
                        "metadata.finalizers",
                        "Forbidden: no new finalizers can be added if the object is being deleted, "
                        f"found new finalizers {json.dumps(sorted(set(finalizers) - before))}",
                    )
                )
        controllers = 0
        for index, ref in enumerate(meta.get("ownerReferences") or []):
            where = f"metadata.ownerReferences[{index}]"
            if not isinstance(ref, dict):
                causes.append(Cause(CauseType.INVALID, where, "Invalid value: must be an object"))
                continue
            for required in ("apiVersion", "kind", "name", "uid"):
                if not ref.get(required):
                    causes.append(
                        Cause(
                            CauseType.INVALID,
                            f"{where}.{required}",
                            f'Invalid value: "": {required} must not be empty',
                        )
                    )
            if ref.get("controller"):
                controllers += 1
        if controllers > 1:
            causes.append(
                Cause(
                    CauseType.INVALID,
                    "metadata.ownerReferences",
                    "Invalid value: Only one reference can have Controller set to true",
                )
            )
        if rt.builtin and rt.kind == "Secret":
            for key, value in (obj.get("data") or {}).items():
                if not _SECRET_KEY.match(key):
                    causes.append(
                        Cause(
                            CauseType.INVALID,
                            f"data[{key}]",
                            f'Invalid value: "{key}": a valid config key must consist of alphanumeric '
                            "characters, '-', '_' or '.'",
                        )
                    )
                elif isinstance(value, str):
                    try:
                        base64.b64decode(value, validate=True)
                    except (binascii.Error, ValueError):
                        causes.append(
                            Cause(CauseType.INVALID, f"data[{key}]", "Invalid value: illegal base64 data")
                        )
        return causes


def _apply_patch(target: Obj, content_type: str, raw: bytes, strategic: bool) -> Obj:
    media = content_type.split(";")[0].strip().lower()
    accepted = [PatchType.JSON, PatchType.MERGE] + ([PatchType.STRATEGIC] if strategic else [])
    if media not in accepted:
        raise errors.unsupported_media_type(media, [str(p) for p in accepted])
    patch_type = PatchType(media)
    try:
        patch = json.loads(raw)
    except ValueError as exc:
        raise errors.bad_request(f"error decoding patch: {exc}") from exc
    if patch_type is not PatchType.JSON and not isinstance(patch, dict):
        raise errors.bad_request(f"a {patch_type.value} body must be a JSON object")
    try:
        if patch_type is PatchType.JSON:
            patched = json_patch(target, patch)
        elif patch_type is PatchType.MERGE:
            patched = merge_patch(target, patch)
        else:
            # Core kinds: a strategic merge patch is applied as a merge patch, minus its directives.
            patched = merge_patch(target, strip_directives(patch))
    except PatchError as exc:
        raise errors.unprocessable(str(exc)) from exc
    except ValueError as exc:
        raise errors.bad_request(str(exc)) from exc
    if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
        raise errors.bad_request("the patch produced an object without metadata")
    return patched


def _get_path(obj: Obj, path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _set_path(obj: Obj, path: str, value: Any) -> None:
    parts = path.split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _unique(causes: list[Cause]) -> list[Cause]:
    """One cause per problem: two schemas for the same kind often report the same one."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for cause in causes:
        key = (str(cause.reason), cause.field, cause.message)
        if key not in seen:
            seen.add(key)
            out.append(cause)
    return out


def _sort_key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}\x00{meta['name']}"


def _encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": "osac.hub/1", "rv": rv, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ApiError(400, errors.Reason.BAD_REQUEST, f"continue key is not valid: {exc}") from exc
