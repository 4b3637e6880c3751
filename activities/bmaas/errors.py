"""The BMaaS error taxonomy: every failure leaves the client as a typed `ApplicationError`.

Retryability is decided here, once, from the gRPC code the REST gateway reports (falling back to the
HTTP status), so workflows only ever see a handful of stable `type` strings.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any

from temporalio.exceptions import ApplicationError

from contracts.bmaas import NON_RETRYABLE_ERRORS, BmaasErrorType

# gRPC status codes (google.rpc.Code) by number, for messages and mapping.
GRPC_CODE_NAMES: dict[int, str] = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
_GRPC_CODE_NUMBERS = {name: num for num, name in GRPC_CODE_NAMES.items()}

_BY_GRPC_CODE: dict[int, BmaasErrorType] = {
    3: BmaasErrorType.INVALID_ARGUMENT,
    11: BmaasErrorType.INVALID_ARGUMENT,
    9: BmaasErrorType.FAILED_PRECONDITION,
    16: BmaasErrorType.UNAUTHENTICATED,
    7: BmaasErrorType.PERMISSION_DENIED,
    5: BmaasErrorType.NOT_FOUND,
    6: BmaasErrorType.ALREADY_EXISTS,
    10: BmaasErrorType.CONFLICT,
    12: BmaasErrorType.UNIMPLEMENTED,
}

_BY_HTTP_STATUS: dict[int, BmaasErrorType] = {
    400: BmaasErrorType.INVALID_ARGUMENT,
    401: BmaasErrorType.UNAUTHENTICATED,
    403: BmaasErrorType.PERMISSION_DENIED,
    # No 404: NotFound is "gone" to a release (the host counted wiped), so only the gateway's own
    # code 5 says it. A bare 404 (a proxy's page while a route is re-created) is retried instead.
    404: BmaasErrorType.UNAVAILABLE,
    # A 409 without a gRPC code is a version conflict (ABORTED); ALREADY_EXISTS always carries code 6.
    409: BmaasErrorType.CONFLICT,
    501: BmaasErrorType.UNIMPLEMENTED,
}
# The 4xx that are not the caller's bad input: a timeout (408), a connection to reuse elsewhere
# (421), an early-data refusal (425), rate limiting (429), a request cut off (499, gRPC CANCELLED).
_TRANSIENT_4XX = frozenset({408, 421, 425, 429, 499})

MAX_MESSAGE_CHARS = 400
REDACTED = "<redacted>"
# A run of this many characters of a known secret, in any form it was sent in, is taken for an echo
# of it: a server may quote only a part of the user data, or cut its own message.
SECRET_FRAGMENT_CHARS = 16
# Free text from BMaaS may quote secrets nobody handed to `redact` (a failure condition quoting the
# user data it could not parse, a proxy's page echoing a header): unbroken runs this long (tokens,
# base64, compact JSON) are never human prose.
_SECRET_SHAPED = re.compile(r"\S{64,}")
# Go's encoding/json escapes these too (HTML safety), as \u003c and so on.
_GO_JSON_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def _sent_forms(secret: str) -> list[str]:
    """The secret as it was sent (JSON-encoded in a request body) and as servers quote it back:
    JSON-escaped with non-ASCII kept or escaped, as Go escapes it, base64."""
    escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
    ascii_escaped = json.dumps(secret)[1:-1]
    encoded = base64.b64encode(secret.encode()).decode()
    forms = (secret, escaped, ascii_escaped, ascii_escaped.translate(_GO_JSON_ESCAPES), encoded)
    return list(dict.fromkeys(forms))


def _mask_fragments(text: str, forms: list[str]) -> str:
    """`text` with every span that repeats SECRET_FRAGMENT_CHARS or more characters of a form
    replaced by REDACTED."""
    k = SECRET_FRAGMENT_CHARS
    # The text is short (cut first) and the forms long: its windows are looked up in them, but not
    # in a form that lacks one of the window's characters (a space, in prose).
    alphabets = [(form, frozenset(form)) for form in forms]
    covered = [False] * len(text)
    for i in range(len(text) - k + 1):
        window = text[i : i + k]
        if any(alphabet.issuperset(window) and window in form for form, alphabet in alphabets):
            covered[i : i + k] = [True] * k
    if not any(covered):
        return text
    out: list[str] = []
    for i, char in enumerate(text):
        if not covered[i]:
            out.append(char)
        elif i == 0 or not covered[i - 1]:
            out.append(REDACTED)
    return "".join(out)


def redact(text: str, secrets: Iterable[str]) -> str:
    """Remove every secret from a text, and bound its size (server messages may echo input): each
    secret in every form it is sent in, any run of SECRET_FRAGMENT_CHARS characters of one, and
    secret-shaped runs. The text is cut only after that, so a cut cannot hide an echo."""
    # Very short strings would redact ordinary words; secrets we handle are long.
    forms = [form for secret in secrets if secret and len(secret) >= 8 for form in _sent_forms(secret)]
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    text = _SECRET_SHAPED.sub(REDACTED, text)
    # What is kept after the cut, and a fragment's length past it: a fragment the cut goes through
    # is still seen whole.
    head = text[: MAX_MESSAGE_CHARS + SECRET_FRAGMENT_CHARS]
    cut = len(text) > len(head)
    text = _mask_fragments(head, [form for form in forms if len(form) >= SECRET_FRAGMENT_CHARS])
    if cut or len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + "…"
    return text


class BmaasApiError(ApplicationError):
    """An error answer (or no answer) from the fulfillment service.

    Subclass of `ApplicationError` so it can leave an activity as is; `error_type` and the HTTP and
    gRPC codes let callers inside the activity branch on it (NotFound on delete, AlreadyExists on
    create).
    """

    def __init__(
        self,
        message: str,
        error_type: BmaasErrorType,
        *,
        http_status: int | None = None,
        grpc_code: int | None = None,
        non_retryable: bool | None = None,
    ) -> None:
        if non_retryable is None:
            non_retryable = error_type in NON_RETRYABLE_ERRORS
        super().__init__(message, type=error_type.value, non_retryable=non_retryable)
        self.error_type = error_type
        self.http_status = http_status
        self.grpc_code = grpc_code

    @property
    def is_not_found(self) -> bool:
        return self.error_type == BmaasErrorType.NOT_FOUND

    @property
    def is_already_exists(self) -> bool:
        return self.error_type == BmaasErrorType.ALREADY_EXISTS


def _grpc_code(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    code = body.get("code")
    if isinstance(code, bool):
        return None
    if isinstance(code, int):
        return code
    if isinstance(code, str):
        if code.isdigit():
            return int(code)
        return _GRPC_CODE_NUMBERS.get(code.upper())
    return None


def error_from_response(
    operation: str,
    http_status: int,
    body: Any,
    secrets: Iterable[str] = (),
    *,
    object_id: str | None = None,
    collection: bool = False,
) -> BmaasApiError:
    """Map a gateway error answer `{"code", "message", "details"}` to a typed error. `object_id`: the
    object a request by id is about; a NotFound that does not name it is not the object's.
    `collection`: the request names no object (a list, a create, the watch), so nothing it asks
    about can be "not found": a NotFound there is the route's own."""
    grpc_code = _grpc_code(body)
    server_message = ""
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        server_message = body["message"]
    elif isinstance(body, str):
        server_message = body
    error_type = _BY_GRPC_CODE.get(grpc_code) if grpc_code is not None else None
    if error_type is None:
        if http_status in _BY_HTTP_STATUS:
            error_type = _BY_HTTP_STATUS[http_status]
        elif not 400 <= http_status < 500 or http_status in _TRANSIENT_4XX:
            # 5xx, and a redirect (an auth proxy's) or any other non-4xx: nothing the request can fix.
            error_type = BmaasErrorType.UNAVAILABLE
        elif grpc_code is not None and grpc_code not in (0,):
            # UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNKNOWN...: transient.
            error_type = BmaasErrorType.UNAVAILABLE
        else:
            error_type = BmaasErrorType.INVALID_ARGUMENT
    route_not_served = http_status == 404 and error_type == BmaasErrorType.UNAVAILABLE
    if error_type == BmaasErrorType.NOT_FOUND and (
        collection or (object_id is not None and object_id not in server_message)
    ):
        # The gateway answers a route it does not serve (a rollout, a wrong prefix) with code 5 and
        # "Not Found" too; the server's own says "object with identifier '<id>' not found". Taken for
        # a BMI gone, it would count an undeleted host as wiped; failing a list or a create for good
        # would release a healthy host.
        error_type = BmaasErrorType.UNAVAILABLE
        route_not_served = True
    code_text = GRPC_CODE_NAMES.get(grpc_code, str(grpc_code)) if grpc_code is not None else "-"
    message = f"{operation}: HTTP {http_status} {code_text}"
    if route_not_served:
        message += " (route not served, or not yet: retried)"
    if server_message:
        message += f": {redact(server_message, secrets)}"
    return BmaasApiError(message, error_type, http_status=http_status, grpc_code=grpc_code)


def transport_error(operation: str, exc: BaseException) -> BmaasApiError:
    """A call that got no answer: always retryable. Only the exception class is kept (no payloads)."""
    kind = "timed out" if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__})"
    return BmaasApiError(f"{operation}: {kind}", BmaasErrorType.TRANSPORT)
