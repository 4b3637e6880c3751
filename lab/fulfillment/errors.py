"""gRPC status codes and the REST gateway's error JSON (`{"code", "message", "details"}`)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from fastapi.responses import JSONResponse


class GrpcCode(IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


# grpc-gateway's runtime.HTTPStatusFromCode.
HTTP_STATUS: dict[GrpcCode, int] = {
    GrpcCode.OK: 200,
    GrpcCode.CANCELLED: 499,
    GrpcCode.UNKNOWN: 500,
    GrpcCode.INVALID_ARGUMENT: 400,
    GrpcCode.DEADLINE_EXCEEDED: 504,
    GrpcCode.NOT_FOUND: 404,
    GrpcCode.ALREADY_EXISTS: 409,
    GrpcCode.PERMISSION_DENIED: 403,
    GrpcCode.RESOURCE_EXHAUSTED: 429,
    GrpcCode.FAILED_PRECONDITION: 400,
    GrpcCode.ABORTED: 409,
    GrpcCode.OUT_OF_RANGE: 400,
    GrpcCode.UNIMPLEMENTED: 501,
    GrpcCode.INTERNAL: 500,
    GrpcCode.UNAVAILABLE: 503,
    GrpcCode.DATA_LOSS: 500,
    GrpcCode.UNAUTHENTICATED: 401,
}


class PlainTextAnswer(Exception):
    """An error answered as plain text, not as gateway JSON: a proxy's or a gateway's own page."""

    def __init__(self, http_status: int, text: str) -> None:
        super().__init__(text)
        self.http_status = http_status
        self.text = text


class ApiError(Exception):
    """An error answered as gateway JSON. Messages name the offending field first."""

    def __init__(self, code: GrpcCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def body(self) -> dict[str, Any]:
        return {"code": int(self.code), "message": self.message, "details": []}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.http_status)

    @classmethod
    def invalid(cls, field: str, problem: str) -> ApiError:
        return cls(GrpcCode.INVALID_ARGUMENT, f"{field}: {problem}")

    @classmethod
    def not_found(cls, kind: str, ident: str) -> ApiError:
        return cls(GrpcCode.NOT_FOUND, f"{kind} '{ident}' not found")

    @classmethod
    def already_exists(cls, message: str) -> ApiError:
        return cls(GrpcCode.ALREADY_EXISTS, message)

    @classmethod
    def unauthenticated(cls) -> ApiError:
        return cls(GrpcCode.UNAUTHENTICATED, "missing or invalid bearer token")

    @classmethod
    def permission_denied(cls, message: str) -> ApiError:
        return cls(GrpcCode.PERMISSION_DENIED, message)

    @classmethod
    def failed_precondition(cls, message: str) -> ApiError:
        return cls(GrpcCode.FAILED_PRECONDITION, message)

    @classmethod
    def aborted(cls, message: str) -> ApiError:
        return cls(GrpcCode.ABORTED, message)

    @classmethod
    def unavailable(cls, message: str) -> ApiError:
        return cls(GrpcCode.UNAVAILABLE, message)

    @classmethod
    def internal(cls, message: str) -> ApiError:
        return cls(GrpcCode.INTERNAL, message)


def field_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """Turn a pydantic error location into `spec.network_attachments[0].primary`."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out or "body"
