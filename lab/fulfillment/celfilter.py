"""CEL filters, as the fulfillment-service applies them to List (`this`) and watch (`event`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cel

from lab.fulfillment.errors import ApiError

Predicate = Callable[[dict[str, Any]], bool]


def _match_all(_: dict[str, Any]) -> bool:
    return True


def compile_filter(expression: str | None, variable: str, field: str = "filter") -> Predicate:
    """Compile once per request; a syntax error is the caller's InvalidArgument.

    Evaluation errors (a missing map key, a type mismatch) and non-boolean results mean "no match",
    the way a CEL filter over a sparse object behaves server-side.
    """
    if expression is None or not expression.strip():
        return _match_all
    try:
        program = cel.compile(expression)
    except Exception as exc:
        raise ApiError.invalid(field, f"invalid CEL expression: {exc}") from None

    def matches(obj: dict[str, Any]) -> bool:
        try:
            return program.execute({variable: obj}) is True
        except Exception:
            return False

    return matches
