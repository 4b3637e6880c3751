"""metav1.LabelSelector matching (matchLabels and matchExpressions)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """True when `labels` satisfy the selector. An empty or missing selector matches nothing:
    a provider must never claim every Agent because a selector was left out."""
    if not selector:
        return False
    match_labels: Mapping[str, str] = selector.get("matchLabels") or {}
    expressions: list[Mapping[str, Any]] = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, values = expr.get("key", ""), list(expr.get("values") or [])
        op = SelectorOperator(str(expr.get("operator", "")))
        if op is SelectorOperator.IN and labels.get(key) not in values:
            return False
        if op is SelectorOperator.NOT_IN and key in labels and labels[key] in values:
            return False
        if op is SelectorOperator.EXISTS and key not in labels:
            return False
        if op is SelectorOperator.DOES_NOT_EXIST and key in labels:
            return False
    return True
