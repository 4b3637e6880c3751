"""CEL filters, as the fulfillment-service applies them to List (`this`) and watch (`event`)."""

from __future__ import annotations

import functools
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
