"""The BMaaS REST routes: private (`/api/private/v1`, admin token) and public (`/api/fulfillment/v1`,
tenant tokens). Every handler is `async def` so it runs on the server's loop, the state's single owner."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Send

from lab.fulfillment.catalog import CatalogStore
from lab.fulfillment.celfilter import compile_filter
from lab.fulfillment.deps import admin_caller, count_and_inject_faults, get_lab, read_json, tenant_caller
from lab.fulfillment.events import WATCH_WRITE_MAX_EVENTS, Subscription
from lab.fulfillment.lab import FulfillmentLab
from lab.fulfillment.models import Resource
from lab.fulfillment.objects import Caller, list_answer

PRIVATE_PREFIX = "/api/private/v1"
PUBLIC_PREFIX = "/api/fulfillment/v1"

# Query parameters of List, as the gateway names them.
FilterQ = Query(None, description="CEL over `this`")
# `order` is in the API but the real server never reads it: every List is ordered by id.
OrderQ = Query(None, description="accepted and ignored: items are always ordered by id")
OffsetQ = Query(None)
LimitQ = Query(None)


def _bmi_routes(router: APIRouter, caller_dep: Any) -> None:
    path = "/baremetal_instances"

    @router.get(path)
    async def list_bmis(
        request: Request,
        caller: Caller = Depends(caller_dep),
        filter: str | None = FilterQ,
        order: str | None = OrderQ,
        offset: int | None = OffsetQ,
        limit: int | None = LimitQ,
    ) -> dict[str, Any]:
        return get_lab(request).instances.list_objects(
            caller, filter_expr=filter, order=order, offset=offset, limit=limit
        )

    @router.get(path + "/{id}")
    async def get_bmi(id: str, request: Request, caller: Caller = Depends(caller_dep)) -> dict[str, Any]:
        return get_lab(request).instances.get(id, caller)

    @router.post(path)
    async def create_bmi(request: Request, caller: Caller = Depends(caller_dep)) -> dict[str, Any]:
        body = await read_json(request)
        return get_lab(request).instances.create(body, caller)

    @router.patch(path + "/{id}")
    async def update_bmi(
        id: str,
        request: Request,
        caller: Caller = Depends(caller_dep),
        update_mask: str | None = Query(None),
        lock: bool = Query(False),
    ) -> dict[str, Any]:
        body = await read_json(request)
        return get_lab(request).instances.update(id, body, caller, update_mask=update_mask, lock=lock)

    @router.delete(path + "/{id}")
    async def delete_bmi(id: str, request: Request, caller: Caller = Depends(caller_dep)) -> dict[str, Any]:
        get_lab(request).instances.delete(id, caller)
        return {}


def _catalog_routes(router: APIRouter, path: str, store_of: Any, caller_dep: Any, *, writable: bool) -> None:
    """List/Get (and Create/Update/Delete when writable) for one admin-managed kind."""

    def store(request: Request) -> CatalogStore[Resource]:
        result: CatalogStore[Resource] = store_of(get_lab(request))
        return result

    @router.get(path, name=f"list{path.replace('/', '_')}")
    async def list_objects(
        request: Request,
        caller: Caller = Depends(caller_dep),
        filter: str | None = FilterQ,
        order: str | None = OrderQ,
        offset: int | None = OffsetQ,
        limit: int | None = LimitQ,
    ) -> dict[str, Any]:
        s = store(request)
        items = [s.render(o, caller) for o in s.visible(caller)]
        return list_answer(items, filter_expr=filter, order=order, offset=offset, limit=limit)

    @router.get(path + "/{id}", name=f"get{path.replace('/', '_')}")
    async def get_object(id: str, request: Request, caller: Caller = Depends(caller_dep)) -> dict[str, Any]:
        s = store(request)
        return s.render(s.get(id, caller), caller)

    if not writable:
        return

    @router.post(path, name=f"create{path.replace('/', '_')}")
    async def create_object(request: Request, caller: Caller = Depends(caller_dep)) -> dict[str, Any]:
        s = store(request)
        return s.render(s.create(await read_json(request), caller), caller)

    @router.patch(path + "/{id}", name=f"update{path.replace('/', '_')}")
    async def update_object(
        id: str,
        request: Request,
        caller: Caller = Depends(caller_dep),
        update_mask: str | None = Query(None),
        lock: bool = Query(False),
    ) -> dict[str, Any]:
        s = store(request)
        return s.render(s.update(id, await read_json(request), caller, update_mask, lock), caller)

    @router.delete(path + "/{id}", name=f"delete{path.replace('/', '_')}")
    async def delete_object(
        id: str, request: Request, caller: Caller = Depends(caller_dep)
    ) -> dict[str, Any]:
        store(request).delete(id, caller)
        return {}


class GatewayStreamingResponse(StreamingResponse):
    """A server stream as grpc-gateway answers it: the status and headers go out with the first
    message, not before."""

    async def stream_response(self, send: Send) -> None:
        chunks = aiter(self.body_iterator)
        first = await anext(chunks, None)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if first is not None:
            await send({"type": "http.response.body", "body": first, "more_body": True})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _event_lines(lab: FulfillmentLab, sub: Subscription) -> AsyncIterator[bytes]:
    try:
        while (event := await sub.next()) is not None:
            # What is already buffered goes out in one write, so a burst does not take a write each.
            events = [event]
            while len(events) < WATCH_WRITE_MAX_EVENTS and (more := sub.next_buffered()) is not None:
                events.append(more)
            yield "".join(json.dumps({"result": {"event": e}}) + "\n" for e in events).encode()
    finally:
        lab.bus.unsubscribe(sub)


def private_router() -> APIRouter:
    router = APIRouter(prefix=PRIVATE_PREFIX, dependencies=[Depends(count_and_inject_faults)])
    _bmi_routes(router, admin_caller)
    _catalog_routes(
        router, "/bare_metal_instance_types", lambda lab: lab.catalogs.types, admin_caller, writable=True
    )
    _catalog_routes(router, "/disk_images", lambda lab: lab.catalogs.images, admin_caller, writable=True)
    _catalog_routes(
        router, "/cluster_versions", lambda lab: lab.catalogs.versions, admin_caller, writable=True
    )
    _catalog_routes(
        router,
        "/baremetal_instance_catalog_items",
        lambda lab: lab.catalogs.items,
        admin_caller,
        writable=True,
    )
    _catalog_routes(router, "/subnets", lambda lab: lab.catalogs.subnets, admin_caller, writable=True)
    _catalog_routes(
        router, "/security_groups", lambda lab: lab.catalogs.security_groups, admin_caller, writable=True
    )

    @router.get("/events/watch")
    async def watch(
        request: Request,
        _: Caller = Depends(admin_caller),
        filter: str | None = Query(None, description="CEL over `event`"),
    ) -> StreamingResponse:
        lab = get_lab(request)
        # Subscribed before the answer starts: a client that lists after connecting misses nothing.
        sub = lab.bus.subscribe(compile_filter(filter, "event"))
        answer = (
            GatewayStreamingResponse
            if lab.faults.config.watch_headers_with_first_event
            else StreamingResponse
        )
        return answer(_event_lines(lab, sub), media_type="application/json")

    return router


def public_router() -> APIRouter:
    router = APIRouter(prefix=PUBLIC_PREFIX, dependencies=[Depends(count_and_inject_faults)])
    _bmi_routes(router, tenant_caller)
    _catalog_routes(
        router, "/bare_metal_instance_types", lambda lab: lab.catalogs.types, tenant_caller, writable=False
    )
    return router
