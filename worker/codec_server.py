"""A codec server for the Temporal Web UI and CLI: `POST /encode` and `POST /decode`.

The UI (started with `--ui-codec-endpoint http://HOST:PORT`, or `TEMPORAL_CODEC_ENDPOINT` for the
`temporalio/ui` image) sends `{"payloads": [...]}` in the protobuf JSON form and shows what comes back,
so operators can read encrypted inputs, results and summaries in their browser. The browser calls
this server directly, so CORS allows only the UI's origin.

It decrypts for whoever can reach it, unless given a shared credential (`AuthFile`,
OSAC_CODEC_SERVER_AUTH_FILE): then /encode and /decode want that exact Authorization header, which
the `temporal` CLI sends from TEMPORAL_CODEC_AUTH. Otherwise bind it to loopback (the default) or put
it behind the same authentication as the UI.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

from activities.file_stamp import FileStamp, file_stamp
from worker.codec import PayloadDecryptError
from worker.settings import CodecSettings, ConfigError, env_variable

log = logging.getLogger(__name__)

DEFAULT_UI_ORIGIN = "http://localhost:8233"  # the dev server's Web UI
MAX_BODY_BYTES = 16 * 1024 * 1024


class AuthFile:
    """The Authorization header value /encode and /decode require, from a file (a mounted Secret)
    re-read whenever it changes, so a rotated credential applies without a restart."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._file_stamp()
        self._value: bytes | None = self._read()  # a ConfigError at start: the command exits 2

    def _file_stamp(self) -> FileStamp | None:
        try:
            return file_stamp(self.path)
        except OSError:
            return None

    def _read(self) -> bytes:
        where = f"{env_variable(CodecSettings, 'server_auth_file')}={self.path}"
        try:
            # Raw bytes: compared with the header's bytes as sent. Surrounding whitespace (a
            # Secret's trailing newline) is no part of a header value.
            value = self.path.read_bytes().strip()
        except OSError as err:
            raise ConfigError([f"{where}: cannot read it ({err.strerror or type(err).__name__})"]) from None
        if not value:
            raise ConfigError([f"{where}: the file is empty (it holds the Authorization header value)"])
        if b"\n" in value or b"\r" in value:
            raise ConfigError([f"{where}: more than one line (it holds one Authorization header value)"])
        return value

    def expected(self) -> bytes | None:
        """The current value; None while the file cannot be used (every request is then refused)."""
        stamp = self._file_stamp()
        if stamp != self._stamp:
            self._stamp = stamp  # a file that cannot be used is not read again until it changes
            try:
                self._value = self._read()
            except ConfigError as err:
                # Fail closed: no request passes on a credential the operator may have revoked.
                self._value = None
                log.warning("%s; /encode and /decode answer 503 until it is fixed", err)
        return self._value

    def check(self, request: Request) -> Response | None:
        """None when the request carries the expected header, else the answer to give it."""
        expected = self.expected()
        if expected is None:
            return JSONResponse({"message": "the codec server's credential is unavailable"}, status_code=503)
        # Starlette decodes header values as latin-1: back to the bytes that were sent.
        given = request.headers.get("authorization", "").encode("latin-1")
        if hmac.compare_digest(given, expected):  # constant time: no guessing it byte by byte
            return None
        scheme = expected.split(b" ", 1)[0].decode("latin-1") if b" " in expected else "Bearer"
        return JSONResponse(
            {"message": "missing or wrong Authorization header"},
            status_code=401,
            headers={"WWW-Authenticate": f'{scheme} realm="osac-codec"'},
        )


def is_loopback(host: str) -> bool:
    """Whether a bind host only accepts local connections ("" and 0.0.0.0 accept every one)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


def create_codec_app(
    codec: PayloadCodec, ui_origins: Sequence[str] = (DEFAULT_UI_ORIGIN,), auth: AuthFile | None = None
) -> FastAPI:
    """The app; with `auth`, /encode and /decode want its Authorization header (CORS preflights,
    which carry no credential, and /healthz stay open)."""
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
        if auth is not None and (denied := auth.check(request)) is not None:
            return denied
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return JSONResponse({"message": "request too large"}, status_code=413)
        try:
            # Decoded here: protobuf's own decoding lets UnicodeDecodeError out (a 500).
            payloads = json_format.Parse(body.decode("utf-8"), Payloads())
        except UnicodeDecodeError:
            return JSONResponse({"message": "the request body is not UTF-8"}, status_code=400)
        except json_format.ParseError as err:
            return JSONResponse(
                {"message": f"expected protobuf JSON {{payloads: [...]}}: {err}"}, status_code=400
            )
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
