"""Request plumbing shared by the routers: the lab, bearer-token callers, fault injection and counters."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request

from lab.fulfillment.errors import ApiError
from lab.fulfillment.lab import FulfillmentLab
from lab.fulfillment.objects import ADMIN, Caller


def get_lab(request: Request) -> FulfillmentLab:
    lab: FulfillmentLab = request.app.state.lab
    return lab


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def admin_caller(request: Request) -> Caller:
    """The private API and the lab routes: the admin token only."""
    lab, token = get_lab(request), _bearer(request)
    if token is not None and lab.is_admin_token(token):
        return ADMIN
    if token is not None and lab.tenant_for_token(token) is not None:
        raise ApiError.permission_denied("this API needs the admin service account's token")
    raise ApiError.unauthenticated()


async def tenant_caller(request: Request) -> Caller:
    """The public API: a tenant's token, answering for that tenant only."""
    lab, token = get_lab(request), _bearer(request)
    tenant = lab.tenant_for_token(token) if token is not None else None
    if tenant is not None:
        return Caller(tenant=tenant)
    if token is not None and lab.is_admin_token(token):
        raise ApiError.permission_denied("the public API needs a tenant token")
    raise ApiError.unauthenticated()


def route_template(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "path", request.url.path))


async def count_and_inject_faults(request: Request) -> None:
    """Runs before authentication, like a load balancer's errors would: every API call is counted."""
    lab = get_lab(request)
    template = route_template(request)
    lab.stats.count(request.method, template)
    fault = lab.faults.for_request(request.method, template)
    if fault.latency_s > 0:
        await asyncio.sleep(fault.latency_s)
    if fault.hang:
        await lab.faults.wait_until_released()
        raise ApiError.unavailable("lab fault: the request hung and was released")
    if fault.error:
        raise ApiError(fault.error_code, "lab fault: injected error")


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        raise ApiError.invalid("body", "a JSON object is required")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError.invalid("body", f"invalid JSON: {exc}") from None
