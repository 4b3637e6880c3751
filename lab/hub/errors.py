"""Kubernetes `Status` errors: every failure leaves the hub as a `kind: Status` object, like a real server."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    BAD_REQUEST = "BadRequest"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    ALREADY_EXISTS = "AlreadyExists"
    CONFLICT = "Conflict"
    EXPIRED = "Expired"
    INVALID = "Invalid"
    UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"
    NOT_ACCEPTABLE = "NotAcceptable"
    INTERNAL_ERROR = "InternalError"


class CauseType(StrEnum):
    REQUIRED = "FieldValueRequired"
    INVALID = "FieldValueInvalid"
    NOT_SUPPORTED = "FieldValueNotSupported"
    TYPE_INVALID = "FieldValueTypeInvalid"
    TOO_LONG = "FieldValueTooLong"
    TOO_MANY = "FieldValueTooMany"
    FORBIDDEN = "FieldValueForbidden"
    DUPLICATE = "FieldValueDuplicate"
    NAMESPACE_TERMINATING = "NamespaceTerminating"


class Cause:
    __slots__ = ("field", "message", "reason")

    def __init__(self, reason: CauseType, field: str, message: str) -> None:
        self.reason = reason
        self.field = field
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"reason": str(self.reason), "message": self.message, "field": self.field}

    def __repr__(self) -> str:
        return f"Cause({self.reason}, {self.field!r}, {self.message!r})"


class ApiError(Exception):
    """Raised anywhere in request handling; the routes turn it into the Status response."""

    def __init__(
        self,
        code: int,
        reason: Reason,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        plain: bool = False,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.plain = plain  # answered as the bare text, not as a Status (see page_not_found)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": str(self.reason),
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(group: str, kind: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return details


def qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def bad_request(message: str) -> ApiError:
    return ApiError(400, Reason.BAD_REQUEST, message)


def unauthorized() -> ApiError:
    return ApiError(401, Reason.UNAUTHORIZED, "Unauthorized")


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404, Reason.NOT_FOUND, f'{qualified(plural, group)} "{name}" not found', _details(group, plural, name)
    )


def path_not_found() -> ApiError:
    return ApiError(
        404,
        Reason.NOT_FOUND,
        "the server could not find the requested resource",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
    )


def page_not_found() -> ApiError:
    """A 404 that is no Status: what a proxy in front of the hub, or the apiserver's own handler of
    paths it does not serve, answers (text/plain `404 page not found`)."""
    return ApiError(404, Reason.NOT_FOUND, "404 page not found", plain=True)


def empty_answer() -> ApiError:
    """A 200 with an empty body: what a proxy that cut the answer short sends (not an error to the
    HTTP client, which must not take it for an object or an empty list)."""
    return ApiError(200, Reason.INTERNAL_ERROR, "", plain=True)


def method_not_allowed(verb: str, plural: str, group: str) -> ApiError:
    return ApiError(
        405,
        Reason.METHOD_NOT_ALLOWED,
        "the server does not allow this method on the requested resource "
        f"({verb} {qualified(plural, group)})",
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        Reason.ALREADY_EXISTS,
        f'{qualified(plural, group)} "{name}" already exists',
        _details(group, plural, name),
    )


def conflict(plural: str, group: str, name: str, why: str | None = None) -> ApiError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(
        409,
        Reason.CONFLICT,
        f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {why}',
        _details(group, plural, name),
    )


def expired(message: str) -> ApiError:
    return ApiError(410, Reason.EXPIRED, message)


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    rendered = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    details = _details(group, kind, name)
    details["causes"] = [c.as_dict() for c in causes]
    return ApiError(422, Reason.INVALID, f'{qualified(kind, group)} "{name}" is invalid: {summary}', details)


def unprocessable(message: str) -> ApiError:
    # What a real server answers for a JSON patch that cannot be applied.
    return ApiError(422, Reason.INVALID, message)


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    subject = f'{qualified(plural, group)} "{name}"' if name else qualified(plural, group)
    return ApiError(403, Reason.FORBIDDEN, f"{subject} is forbidden: {why}", _details(group, plural, name))


def forbidden_terminating(plural: str, group: str, name: str, namespace: str) -> ApiError:
    message = f"unable to create new content in namespace {namespace} because it is being terminated"
    details = _details(group, plural, name)
    details["causes"] = [
        {"reason": str(CauseType.NAMESPACE_TERMINATING), "message": message, "field": "metadata.namespace"}
    ]
    return ApiError(
        403, Reason.FORBIDDEN, f'{qualified(plural, group)} "{name}" is forbidden: {message}', details
    )


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        Reason.UNSUPPORTED_MEDIA_TYPE,
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def internal_error(message: str) -> ApiError:
    return ApiError(500, Reason.INTERNAL_ERROR, message)
