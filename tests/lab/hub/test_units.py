"""Unit tests of the pure helpers: patches, JSONPath for printer columns, ages, schema translation."""

from __future__ import annotations

import pytest

from lab.hub.builtin import human_duration
from lab.hub.patch import PatchError, json_patch, merge_patch, strip_directives
from lab.hub.schema import CrdSchema, render_path, to_json_schema
from lab.hub.table import jsonpath


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    assert merge_patch(target, {"a": "z", "c": {"f": None}, "l": [3]}) == {
        "a": "z",
        "c": {"d": "e"},
        "l": [3],
    }
    assert merge_patch({"a": 1}, {"b": {"c": None}}) == {"a": 1, "b": {}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}  # untouched
    assert strip_directives({"$patch": "replace", "a": {"$retainKeys": ["x"], "x": 1}}) == {"a": {"x": 1}}


def test_json_patch_operations_and_failures() -> None:
    doc = {"a": {"b": [1, 2]}, "t~/": 1}
    assert json_patch(doc, [{"op": "add", "path": "/a/b/1", "value": 9}])["a"]["b"] == [1, 9, 2]
    assert json_patch(doc, [{"op": "move", "from": "/a/b", "path": "/c"}]) == {"a": {}, "t~/": 1, "c": [1, 2]}
    assert json_patch(doc, [{"op": "copy", "from": "/a", "path": "/d"}])["d"] == {"b": [1, 2]}
    assert json_patch(doc, [{"op": "remove", "path": "/t~0~1"}]) == {"a": {"b": [1, 2]}}
    assert json_patch(doc, [{"op": "test", "path": "/a/b/0", "value": 1}]) == doc
    for bad in (
        [{"op": "test", "path": "/a/b/0", "value": True}],
        [{"op": "replace", "path": "/missing", "value": 1}],
        [{"op": "add", "path": "/a/b/7", "value": 1}],
        [{"op": "remove", "path": "/a/x"}],
    ):
        with pytest.raises(PatchError):
            json_patch(doc, bad)
    with pytest.raises(ValueError):
        json_patch(doc, {"op": "add"})


def test_printer_column_jsonpath() -> None:
    obj = {
        "spec": {"name": "x", "items": [{"n": 1}, {"n": 2}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Bound", "status": "False"}]},
        "metadata": {"labels": {"a.b/c": "d"}},
    }
    assert jsonpath(obj, ".spec.name") == ["x"]
    assert jsonpath(obj, ".spec.items[*].n") == [1, 2]
    assert jsonpath(obj, ".spec.items[1].n") == [2]
    assert jsonpath(obj, '.status.conditions[?(@.type=="Bound")].status') == ["False"]
    assert jsonpath(obj, ".metadata.labels['a.b/c']") == ["d"]
    assert jsonpath(obj, ".spec.nothing") == []


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (5, "5s"),
        (130, "2m10s"),
        (600, "10m"),
        (4000, "66m"),
        (14460, "4h1m"),
        (108000, "30h"),
        (262800, "3d1h"),
        (8640000, "100d"),
    ],
)
def test_ages_print_like_the_apiserver(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_openapi_dialect_translation() -> None:
    translated = to_json_schema(
        {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "nullable": True, "minimum": 0, "exclusiveMinimum": True},
                "p": {"x-kubernetes-int-or-string": True},
            },
        }
    )
    assert translated["properties"]["n"] == {"type": ["integer", "null"], "exclusiveMinimum": 0}
    assert translated["properties"]["p"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert render_path(["spec", "items", 0, "a.b/c"]) == "spec.items[0][a.b/c]"


def test_pruning_defaulting_and_rules_of_one_schema() -> None:
    schema = CrdSchema(
        {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "keep": {"type": "string", "default": "d"},
                        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        "size": {
                            "type": "integer",
                            "x-kubernetes-validations": [
                                {"rule": "self >= oldSelf", "message": "size may only grow"}
                            ],
                        },
                    },
                },
            },
        },
        "test",
    )
    obj = {
        "apiVersion": "v",
        "kind": "K",
        "metadata": {"name": "n", "weird": 1},
        "spec": {"drop": 1, "open": {"any": {"thing": 1}}, "size": 2},
        "extra": True,
    }
    assert sorted(schema.prune(obj)) == ["extra", "metadata.weird", "spec.drop"]
    schema.apply_defaults(obj)
    assert obj["spec"] == {"open": {"any": {"thing": 1}}, "size": 2, "keep": "d"}
    assert schema.validate(obj, None) == []
    causes = schema.validate(obj, {"spec": {"size": 3}})
    assert [(c.field, c.message) for c in causes] == [
        ("spec.size", 'Invalid value: "integer": size may only grow')
    ]


def test_an_update_validates_only_what_changed() -> None:
    """Ratcheting, as kube-apiserver does since 1.30: a part equal to the old object's is not
    validated again (it could only fail after a schema change); a changed one always is."""
    schema = CrdSchema(
        {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "limits": {
                            "type": "object",
                            "properties": {"size": {"type": "integer", "maximum": 3}},
                        },
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 2}},
                    },
                },
                "status": {"type": "object", "properties": {"phase": {"type": "string", "enum": ["A", "B"]}}},
            },
        },
        "test",
    )
    stored = {"spec": {"limits": {"size": 5}, "tags": ["long"]}, "status": {"phase": "A"}}

    def fields(obj: dict[str, object], old: dict[str, object] | None) -> list[str]:
        return sorted(c.field for c in schema.validate(obj, old))

    assert fields(stored, None) == ["spec.limits.size", "spec.tags[0]"]
    status_only = {"spec": {"limits": {"size": 5}, "tags": ["long"]}, "status": {"phase": "B"}}
    assert fields(status_only, stored) == []
    assert fields({**status_only, "status": {"phase": "C"}}, stored) == ["status.phase"]
    one_changed = {"spec": {"limits": {"size": 6}, "tags": ["long"]}, "status": {"phase": "A"}}
    assert fields(one_changed, stored) == ["spec.limits.size"]
    assert fields({"spec": {"limits": {"size": 5}, "tags": ["long", "xyz"]}}, stored) == [
        "spec.tags[0]",
        "spec.tags[1]",
    ]
