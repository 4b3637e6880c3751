"""Label selectors (equality- and set-based, as `labels.Parse` accepts them) and field selectors."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lab.hub.errors import bad_request


class Op(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER = ">"
    LESS = "<"


_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_key_error(key: str) -> str | None:
    """Why `key` is not a valid qualified name (label/annotation key), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "prefix part must be a lowercase RFC 1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an "
            "alphanumeric character, and be at most 63 characters"
        )
    return None


def label_value_error(value: str) -> str | None:
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        return (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character, and be at most 63 characters"
        )
    return None


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Op
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case Op.EQUALS | Op.IN:
                return present and value in self.values
            case Op.NOT_EQUALS | Op.NOT_IN:
                return not present or value not in self.values
            case Op.EXISTS:
                return present
            case Op.DOES_NOT_EXIST:
                return not present
            case Op.GREATER | Op.LESS:
                try:
                    number, bound = int(value or ""), int(self.values[0])
                except ValueError:
                    return False
                return number > bound if self.op is Op.GREATER else number < bound


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|<|>|[^\s,()=!<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise bad_request(f"unable to parse requirement: unexpected text at {pos} in {text!r}")
        out.append(match.group(1))
        pos = match.end()
    return out


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text or not text.strip():
        return LabelSelector()
    tokens = _tokens(text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise bad_request(f"unable to parse requirement: unexpected end of selector {text!r}")
        pos += 1
        return tokens[pos - 1]

    def ident(what: str) -> str:
        token = take()
        if token in ("==", "!=", "=", "!", "(", ")", ",", "<", ">"):
            raise bad_request(f"unable to parse requirement: found '{token}', expected: {what}")
        return token

    def check(key: str, values: tuple[str, ...]) -> None:
        problem = label_key_error(key)
        if problem:
            raise bad_request(f'unable to parse requirement: invalid label key "{key}": {problem}')
        for value in values:
            problem = label_value_error(value)
            if problem:
                raise bad_request(f'unable to parse requirement: invalid label value: "{value}": {problem}')

    requirements: list[Requirement] = []
    while True:
        if peek() == "!":
            take()
            key = ident("identifier after '!'")
            check(key, ())
            requirements.append(Requirement(key, Op.DOES_NOT_EXIST))
        else:
            key = ident("identifier")
            nxt = peek()
            if nxt is None or nxt == ",":
                check(key, ())
                requirements.append(Requirement(key, Op.EXISTS))
            elif nxt in ("=", "==", "!="):
                take()
                value = "" if peek() in (None, ",") else ident("value")
                check(key, (value,))
                requirements.append(Requirement(key, Op.NOT_EQUALS if nxt == "!=" else Op.EQUALS, (value,)))
            elif nxt in ("in", "notin"):
                take()
                if take() != "(":
                    raise bad_request("unable to parse requirement: expected '(' after set operator")
                values: list[str] = []
                while peek() != ")":
                    if peek() == ",":
                        take()
                        continue
                    values.append(ident("value"))
                take()
                check(key, tuple(values))
                requirements.append(Requirement(key, Op.IN if nxt == "in" else Op.NOT_IN, tuple(values)))
            elif nxt in (">", "<"):
                take()
                bound = ident("integer")
                if not re.fullmatch(r"-?\d+", bound):
                    raise bad_request(
                        f"unable to parse requirement: for 'gt', 'lt' operators, {bound!r} is not an integer"
                    )
                requirements.append(Requirement(key, Op.GREATER if nxt == ">" else Op.LESS, (bound,)))
            else:
                raise bad_request(f"unable to parse requirement: found '{nxt}', expected: operator")
        nxt = peek()
        if nxt is None:
            break
        if nxt != ",":
            raise bad_request(f"unable to parse requirement: found '{nxt}', expected: ','")
        take()
    return LabelSelector(tuple(requirements))


def from_label_selector_object(selector: Mapping[str, Any] | None) -> LabelSelector:
    """A metav1.LabelSelector (`matchLabels` + `matchExpressions`) as a parsed selector."""
    if not selector:
        return LabelSelector()
    requirements = [
        Requirement(k, Op.EQUALS, (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    ops = {"In": Op.IN, "NotIn": Op.NOT_IN, "Exists": Op.EXISTS, "DoesNotExist": Op.DOES_NOT_EXIST}
    for expr in selector.get("matchExpressions") or []:
        requirements.append(Requirement(expr["key"], ops[expr["operator"]], tuple(expr.get("values") or ())))
    return LabelSelector(tuple(requirements))


@dataclass(frozen=True)
class FieldTerm:
    path: str
    value: str
    negate: bool


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, t.path) == t.value) != t.negate for t in self.terms)

    def equals(self, path: str) -> str | None:
        """The value a term requires for `path` (lets the store use its namespace/name indexes)."""
        for term in self.terms:
            if term.path == path and not term.negate:
                return term.value
        return None


def field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return ""
        value = value.get(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str | None, supported: Mapping[str, str]) -> FieldSelector:
    """`supported` maps the selectable field labels of the kind to dotted paths in the object."""
    if not text or not text.strip():
        return FieldSelector()
    terms: list[FieldTerm] = []
    for raw in re.split(r"(?<!\\),", text):
        raw = raw.strip()
        if not raw:
            continue
        match = re.fullmatch(r"([^=!]+?)\s*(==|!=|=)\s*(.*)", raw)
        if match is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{raw}'")
        label, op, value = match.groups()
        if label not in supported:
            raise bad_request(f"field label not supported: {label}")
        terms.append(FieldTerm(supported[label], value.replace("\\,", ","), op == "!="))
    return FieldSelector(tuple(terms))
