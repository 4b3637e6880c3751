"""Decoding of the Kubernetes protobuf encoding for the built-in kinds kubectl sends that way.

kubectl's typed commands (`kubectl create namespace`, `kubectl create secret ...`) POST
`application/vnd.kubernetes.protobuf`; every other command sends JSON. Only request bodies are
decoded: responses are always JSON, which kubectl accepts (it lists it in Accept).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from lab.hub import errors

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

Field = tuple[int, int, Any]  # (field number, wire type, value: int or bytes)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[Field]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire == 1:
            yield number, wire, data[pos : pos + 8]
            pos += 8
        elif wire == 5:
            yield number, wire, data[pos : pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _text(value: bytes) -> str:
    return value.decode()


def _map_entry(value: bytes, decode_value: Callable[[bytes], Any]) -> tuple[str, Any]:
    key, item = "", decode_value(b"")
    for number, _, raw in _fields(value):
        if number == 1:
            key = _text(raw)
        elif number == 2:
            item = decode_value(raw)
    return key, item


def _time(value: bytes) -> str:
    seconds = 0
    for number, _, raw in _fields(value):
        if number == 1:
            seconds = raw
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner_reference(value: bytes) -> dict[str, Any]:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    flags = {6: "controller", 7: "blockOwnerDeletion"}
    ref: dict[str, Any] = {}
    for number, _, raw in _fields(value):
        if number in names:
            ref[names[number]] = _text(raw)
        elif number in flags:
            ref[flags[number]] = bool(raw)
    return ref


def _object_meta(value: bytes) -> dict[str, Any]:
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    meta: dict[str, Any] = {}
    for number, _, raw in _fields(value):
        if number in strings:
            if raw:  # Go writes every string field, empty or not
                meta[strings[number]] = _text(raw)
        elif number == 7:
            meta["generation"] = raw
        elif number in (11, 12):
            key, item = _map_entry(raw, _text)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = item
        elif number == 13:
            meta.setdefault("ownerReferences", []).append(_owner_reference(raw))
        elif number == 14:
            meta.setdefault("finalizers", []).append(_text(raw))
        elif number == 8:
            meta["creationTimestamp"] = _time(raw)
    return meta


def _secret(value: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, _, raw in _fields(value):
        if number == 1:
            obj["metadata"] = _object_meta(raw)
        elif number == 2:
            key, item = _map_entry(raw, bytes)
            obj.setdefault("data", {})[key] = base64.b64encode(item).decode()
        elif number == 3 and raw:
            obj["type"] = _text(raw)
        elif number == 4:
            key, item = _map_entry(raw, _text)
            obj.setdefault("stringData", {})[key] = item
        elif number == 5:
            obj["immutable"] = bool(raw)
    return obj


def _namespace(value: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, _, raw in _fields(value):
        if number == 1:
            obj["metadata"] = _object_meta(raw)
        elif number == 2:
            obj["spec"] = {"finalizers": [_text(f) for n, _, f in _fields(raw) if n == 1]}
    return obj


_DECODERS: dict[tuple[str, str], Callable[[bytes], dict[str, Any]]] = {
    ("v1", "Secret"): _secret,
    ("v1", "Namespace"): _namespace,
}


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded Secret or Namespace as the JSON object it stands for."""
    if not body.startswith(_MAGIC):
        raise errors.bad_request("protobuf body without the k8s envelope")
    api_version = kind = ""
    raw = b""
    try:
        for number, _, value in _fields(body[len(_MAGIC) :]):
            if number == 1:
                for sub, _, item in _fields(value):
                    if sub == 1:
                        api_version = _text(item)
                    elif sub == 2:
                        kind = _text(item)
            elif number == 2:
                raw = value
        decoder = _DECODERS.get((api_version, kind))
        if decoder is None:
            raise errors.unsupported_media_type(MEDIA_TYPE, ["application/json", "application/yaml"])
        obj = decoder(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"the protobuf body could not be decoded: {exc}") from exc
    return {"apiVersion": api_version, "kind": kind, **obj}
