"""A small async client for the fulfillment-service PRIVATE REST API (osac-reference.md §2).

One instance per worker process. It owns the HTTP connection pool, the bearer token (read from a
file and re-read when the file changes, so a rotated token is picked up without a restart) and the
error taxonomy (errors.py). Idempotent reads are retried briefly inside one call; writes are not
(activities make them idempotent instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from opentelemetry import trace
from temporalio import activity

from activities.bmaas.errors import BmaasApiError, error_from_response, transport_error
from activities.file_stamp import FileStamp, file_stamp
from contracts.bmaas import SYSTEM_TENANT, BmaasErrorType

log = logging.getLogger(__name__)

PRIVATE_PREFIX = "/api/private/v1"
INSTANCES = "baremetal_instances"
INSTANCE_TYPES = "bare_metal_instance_types"  # sic: this collection is spelled differently
DISK_IMAGES = "disk_images"
CLUSTER_VERSIONS = "cluster_versions"
CATALOG_ITEMS = "baremetal_instance_catalog_items"
# How long a visible canary vouches for the token's view (a rotation to another identity shows
# within this).
VISIBILITY_TTL_S = 60.0

# One span per call (no-op unless the process set up tracing); see `_call_span`.
_tracer = trace.get_tracer("osac.bmaas")

# Answers worth another try inside one idempotent call.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (httpx.TransportError, TimeoutError)


def cel_string(value: str) -> str:
    """A CEL single-quoted string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class TokenFile:
    """A bearer token kept in a file (e.g. a mounted secret); re-read whenever the file changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: FileStamp | None = None
        self._token: str | None = None

    def _read(self) -> str:
        try:
            stamp = file_stamp(self.path)
            if stamp != self._stamp or self._token is None:
                token = self.path.read_text().strip()
                if not token:
                    raise ValueError("empty")
                self._token, self._stamp = token, stamp
        except (OSError, ValueError) as exc:
            # The path is configuration, not a secret; the content never appears here.
            raise BmaasApiError(
                f"cannot read the BMaaS token file {self.path}: {type(exc).__name__}",
                BmaasErrorType.TOKEN_UNAVAILABLE,
            ) from None
        return self._token

    def get(self) -> str:
        return self._read()

    def reload(self) -> str:
        """Force a re-read (after a 401: the content may have changed within the mtime granularity)."""
        self._stamp = None
        return self._read()

    @property
    def current(self) -> str | None:
        """The last token read, for redaction only."""
        return self._token


class BmaasClient:
    """Async client for `/api/private/v1` of the fulfillment service.

    Args:
        base_url: e.g. ``https://fulfillment.example.com`` (no path).
        token_file: file holding the bearer token (OSAC_FULFILLMENT_TOKEN_FILE).
        timeout: total budget of one call in seconds, retries included.
        ca_bundle: PEM file to verify the server with; the system store when None.
        read_attempts: tries per idempotent call (GET, DELETE) on 5xx/429/connection errors.
        max_in_flight: requests sent at once; the rest wait their turn (within their budget).
        transport / event_hooks: passed to httpx (tests count requests with them).
        visibility_canary: a catalog item of tenant `system` this token must see (OSAC's
            pass-through item). The real server answers an object the caller may not see exactly
            as one that is gone; with a canary, a by-id NotFound counts only while the canary is
            visible (`sees_system_objects`), so a mis-scoped or wrongly rotated token never makes
            an undeleted, unwiped host count as gone. None: every NotFound counts (tests, tools).
    """

    def __init__(
        self,
        base_url: str,
        token_file: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        ca_bundle: str | os.PathLike[str] | None = None,
        read_attempts: int = 4,
        max_in_flight: int = 32,
        transport: httpx.AsyncBaseTransport | None = None,
        event_hooks: Mapping[str, list[Any]] | None = None,
        visibility_canary: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.visibility_canary = visibility_canary
        self._visible_until = 0.0
        self._visible_with: str | None = None  # the token the canary was last seen with
        self.token = TokenFile(token_file)
        self.timeout = timeout
        self.read_attempts = max(1, read_attempts)
        verify: ssl.SSLContext | bool = True
        if ca_bundle is not None:
            verify = ssl.create_default_context(cafile=str(ca_bundle))
        pool = max_in_flight + 2
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            verify=verify,
            transport=transport,
            event_hooks=dict(event_hooks or {}),
            # Per-operation limits; the call budget is enforced around each call with asyncio.timeout.
            timeout=httpx.Timeout(timeout),
            # Requests are bounded below (max_in_flight), so every connection is kept and reused;
            # the watch stream holds one more.
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
        )
        # Thousands of activities may call at once in a burst. Queued inside httpx's pool they cost
        # time quadratic in their number (each completion rescans every queued request) and churn
        # connections; queued here they wait in order on a semaphore.
        self._in_flight = asyncio.Semaphore(max_in_flight)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> BmaasClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing ------------------------------------------------------------------------------

    def _secrets(self, extra: Iterable[str]) -> list[str]:
        found = [s for s in extra if s]
        if self.token.current:
            found.append(self.token.current)
        return found

    def _headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        idempotent: bool | None = None,
        secrets: Iterable[str] = (),
        object_id: str | None = None,
    ) -> Any:
        """One API call under the call budget, traced as one span; returns the decoded JSON answer.
        `object_id`: the object a call by id is about (only a NotFound naming it says it is gone).
        Without one the call is taken as a collection's (list, create): its NotFound is retried."""
        with _call_span(method, path) as span:
            try:
                return await self._request(
                    method,
                    path,
                    params=params,
                    body=body,
                    idempotent=idempotent,
                    secrets=secrets,
                    object_id=object_id,
                )
            except BmaasApiError as err:
                if (
                    err.error_type == BmaasErrorType.NOT_FOUND
                    and object_id is not None
                    and not await self.sees_system_objects()
                ):
                    err = invisible_objects_error(f"{method} {path}", self.visibility_canary)
                _span_failed(span, err)
                raise err from None

    async def sees_system_objects(self, *, fresh: bool = False) -> bool:
        """Whether this token sees CaaS's objects (tenant `system`): the canary catalog item is
        listed. A yes holds for VISIBILITY_TTL_S, for the token it was seen with only (a token
        rotated to the wrong identity is asked about at once); a no is asked again each time, and so
        is any with `fresh`. An error asking is raised: nothing is taken for gone on it either."""
        if self.visibility_canary is None:
            return True
        token = self.token.get()
        if not fresh and token == self._visible_with and time.monotonic() < self._visible_until:
            return True
        page = await self._request(
            "GET",
            f"/{CATALOG_ITEMS}",
            params={
                # A same-named item of a tenant or a shared project proves nothing: tenant system's.
                "filter": f"this.metadata.name == '{self.visibility_canary}'"
                f" && this.metadata.tenant == '{SYSTEM_TENANT}'",
                "limit": 1,
            },
            body=None,
            idempotent=True,
            secrets=(),
            object_id=None,
        )
        items = page.get("items") if isinstance(page, dict) else None
        seen = any(
            isinstance(item, dict) and (item.get("metadata") or {}).get("tenant") == SYSTEM_TENANT
            for item in items or []
        )
        if seen:
            self._visible_with, self._visible_until = token, time.monotonic() + VISIBILITY_TTL_S
        return seen

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None,
        body: Any,
        idempotent: bool | None,
        secrets: Iterable[str],
        object_id: str | None,
    ) -> Any:
        if idempotent is None:
            idempotent = method in ("GET", "DELETE")
        secret_list = list(secrets)
        operation = f"{method} {path}"
        attempts = self.read_attempts if idempotent else 1
        deadline = time.monotonic() + self.timeout
        reauthenticated = False
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise transport_error(operation, TimeoutError())
            try:
                async with asyncio.timeout(remaining), self._in_flight:
                    token = self.token.get()
                    resp = await self._http.request(
                        method, PRIVATE_PREFIX + path, params=params, json=body, headers=self._headers(token)
                    )
                    raw = await resp.aread()
            except BmaasApiError:
                raise
            except httpx.DecodingError:
                raise undecodable(operation) from None
            except _TRANSPORT_ERRORS as exc:
                if attempt >= attempts:
                    raise transport_error(operation, exc) from None
                await self._backoff(attempt, deadline)
                continue
            if resp.status_code < 300:
                return _decode(raw)
            # A rotated token: the file may have changed within one mtime tick; re-read once and retry.
            if resp.status_code == 401 and not reauthenticated:
                reauthenticated = True
                if self.token.reload() != token:
                    attempt -= 1
                    continue
            if idempotent and resp.status_code in _RETRY_STATUSES and attempt < attempts:
                await self._backoff(attempt, deadline)
                continue
            raise error_from_response(
                operation,
                resp.status_code,
                _decode_lenient(raw),
                self._secrets([*secret_list, token]),
                object_id=object_id,
                collection=object_id is None,
            )

    async def _backoff(self, attempt: int, deadline: float) -> None:
        delay = min(2.0, 0.1 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        delay = min(delay, max(0.0, deadline - time.monotonic()))
        await asyncio.sleep(delay)

    # -- generic resources ---------------------------------------------------------------------

    async def list_all(
        self, collection: str, cel_filter: str | None = None, page_size: int = 100
    ) -> list[Any]:
        """Every item of a collection matching a CEL filter, in pages by keyset.

        The server orders every List by id (generic_dao_list.go; the API's `order` is never read), so
        each page asks for the ids after the last one seen (`this.id > '<last>'`, which its filter
        translator supports). Offsets would shift when an object before the offset disappears between
        two pages, and the first object of the next page would be skipped: a live BMI a relist
        missed could be taken for gone.
        """
        items: list[Any] = []
        seen: set[str] = set()
        last: str | None = None
        while True:
            clauses = [f"({cel_filter})"] if cel_filter and cel_filter.strip() else []
            if last is not None:
                clauses.append(f"this.id > {cel_string(last)}")
            params: dict[str, str | int] = {"limit": page_size}
            if clauses:
                params["filter"] = " && ".join(clauses)
            page = await self.request("GET", f"/{collection}", params=params)
            if not isinstance(page, dict):
                raise BmaasApiError(f"GET /{collection}: not a list answer", BmaasErrorType.PROTOCOL)
            batch = page.get("items") or []
            ids = [item.get("id") if isinstance(item, dict) else None for item in batch]
            if not all(isinstance(i, str) and i and i not in seen for i in ids):
                # No next page can be asked for without ids, and a repeated one would loop for ever.
                raise BmaasApiError(
                    f"GET /{collection}: a page without ids, or repeating ids", BmaasErrorType.PROTOCOL
                )
            seen.update(str(i) for i in ids)
            items.extend(batch)
            # `total` counts what matched this page's filter: the rest, from this page on.
            total = _as_int(page.get("total"))
            if not batch or (len(batch) >= total if total is not None else len(batch) < page_size):
                return items
            last = str(ids[-1])

    async def get(self, collection: str, object_id: str) -> dict[str, Any]:
        obj = await self.request("GET", f"/{collection}/{_segment(object_id)}", object_id=object_id)
        if not isinstance(obj, dict):
            raise BmaasApiError(f"GET /{collection}/{object_id}: not an object", BmaasErrorType.PROTOCOL)
        return obj

    # -- BareMetalInstances --------------------------------------------------------------------

    async def create_instance(self, obj: Mapping[str, Any], *, secrets: Iterable[str] = ()) -> dict[str, Any]:
        created = await self.request("POST", f"/{INSTANCES}", body=obj, idempotent=False, secrets=secrets)
        if not isinstance(created, dict) or not created.get("id"):
            raise BmaasApiError(f"POST /{INSTANCES}: answer without an id", BmaasErrorType.PROTOCOL)
        return created

    async def get_instance(self, bmi_id: str) -> dict[str, Any]:
        return await self.get(INSTANCES, bmi_id)

    async def delete_instance(self, bmi_id: str) -> None:
        await self.request("DELETE", f"/{INSTANCES}/{_segment(bmi_id)}", object_id=bmi_id)

    async def update_instance(
        self, bmi_id: str, body: Mapping[str, Any], *, update_mask: str, lock: bool = True
    ) -> dict[str, Any]:
        """PATCH the fields named by `update_mask`; with `lock`, only if `metadata.version` in the body
        is still the stored one (a version conflict is a retryable `BmaasConflict`)."""
        params: dict[str, str | int] = {"update_mask": update_mask}
        if lock:
            params["lock"] = "true"
        updated = await self.request(
            "PATCH",
            f"/{INSTANCES}/{_segment(bmi_id)}",
            params=params,
            body=body,
            idempotent=False,
            object_id=bmi_id,
        )
        if not isinstance(updated, dict):
            raise BmaasApiError(f"PATCH /{INSTANCES}/{bmi_id}: not an object", BmaasErrorType.PROTOCOL)
        return updated

    async def list_instances(self, cel_filter: str | None = None) -> list[dict[str, Any]]:
        """The BMIs the filter matches. None listed counts only while the token sees CaaS's objects
        (the canary): a release that finds nothing to delete must not be a mis-scoped token's."""
        items = await self.list_all(INSTANCES, cel_filter)
        if not items and not await self.sees_system_objects():
            raise invisible_objects_error(f"GET /{INSTANCES}", self.visibility_canary)
        return items

    # -- events/watch --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def watch(
        self, cel_filter: str | None, *, idle_timeout: float
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Open `GET /events/watch`; yields an iterator of `event` objects once the stream is open.

        `idle_timeout` bounds the silence between lines: a half-open connection is then noticed and the
        caller re-subscribes (and re-lists). It bounds the wait for the answer too, not the call
        budget: the real gateway answers a subscription only with its first event (see the twin's
        `watch_headers_with_first_event`), which may be minutes away, and a subscription given up
        misses what happens until the next one.
        """
        operation = "GET /events/watch"
        params = {"filter": cel_filter} if cel_filter else None
        token = self.token.get()
        timeout = httpx.Timeout(self.timeout, read=idle_timeout)
        async with contextlib.AsyncExitStack() as stack:
            try:
                resp = await stack.enter_async_context(
                    self._http.stream(
                        "GET",
                        PRIVATE_PREFIX + "/events/watch",
                        params=params,
                        headers=self._headers(token),
                        timeout=timeout,
                    )
                )
                if resp.status_code >= 300:
                    async with asyncio.timeout(self.timeout):
                        raw = await resp.aread()
            except httpx.DecodingError:
                raise undecodable(operation) from None
            except _TRANSPORT_ERRORS as exc:
                raise transport_error(operation, exc) from None
            if resp.status_code >= 300:
                if resp.status_code == 401:
                    self.token.reload()
                body = _decode_lenient(raw)
                raise error_from_response(
                    operation, resp.status_code, body, self._secrets((token,)), collection=True
                )
            yield _events(resp, operation, self._secrets((token,)))


async def _events(resp: httpx.Response, operation: str, secrets: list[str]) -> AsyncIterator[dict[str, Any]]:
    try:
        async for line in resp.aiter_lines():
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                raise BmaasApiError(f"{operation}: undecodable line", BmaasErrorType.PROTOCOL) from None
            if not isinstance(message, dict):
                continue
            if "error" in message:
                # The gateway reports a failed stream in-band: {"error": {code, message}}.
                raise error_from_response(
                    operation, resp.status_code, message["error"], secrets, collection=True
                )
            result = message.get("result")
            event = result.get("event") if isinstance(result, dict) else None
            if isinstance(event, dict):
                yield event
    except httpx.DecodingError:
        raise undecodable(operation) from None
    except _TRANSPORT_ERRORS as exc:
        raise transport_error(operation, exc) from None


def undecodable(operation: str) -> BmaasApiError:
    """An answer whose body cannot be decoded (a Content-Encoding it does not have): retryable."""
    return BmaasApiError(f"{operation}: the answer's body cannot be decoded", BmaasErrorType.PROTOCOL)


def _call_span(method: str, path: str) -> contextlib.AbstractContextManager[trace.Span]:
    """A client span for one call: method, route template and BMI id, plus the order and worker slot
    of the calling activity (from its workflow id). Never the query, the body or the token."""
    segments = path.strip("/").split("/")
    route = "/" + "/".join(segments[:1] + ["{id}"] * (len(segments) > 1) + segments[2:])
    attributes: dict[str, str] = {"http.request.method": method, "osac.bmaas.route": route}
    if segments[0] == INSTANCES and len(segments) > 1:
        attributes["osac.bmi_id"] = segments[1]
    if activity.in_activity():
        parts = (activity.info().workflow_id or "").split("/")
        if len(parts) >= 3:  # cluster-workers/<namespace>/<order> or worker/<namespace>/<order>/<slot>
            attributes["osac.order"] = f"{parts[1]}/{parts[2]}"
        if len(parts) == 4 and parts[0] == "worker":
            attributes["osac.slot"] = parts[3]
    return _tracer.start_as_current_span(
        f"bmaas {method} {route}",
        kind=trace.SpanKind.CLIENT,
        attributes=attributes,
        # Error messages may quote the server: the span gets the error type only.
        record_exception=False,
        set_status_on_exception=False,
    )


def _span_failed(span: trace.Span, err: BmaasApiError) -> None:
    span.set_attribute("error.type", err.error_type.value)
    if err.http_status is not None:
        span.set_attribute("http.response.status_code", err.http_status)
    span.set_status(trace.StatusCode.ERROR, err.error_type.value)


def _segment(value: str) -> str:
    """An id as one path segment (ids are server generated, but never trust a path)."""
    return quote(value, safe="")


def _decode(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise BmaasApiError("BMaaS answer is not JSON", BmaasErrorType.PROTOCOL) from None


def _decode_lenient(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        return raw.decode("utf-8", "replace")  # redacted whole by error_from_response, then cut


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e999 is infinity
        return None


def invisible_objects_error(operation: str, canary: str | None) -> BmaasApiError:
    """A NotFound (or an empty answer) that cannot be trusted: retried, never taken for gone."""
    return BmaasApiError(
        f"{operation}: BMaaS answers as if the objects were gone, but this token does not see the"
        f" system-owned catalog item {canary!r} either: its identity may not see CaaS's objects (a"
        " mis-scoped or wrongly rotated OSAC_FULFILLMENT_TOKEN_FILE); not taken for gone, retried",
        BmaasErrorType.UNAVAILABLE,
    )
