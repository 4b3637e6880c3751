"""A codec server for the Temporal Web UI and CLI: `POST /encode` and `POST /decode`.

The UI (started with `--ui-codec-endpoint http://HOST:PORT`, or `TEMPORAL_CODEC_ENDPOINT` for the
`temporalio/ui` image) sends `{"payloads": [...]}` in the protobuf JSON form and shows what comes back,
so operators can read encrypted inputs, results and summaries in their browser. The browser calls
this server directly, so CORS allows only the UI's origin.

It decrypts for whoever can reach it: bind it to loopback (the default) or put it behind the same
authentication as the UI.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from worker.codec import PayloadDecryptError

DEFAULT_UI_ORIGIN = "http://localhost:8233"  # the dev server's Web UI
MAX_BODY_BYTES = 16 * 1024 * 1024


def create_codec_app(codec: PayloadCodec, ui_origins: Sequence[str] = (DEFAULT_UI_ORIGIN,)) -> FastAPI:
    app = FastAPI(title="osac-workers codec server", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=[origin.rstrip("/") for origin in ui_origins],
        # The UI may send its session cookie or access token along ("include credentials").
        allow_credentials=True,
        allow_methods=["POST"],
        allow_headers=["Content-Type", "X-Namespace", "Authorization"],
    )

    async def apply(
        request: Request, operation: Callable[[Sequence[Payload]], Awaitable[list[Payload]]]
    ) -> Response:
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return JSONResponse({"message": "request too large"}, status_code=413)
        try:
            payloads = json_format.Parse(body, Payloads())
        except json_format.ParseError:
            return JSONResponse({"message": "expected protobuf JSON {payloads: [...]}"}, status_code=400)
        try:
            result = await operation(list(payloads.payloads))
        except PayloadDecryptError as err:
            return JSONResponse({"message": str(err)}, status_code=400)
        return Response(
            json_format.MessageToJson(Payloads(payloads=result), indent=None),
            media_type="application/json",
        )

    @app.post("/encode")
    async def encode(request: Request) -> Response:
        return await apply(request, codec.encode)

    @app.post("/decode")
    async def decode(request: Request) -> Response:
        return await apply(request, codec.decode)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
