"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), applied to plain JSON values."""

from __future__ import annotations

import copy
from enum import StrEnum
from typing import Any


class PatchType(StrEnum):
    JSON = "application/json-patch+json"
    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    APPLY = "application/apply-patch+yaml"


class PatchError(Exception):
    """The patch could not be applied to the object (a real server answers 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strip_directives(patch: Any) -> Any:
    """Drop strategic-merge directives (`$patch`, `$setElementOrder/...`) so the rest merges plainly."""
    if isinstance(patch, dict):
        return {k: strip_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [strip_directives(v) for v in patch]
    return patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f'invalid JSON pointer "{path}"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f'invalid array index "{token}"')
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise PatchError(f"array index {index} out of bounds")
    return index


def _parent(doc: Any, tokens: list[str], path: str) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f'doc is missing path: "{path}": missing value')
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise PatchError(f'doc is missing path: "{path}": missing value')
    return node


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, allow_end=False)]
    raise PatchError(f'doc is missing path: "{path}": missing value')


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise PatchError(f'doc is missing path: "{path}": missing value')
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, allow_end=False)]
    else:
        raise PatchError(f"Unable to remove nonexistent key: {last}: missing value")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise ValueError("a JSON patch must be an array of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ValueError(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        match kind:
            case "add":
                doc = _add(doc, path, copy.deepcopy(op.get("value")))
            case "remove":
                doc = _remove(doc, path)
            case "replace":
                _get(doc, path)  # the target must exist
                doc = _remove(doc, path) if _pointer(path) else doc
                doc = _add(doc, path, copy.deepcopy(op.get("value")))
            case "move":
                value = _get(doc, op["from"])
                doc = _remove(doc, op["from"])
                doc = _add(doc, path, value)
            case "copy":
                doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
            case "test":
                actual = _get(doc, path)
                if actual != op.get("value") or type(actual) is not type(op.get("value")):
                    raise PatchError(f"testing value {path} failed: test failed")
            case _:
                raise ValueError(f"unexpected JSON patch operation {kind!r}")
    return doc
