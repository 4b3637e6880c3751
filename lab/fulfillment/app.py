"""The fulfillment twin's ASGI app.

    from lab.fulfillment import FulfillmentConfig, FulfillmentLab, create_fulfillment_app
    from lab.http_server import ThreadedServer

    lab = FulfillmentLab(FulfillmentConfig(hosts=4, tenant_tokens={"t0ken-of-tenant-a": "tenant-a"}),
                         boot_seam=None)      # None: RecordingBootSeam(); the hub twin passes its own
    with ThreadedServer(create_fulfillment_app(lab)) as server:
        ...  # server.url; Authorization: Bearer <lab.config.admin_token>

`FulfillmentLab(config: FulfillmentConfig | None = None, *, boot_seam: BootSeam | None = None)`; the
config holds the tokens, host count, timings and seed (see lab.py). One app per lab.

Errors are the gateway's JSON (`{"code", "message", "details"}`) everywhere, including unknown routes
and malformed query parameters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lab.fulfillment.errors import ApiError, GrpcCode, PlainTextAnswer, field_path
from lab.fulfillment.lab import FulfillmentLab
from lab.fulfillment.routes_api import private_router, public_router
from lab.fulfillment.routes_lab import lab_router

log = logging.getLogger(__name__)


def _hosting_uvicorn_server(app: FastAPI) -> uvicorn.Server | None:
    """The uvicorn Server serving `app` on this loop, if any.

    uvicorn gives an HTTP app no notice of shutdown and waits for open responses to finish, so an
    endless watch stream would hold the server forever. Finding the server lets the app see
    `should_exit` and end its streams itself.
    """
    for task in asyncio.all_tasks():
        frame = getattr(task.get_coro(), "cr_frame", None)
        candidate = frame.f_locals.get("self") if frame is not None else None
        if isinstance(candidate, uvicorn.Server) and candidate.config.app is app:
            return candidate
    return None


async def _end_streams_when_server_exits(app: FastAPI, lab: FulfillmentLab) -> None:
    server = _hosting_uvicorn_server(app)
    if server is None:
        return  # not under uvicorn.Server.serve(): the owner calls lab.aclose() first
    # `should_exit` is a plain attribute uvicorn polls too; there is no event to wait on.
    while not server.should_exit:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    lab.begin_shutdown()


def create_fulfillment_app(lab: FulfillmentLab) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watcher = asyncio.create_task(_end_streams_when_server_exits(app, lab))
        try:
            yield
        finally:
            watcher.cancel()
            await lab.aclose()

    app = FastAPI(
        title="OSAC fulfillment-service twin",
        description="BareMetalInstances and friends, private and public API, plus lab-only knobs.",
        lifespan=lifespan,
        openapi_url="/lab/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.lab = lab
    app.include_router(private_router())
    app.include_router(public_router())
    app.include_router(lab_router())

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(PlainTextAnswer)
    async def plain_text(_: Request, exc: PlainTextAnswer) -> PlainTextResponse:
        return PlainTextResponse(exc.text, status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        # Drop the "query"/"path"/"body" marker: the parameter name is what the caller typed.
        name = field_path(loc[1:] if loc and loc[0] in ("query", "path", "body") else loc)
        return ApiError.invalid(name, str(err.get("msg", "invalid value"))).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            code = GrpcCode.NOT_FOUND
        elif exc.status_code == 405:
            code = GrpcCode.UNIMPLEMENTED
        else:
            code = GrpcCode.UNKNOWN
        # As grpc-gateway's routing handler answers: the status text alone, no path or id.
        body = ApiError(code, str(exc.detail)).body()
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return ApiError(GrpcCode.INTERNAL, "internal error").response()

    return app
