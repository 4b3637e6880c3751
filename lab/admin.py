"""The twins' own `/lab/v1` routes (audit, stats), read the same way by the test stacks, the
benchmark, the chaos harness and the demo: one place that knows their paths and shapes."""

from __future__ import annotations

from typing import Any

import httpx


async def _json(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    response = await client.get(path, params=params or None)
    response.raise_for_status()
    return response.json()


async def audit(fulfillment: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    """The fulfillment twin's audit records (host allocations, boots, wipes, releases)."""
    records: list[dict[str, Any]] = (await _json(fulfillment, "/lab/v1/audit", **params))["records"]
    return records


async def audit_violations(fulfillment: httpx.AsyncClient) -> list[Any]:
    """What the twin's audit proves went wrong (a host served twice, reused unwiped, ...)."""
    violations: list[Any] = (await _json(fulfillment, "/lab/v1/audit/violations"))["violations"]
    return violations


async def stats(twin: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    """A twin's request counters (the hub's by user, verb and resource; BMaaS's by route)."""
    result: dict[str, Any] = await _json(twin, "/lab/v1/stats", **params)
    return result
