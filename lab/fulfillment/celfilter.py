"""CEL filters, as the fulfillment-service applies them to List (`this`) and watch (`event`)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import cel

from lab.fulfillment.errors import ApiError

Predicate = Callable[[dict[str, Any]], bool]

# The variable List filters see each object as.
LIST_VARIABLE = "this"


@functools.lru_cache(maxsize=256)
def _compiled(expression: str) -> cel.Program:
    # Clients repeat the same few filters (watchers poll); a syntax error is not cached and raises again.
    return cel.compile(expression)


def activation(variable: str, obj: dict[str, Any]) -> cel.Context:
    """`obj` converted to CEL values once. Evaluating against a Context skips the conversion a plain dict
    costs on every call (the Context holds a snapshot: later changes to `obj` are not seen)."""
    return cel.Context({variable: obj})


class CelFilter:
    """A compiled filter; callable as a `Predicate` on plain objects.

    Evaluation errors (a missing map key, a type mismatch) and non-boolean results mean "no match",
    the way a CEL filter over a sparse object behaves server-side.
    """

    def __init__(self, program: cel.Program | None, variable: str) -> None:
        self._program = program
        self.variable = variable

    @property
    def matches_everything(self) -> bool:
        return self._program is None

    def __call__(self, obj: dict[str, Any]) -> bool:
        return self._execute({self.variable: obj})

    def matches_activation(self, context: cel.Context) -> bool:
        """Same answer as calling the filter on the object `context` was built from for `self.variable`."""
        return self._execute(context)

    def _execute(self, context: dict[str, Any] | cel.Context) -> bool:
        if self._program is None:
            return True
        try:
            return self._program.execute(context) is True
        except Exception:
            return False


def compile_filter(expression: str | None, variable: str, field: str = "filter") -> CelFilter:
    """Compile once per request; a syntax error is the caller's InvalidArgument."""
    if expression is None or not expression.strip():
        return CelFilter(None, variable)
    try:
        program = _compiled(expression)
    except Exception as exc:
        raise ApiError.invalid(field, f"invalid CEL expression: {exc}") from None
    return CelFilter(program, variable)


# What the real List filter translator (internal/database/dao/filter_translator.go) turns into SQL:
# calls of the comparison, logical and arithmetic operators, `in` over a literal list or a field, an
# index by a literal string, `contains`/`startsWith`/`endsWith`, the identifiers `this` and `now`,
# null/bool/int/string literals and field selects (`has()` included). Anything else fails the List.
# Watch filters are evaluated by CEL itself and take any expression.
_LIKE_FUNCTIONS = frozenset({"contains", "startsWith", "endsWith"})
_COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_KEYWORDS = frozenset({"this", "now", "true", "false", "null", "in"})
_STRING = re.compile(
    r"(?<!\w)([rRbB]{0,2})("
    r'"""(?:\\.|[^\\])*?"""'
    r"|'''(?:\\.|[^\\])*?'''"
    r'|"(?:\\.|[^"\\\n])*"'
    r"|'(?:\\.|[^'\\\n])*'"
    r")",
    re.DOTALL,
)
_MEMBER_CALL = re.compile(r"\.\s*([A-Za-z_]\w*)\s*\(")
_WORD = re.compile(r"(?<![\w.])([A-Za-z_]\w*)(\s*\()?")
_NOT_AN_INT = re.compile(r"(?<![\w.])\d+(?:\.\d|[eE][-+]?\d|[uU]\b)")
_LIST_OPERAND = re.compile(r"(?:(?<![\w.])in|[\w\])])\s*$")


@functools.lru_cache(maxsize=256)
def untranslatable(expression: str) -> str | None:
    """Why the real service's List could not translate this (already compiled) filter into SQL, or
    None. An approximation on the text with the string literals blanked out (the `cel` library
    exposes no syntax tree); the reasons read like the translator's errors, which the server logs."""
    has_bytes = False

    def blank(match: re.Match[str]) -> str:
        nonlocal has_bytes
        has_bytes = has_bytes or "b" in match.group(1).lower()
        return '""'

    text = _STRING.sub(blank, expression)
    if has_bytes:
        return "unknown literal type '[]uint8'"
    for match in _MEMBER_CALL.finditer(text):
        name = match.group(1)
        if name in _COMPREHENSIONS:
            return f"unsupported expression kind 2 (the '{name}' macro is a comprehension)"
        if name not in _LIKE_FUNCTIONS:
            return f"function '{name}' isn't supported"
    for match in _WORD.finditer(text):
        name, called = match.group(1), bool(match.group(2))
        if called and name != "has" and name not in _KEYWORDS:
            return f"function '{name}' isn't supported"
        if not called and name not in _KEYWORDS:
            return f"unknown identifier '{name}'"
    if "?" in text:
        return "function '_?_:_' isn't supported"
    if "{" in text:
        return "unsupported expression kind 6 (a map or message literal)"
    if _NOT_AN_INT.search(text):
        return "unknown literal type (only null, bool, int and string literals translate)"
    for match in re.finditer(r"\[", text):
        # `x in [...]` is a literal list; `a[...]` (after a name, `]` or `)`) is an index.
        if not _LIST_OPERAND.search(text[: match.start()]):
            return "unsupported expression kind 4 (a list literal outside 'in')"
    return None
