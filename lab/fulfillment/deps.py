"""Request plumbing shared by the routers: the lab, bearer-token callers, fault injection and counters."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from lab.fulfillment.errors import HTTP_STATUS, ApiError, GrpcCode, PlainTextAnswer
from lab.fulfillment.faults import RequestFault, UserDataEcho
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


async def count_and_inject_faults(request: Request) -> AsyncIterator[None]:
    """Runs before authentication, like a load balancer's errors would: every API call is counted,
    and counted in flight until it is answered."""
    lab = get_lab(request)
    template = route_template(request)
    lab.stats.count(request.method, template)
    with lab.stats.handling(request.method, template):
        await _inject_faults(request, lab.faults.for_request(request.method, template))
        yield


async def _inject_faults(request: Request, fault: RequestFault) -> None:
    lab = get_lab(request)
    if fault.latency_s > 0:
        await asyncio.sleep(fault.latency_s)
        # Like the real service, whose request context ends with its client's connection: a request
        # whose client gave up while it waited is not handled. (The body is read first: the request
        # keeps it, and the disconnect check cannot take it from the handler.)
        try:
            await request.body()
            gone = await request.is_disconnected()
        except ClientDisconnect:
            gone = True
        if gone:
            raise ApiError(GrpcCode.CANCELLED, "the client went away before the request was handled")
    if fault.hang:
        await lab.faults.wait_until_released()
        raise ApiError.unavailable("lab fault: the request hung and was released")
    if fault.error:
        message = "lab fault: injected error"
        if fault.echo_user_data is None:
            raise ApiError(fault.error_code, message)
        user_data = await _user_data(request)
        if fault.echo_user_data == UserDataEcho.TEXT:
            raise PlainTextAnswer(HTTP_STATUS[fault.error_code], f"spec.user_data={user_data}: {message}")
        raise ApiError(fault.error_code, f"{message}: invalid spec.user_data {json.dumps(user_data)}")


async def _user_data(request: Request) -> str:
    """The request's `spec.user_data` as sent, or its whole body when it has none."""
    raw = (await request.body()).decode("utf-8", "replace")
    with contextlib.suppress(ValueError, AttributeError):
        user_data = json.loads(raw).get("spec", {}).get("user_data")
        if isinstance(user_data, str):
            return user_data
    return raw


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        raise ApiError.invalid("body", "a JSON object is required")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ApiError.invalid("body", f"invalid JSON: {exc}") from None
