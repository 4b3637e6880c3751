"""Structural-schema handling for CRD-style OpenAPI v3 schemas: pruning, defaulting, validation.

Follows what kube-apiserver does on every write of a custom resource, in this order: unknown fields and
non-nullable nulls are pruned, defaults are applied, then the object is validated (OpenAPI keywords
through jsonschema, `x-kubernetes-validations` CEL rules through the `cel` package).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import re
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from datetime import date, datetime
from typing import Any

import cel
import jsonschema

from lab.hub.errors import Cause, CauseType

log = logging.getLogger(__name__)

# ObjectMeta fields a real server keeps; anything else under `metadata` is dropped like an unknown field.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)

_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("date-time")
def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _DATE_TIME.match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00").replace("t", "T"))
    except ValueError:
        return False
    return True


@_FORMATS.checks("date")
def _is_date(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return True


@_FORMATS.checks("byte")
def _is_byte(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


# Validation ratcheting (Kubernetes' CRDValidationRatcheting, on by default since 1.30): on an update,
# a value equal to the old object's is not validated again. Here: the ids of the new object's maps and
# lists that equal their old counterparts, for the one validation running in this context.
_UNCHANGED: ContextVar[frozenset[int]] = ContextVar("unchanged_subtrees", default=frozenset())


def _ratcheted_properties(
    validator: Any, properties: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    unchanged = _UNCHANGED.get()
    for name, subschema in properties.items():
        if name in instance and id(instance[name]) not in unchanged:
            yield from validator.descend(instance[name], subschema, path=name, schema_path=name)


_RatchetingValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"properties": _ratcheted_properties}
)


def _unchanged_subtrees(new: Any, old: Any, found: set[int]) -> None:
    """Collect the ids of `new`'s maps and lists equal to `old`'s at the same place. Scalars are left
    out: they are cheap to check, and small ones are shared objects whose id says nothing."""
    if not (isinstance(new, dict) and isinstance(old, dict)):
        return
    for key, value in new.items():
        if isinstance(value, dict | list) and key in old:
            if value == old[key]:
                found.add(id(value))
            else:
                _unchanged_subtrees(value, old[key], found)


def to_json_schema(node: Any) -> Any:
    """Translate the OpenAPI-v3 dialect of CRDs into a draft-7 JSON Schema."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = value if isinstance(value, bool) else to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(v) for v in value]
        elif key == "format":
            if value in ("date-time", "date", "byte"):
                out[key] = value
        elif key in (
            "description",
            "default",
            "example",
            "nullable",
            "externalDocs",
            "title",
        ) or key.startswith("x-"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("exclusiveMinimum") is True and "minimum" in node:
        out["exclusiveMinimum"] = out.pop("minimum")
    elif node.get("exclusiveMinimum") is False:
        out.pop("exclusiveMinimum", None)
    if node.get("exclusiveMaximum") is True and "maximum" in node:
        out["exclusiveMaximum"] = out.pop("maximum")
    elif node.get("exclusiveMaximum") is False:
        out.pop("exclusiveMaximum", None)
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def render_path(parts: Iterable[str | int]) -> str:
    """Kubernetes field-path notation: `spec.nodeRequests[0].numberOfNodes`."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out:
            out = part
        elif re.fullmatch(r"[A-Za-z0-9_-]+", part):
            out += f".{part}"
        else:
            out += f"[{part}]"
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _quote(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f'"{_json_type(value)}"'
    return json.dumps(value)


class CrdSchema:
    """One `openAPIV3Schema`; a kind may carry several (ours and the real CRD) and must satisfy all."""

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source
        json_schema = to_json_schema(raw)
        jsonschema.Draft7Validator.check_schema(json_schema)
        self._validator = _RatchetingValidator(json_schema, format_checker=_FORMATS)
        self._cel_cache: dict[str, cel.Program | None] = {}

    # -- pruning ---------------------------------------------------------------------------------

    def prune(self, obj: dict[str, Any]) -> list[str]:
        """Drop unknown fields and non-nullable nulls in place; return the dropped fields' paths."""
        dropped: list[str] = []
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            for key in list(meta):
                if key not in OBJECT_META_FIELDS:
                    del meta[key]
                    dropped.append(f"metadata.{key}")
                elif meta[key] is None:
                    del meta[key]
        for key in list(obj):
            if key in ("apiVersion", "kind", "metadata"):
                continue
            props = self.raw.get("properties") or {}
            if key in props:
                if obj[key] is None and not props[key].get("nullable"):
                    del obj[key]
                else:
                    self._prune(obj[key], props[key], [key], dropped)
            elif not self.raw.get("x-kubernetes-preserve-unknown-fields"):
                del obj[key]
                dropped.append(key)
        return dropped

    def _prune(self, value: Any, schema: dict[str, Any], path: list[str | int], dropped: list[str]) -> None:
        if isinstance(value, dict):
            props: dict[str, Any] = schema.get("properties") or {}
            addl = schema.get("additionalProperties")
            preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
            embedded = bool(schema.get("x-kubernetes-embedded-resource"))
            for key in list(value):
                sub: dict[str, Any] | None = None
                if key in props:
                    sub = props[key]
                elif isinstance(addl, dict):
                    sub = addl
                elif addl is True or preserve or (embedded and key in ("apiVersion", "kind", "metadata")):
                    continue
                else:
                    del value[key]
                    dropped.append(render_path([*path, key]))
                    continue
                if value[key] is None and not sub.get("nullable"):
                    del value[key]
                else:
                    self._prune(value[key], sub, [*path, key], dropped)
        elif isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, dict):
                for index, item in enumerate(value):
                    self._prune(item, items, [*path, index], dropped)

    # -- defaulting ------------------------------------------------------------------------------

    def apply_defaults(self, obj: dict[str, Any]) -> None:
        self._default(obj, self.raw)

    def _default(self, value: Any, schema: dict[str, Any]) -> None:
        if isinstance(value, dict):
            for key, sub in (schema.get("properties") or {}).items():
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    self._default(value[key], sub)
            addl = schema.get("additionalProperties")
            if isinstance(addl, dict):
                props = schema.get("properties") or {}
                for key, item in value.items():
                    if key not in props:
                        self._default(item, addl)
        elif isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, dict):
                for item in value:
                    self._default(item, items)

    # -- validation ------------------------------------------------------------------------------

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
        # metadata is validated by the server itself, not by the CRD schema (as in kube-apiserver).
        body = {k: v for k, v in obj.items() if k != "metadata"}
        old_body = None if old is None else {k: v for k, v in old.items() if k != "metadata"}
        unchanged: set[int] = set()
        _unchanged_subtrees(body, old_body, unchanged)
        token = _UNCHANGED.set(frozenset(unchanged))
        try:
            errors = list(self._validator.iter_errors(body))
        finally:
            _UNCHANGED.reset(token)
        causes: list[Cause] = []
        for err in errors:
            if err.validator == "required":
                # One cause per missing field, as the apiserver reports them.
                present = err.instance if isinstance(err.instance, dict) else {}
                parts = list(err.absolute_path)
                causes.extend(
                    Cause(CauseType.REQUIRED, render_path([*parts, name]), "Required value")
                    for name in err.validator_value
                    if name not in present
                )
            else:
                causes.append(self._cause(err))
        causes.extend(self._rules(body, old_body, self.raw, []))
        return causes

    def _cause(self, err: jsonschema.ValidationError) -> Cause:
        parts = list(err.absolute_path)
        field = render_path(parts)
        value = err.instance
        where = field or "body"
        match err.validator:
            case "type":
                expected = err.validator_value
                expected = expected[0] if isinstance(expected, list) else expected
                return Cause(
                    CauseType.TYPE_INVALID,
                    field,
                    f"Invalid value: {_quote(_json_type(value))}: "
                    f"{where} in body must be of type {expected}: "
                    f"{_quote(_json_type(value))}",
                )
            case "enum":
                allowed = err.validator_value if isinstance(err.validator_value, list) else []
                supported = ", ".join(json.dumps(v) for v in allowed if v is not None)
                return Cause(
                    CauseType.NOT_SUPPORTED,
                    field,
                    f"Unsupported value: {_quote(value)}: supported values: {supported}",
                )
            case "pattern":
                return Cause(
                    CauseType.INVALID,
                    field,
                    f"Invalid value: {_quote(value)}: {where} in body should match '{err.validator_value}'",
                )
            case "maxLength" | "maxItems" | "maxProperties":
                return Cause(
                    CauseType.TOO_LONG, field, f"Too long: may not be more than {err.validator_value}"
                )
            case "minLength":
                return Cause(
                    CauseType.INVALID,
                    field,
                    f"Invalid value: {_quote(value)}: {where} in body should be at least "
                    f"{err.validator_value} chars long",
                )
            case "minimum" | "exclusiveMinimum":
                op = "greater than or equal to" if err.validator == "minimum" else "greater than"
                return Cause(
                    CauseType.INVALID,
                    field,
                    f"Invalid value: {_quote(value)}: {where} in body should be {op} {err.validator_value}",
                )
            case "maximum" | "exclusiveMaximum":
                op = "less than or equal to" if err.validator == "maximum" else "less than"
                return Cause(
                    CauseType.INVALID,
                    field,
                    f"Invalid value: {_quote(value)}: {where} in body should be {op} {err.validator_value}",
                )
            case "format":
                return Cause(
                    CauseType.INVALID,
                    field,
                    f"Invalid value: {_quote(value)}: {where} in body must be of type {err.validator_value}: "
                    f"{_quote(value)}",
                )
            case _:
                return Cause(CauseType.INVALID, field, f"Invalid value: {_quote(value)}: {err.message}")

    def _rules(self, value: Any, old: Any, schema: dict[str, Any], path: list[str | int]) -> Iterator[Cause]:
        for rule in schema.get("x-kubernetes-validations") or []:
            yield from self._rule(rule, value, old, path)
        if isinstance(value, dict):
            props: dict[str, Any] = schema.get("properties") or {}
            addl = schema.get("additionalProperties")
            for key, item in value.items():
                sub = props.get(key, addl if isinstance(addl, dict) else None)
                if sub is not None:
                    old_item = old.get(key) if isinstance(old, dict) else None
                    yield from self._rules(item, old_item, sub, [*path, key])
        elif isinstance(value, list):
            items = schema.get("items")
            if isinstance(items, dict):
                # Old values correlate only through list-type=map keys (as in Kubernetes); else no oldSelf.
                keys = (
                    schema.get("x-kubernetes-list-map-keys")
                    if schema.get("x-kubernetes-list-type") == "map"
                    else None
                )
                old_by_key: dict[tuple[Any, ...], Any] = {}
                if keys and isinstance(old, list):
                    old_by_key = {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}
                for index, item in enumerate(value):
                    old_item = None
                    if keys and isinstance(item, dict):
                        old_item = old_by_key.get(tuple(item.get(k) for k in keys))
                    yield from self._rules(item, old_item, items, [*path, index])

    def _rule(self, rule: dict[str, Any], value: Any, old: Any, path: list[str | int]) -> Iterator[Cause]:
        source = rule.get("rule", "")
        program = self._program(source)
        if program is None:
            return
        variables = set(program.variables())
        if "oldSelf" in variables and old is None and not rule.get("optionalOldSelf"):
            return  # a transition rule only runs on update, when there is an old value
        context: dict[str, Any] = {"self": value}
        if "oldSelf" in variables:
            context["oldSelf"] = old
        try:
            ok = program.execute(context)
        except Exception as exc:  # the cel package lacks some Kubernetes extension libraries
            log.debug("CEL rule %r not evaluated: %s", source, exc)
            return
        if ok is False:
            field_path = render_path(path)
            extra = str(rule.get("fieldPath") or "").lstrip(".")
            if extra:
                field_path = f"{field_path}.{extra}" if field_path else extra
            message = rule.get("message") or f"failed rule: {source}"
            reason = CauseType(rule["reason"]) if rule.get("reason") in CauseType._value2member_map_ else None
            yield Cause(
                reason or CauseType.INVALID,
                field_path,
                f"Invalid value: {_quote(_json_type(value))}: {message}",
            )

    def _program(self, source: str) -> cel.Program | None:
        if source not in self._cel_cache:
            try:
                self._cel_cache[source] = cel.compile(source)
            except Exception as exc:
                log.debug("CEL rule %r does not compile here: %s", source, exc)
                self._cel_cache[source] = None
        return self._cel_cache[source]

    # -- openapi ---------------------------------------------------------------------------------

    def known_fields(self) -> set[str]:
        return set((self.raw.get("properties") or {}).keys())
