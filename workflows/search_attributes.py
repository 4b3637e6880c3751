"""Typed search attributes: the dev server registers them, the worker checks them at start."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

OSAC_CLUSTER_ORDER = SearchAttributeKey.for_keyword("OsacClusterOrder")  # "<namespace>/<order>"
OSAC_NODE_SET = SearchAttributeKey.for_keyword("OsacNodeSet")
OSAC_WORKER_PHASE = SearchAttributeKey.for_keyword("OsacWorkerPhase")
OSAC_BARE_METAL_INSTANCE = SearchAttributeKey.for_keyword("OsacBareMetalInstance")
OSAC_ATTEMPT = SearchAttributeKey.for_int("OsacAttempt")

ALL_SEARCH_ATTRIBUTES = (
    OSAC_CLUSTER_ORDER,
    OSAC_NODE_SET,
    OSAC_WORKER_PHASE,
    OSAC_BARE_METAL_INSTANCE,
    OSAC_ATTEMPT,
)


def worker_start_attributes(order_key: str, node_set: str, phase: str, attempt: int) -> TypedSearchAttributes:
    """Set by the parent when it starts a worker, so the worker's first upsert is not needed."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(OSAC_CLUSTER_ORDER, order_key),
            SearchAttributePair(OSAC_NODE_SET, node_set),
            SearchAttributePair(OSAC_WORKER_PHASE, phase),
            SearchAttributePair(OSAC_ATTEMPT, attempt),
        ]
    )
