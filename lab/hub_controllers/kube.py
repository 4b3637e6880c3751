"""A small async client of a Kubernetes-compatible API server (the hub), over plain REST.

The controllers are real API clients on purpose: they go through authentication, schema validation,
resourceVersion conflicts and watches exactly like the real assisted-service and CAPI provider, so
the hub twin is exercised the way production exercises the real hub.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

from lab.hub_controllers.resources import ApiResource

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class PatchType(StrEnum):
    MERGE = "application/merge-patch+json"
    JSON = "application/json-patch+json"


class WatchEventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    ERROR = "ERROR"


@dataclass(frozen=True)
class WatchEvent:
    type: WatchEventType
    object: Obj


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message

    @property
    def is_not_found(self) -> bool:
        return self.code == 404

    @property
    def is_conflict(self) -> bool:
        # AlreadyExists is a 409 too; only a resourceVersion mismatch means "re-read and retry".
        return self.code == 409 and self.reason != "AlreadyExists"

    @property
    def is_already_exists(self) -> bool:
        return self.code == 409 and self.reason == "AlreadyExists"

    @property
    def is_gone(self) -> bool:
        return self.code == 410


def _error_from(response: httpx.Response) -> ApiError:
    reason, message = response.reason_phrase, response.text[:500]
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or message)
    return ApiError(response.status_code, reason, message)


def meta(obj: Obj) -> Obj:
    result: Obj = obj.setdefault("metadata", {})
    return result


def key_of(obj: Obj) -> str:
    m = obj.get("metadata", {})
    ns = m.get("namespace") or ""
    return f"{ns}/{m.get('name', '')}" if ns else str(m.get("name", ""))


def split_key(key: str) -> tuple[str | None, str]:
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else (None, ns)


Mutator = Callable[[Obj], Obj | None]

# Requests (not watches) in flight at once. A burst beyond this waits here, in order and at no cost:
# waiting in httpcore's pool instead costs CPU quadratic in the queue (it matches every waiting
# request against every connection on each change), which in a burst of 500 registrations starved
# the hub's own thread and collapsed the twins. All of them stay alive: reconnecting costs more.
MAX_REQUESTS_IN_FLIGHT = 64


class KubeApi:
    """Typed-enough REST verbs; every error surfaces as `ApiError` with the server's reason."""

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 30.0, verify: bool | ssl.SSLContext = True
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._in_flight = asyncio.Semaphore(MAX_REQUESTS_IN_FLIGHT)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            verify=verify,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=httpx.Timeout(timeout, connect=5.0),
            # Watches hold connections of their own beside the requests.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=MAX_REQUESTS_IN_FLIGHT),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if content is not None else None
        try:
            async with asyncio.timeout(self._timeout):
                await self._in_flight.acquire()
        except TimeoutError:
            # What the pool raised when it waited this long: callers treat it as the hub unreachable.
            busy = f"{MAX_REQUESTS_IN_FLIGHT} requests in flight for {self._timeout:.0f}s"
            raise httpx.PoolTimeout(busy) from None
        try:
            response = await self._client.request(
                method, path, params=params, content=content, headers=headers
            )
        finally:
            self._in_flight.release()
        if response.status_code >= 400:
            raise _error_from(response)
        result: Obj = response.json() if response.content else {}
        return result

    async def get(self, res: ApiResource, namespace: str | None, name: str) -> Obj | None:
        try:
            return await self._request("GET", res.object_path(namespace, name))
        except ApiError as exc:
            if exc.is_not_found:
                return None
            raise

    async def list(
        self, res: ApiResource, namespace: str | None = None, label_selector: str | None = None
    ) -> tuple[list[Obj], str]:
        params = {"labelSelector": label_selector} if label_selector else None
        body = await self._request("GET", res.collection_path(namespace), params=params)
        items: list[Obj] = body.get("items") or []
        for item in items:  # list items omit kind/apiVersion on a real server
            item.setdefault("kind", res.kind)
            item.setdefault("apiVersion", res.api_version)
        return items, str(body.get("metadata", {}).get("resourceVersion", ""))

    async def create(self, res: ApiResource, body: Obj) -> Obj:
        body = {"apiVersion": res.api_version, "kind": res.kind, **body}
        namespace = body.get("metadata", {}).get("namespace")
        return await self._request("POST", res.collection_path(namespace), body=body)

    async def replace(self, res: ApiResource, obj: Obj, subresource: str | None = None) -> Obj:
        """PUT carrying the object's resourceVersion: a compare-and-swap (409 if it moved)."""
        m = obj["metadata"]
        path = res.object_path(m.get("namespace"), m["name"], subresource)
        return await self._request("PUT", path, body=obj)

    async def patch(
        self,
        res: ApiResource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Obj:
        path = res.object_path(namespace, name, subresource)
        return await self._request("PATCH", path, body=patch, content_type=patch_type.value)

    async def delete(
        self, res: ApiResource, namespace: str | None, name: str, uid: str | None = None
    ) -> bool:
        """Delete; False when already gone. `uid` guards against deleting a re-created namesake."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._request("DELETE", res.object_path(namespace, name), body=body)
        except ApiError as exc:
            if exc.is_not_found:
                return False
            raise
        return True

    async def mutate(
        self,
        res: ApiResource,
        namespace: str | None,
        name: str,
        mutator: Mutator,
        *,
        subresource: str | None = None,
        attempts: int = 10,
        cached: Obj | None = None,
    ) -> Obj | None:
        """Read-modify-write with conflict retry; `mutator` returns None for "nothing to change".

        Returns the stored object (None when it does not exist). The mutator sees a private copy of
        the freshest object on every attempt, so it must be a pure function of that object. With
        `cached` (an informer's copy, never modified here) the first attempt starts from it instead
        of a GET, as controllers do: its resourceVersion makes the write a compare-and-swap, and a
        conflict falls back to reading the object. When the mutator changes nothing on it, `cached`
        itself is returned.
        """
        for attempt in range(attempts):
            current = cached if attempt == 0 and cached is not None else await self.get(res, namespace, name)
            if current is None:
                return None
            changed = mutator(copy.deepcopy(current))
            if changed is None:
                return current
            try:
                return await self.replace(res, changed, subresource)
            except ApiError as exc:
                if exc.is_not_found and current is cached:
                    return None
                if not exc.is_conflict:
                    raise
                log.debug("conflict writing %s %s/%s; retrying", res.kind, namespace, name)
        raise ApiError(
            409, "Conflict", f"{res.kind} {namespace}/{name}: still conflicting after {attempts} tries"
        )

    async def watch(
        self, res: ApiResource, resource_version: str, timeout_seconds: int = 240
    ) -> AsyncIterator[WatchEvent]:
        """Stream watch events after `resource_version`; raises `ApiError(410)` when it is too old."""
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        # The read timeout outlives the server-side one, so a silent stream still ends and resumes.
        timeout = httpx.Timeout(5.0, read=timeout_seconds + 30.0)
        async with self._client.stream(
            "GET", res.collection_path(), params=params, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise _error_from(response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                raw = json.loads(line)
                kind = WatchEventType(raw.get("type"))
                obj: Obj = raw.get("object") or {}
                if kind is WatchEventType.ERROR:
                    raise ApiError(
                        int(obj.get("code", 500)), str(obj.get("reason", "")), str(obj.get("message", ""))
                    )
                obj.setdefault("kind", res.kind)
                obj.setdefault("apiVersion", res.api_version)
                yield WatchEvent(kind, obj)
