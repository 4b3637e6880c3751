"""The hub twin's ASGI app factory."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import APIRouter, FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from lab.hub import errors, lab_routes, routes
from lab.hub.config import HubConfig
from lab.hub.errors import ApiError
from lab.hub.hub import Hub

__all__ = ["HubConfig", "HubService", "create_hub_app"]

log = logging.getLogger(__name__)


class HubService(Protocol):
    """Something that runs beside the API (e.g. a lab controller, as an HTTP client of it).

    Started in the app lifespan after storage is ready and stopped before it ends. The HTTP server
    starts listening only after every `start()` returned, so a service must not wait for the API
    inside `start()`; it should start a task that connects (and retries) instead.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def create_hub_app(
    config: HubConfig, routers: Sequence[APIRouter] = (), services: Sequence[HubService] = ()
) -> FastAPI:
    hub = Hub(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await hub.start()
        started: list[HubService] = []
        try:
            for service in services:
                await service.start()
                started.append(service)
            yield
        finally:
            hub.begin_shutdown()
            for service in reversed(started):
                try:
                    await service.stop()
                except Exception:
                    log.exception("hub service %r failed to stop", service)
            await hub.stop()

    app = FastAPI(title="OSAC hub twin", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.hub = hub

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return routes.status_response(exc)

    async def not_found(request: Request, exc: Exception) -> Response:
        # Unknown paths answer a Status like a real server; other routers' own HTTP errors pass through.
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404 and exc.detail == "Not Found":
            return routes.status_response(errors.path_not_found())
        if exc.status_code == 405 and exc.detail == "Method Not Allowed":
            return routes.status_response(
                ApiError(405, errors.Reason.METHOD_NOT_ALLOWED, "the server does not allow this method")
            )
        return Response(
            content=json.dumps({"detail": exc.detail}),
            status_code=exc.status_code,
            media_type="application/json",
            headers=getattr(exc, "headers", None),
        )

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, not_found)
    for router in routers:  # first, so their paths win over the generic resource routes
        app.include_router(router)
    app.include_router(lab_routes.router)
    app.include_router(routes.router)
    return app
