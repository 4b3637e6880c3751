"""HTTP routes of the Kubernetes API: discovery, openapi, health, and the resource paths.

Resource paths are parsed by hand (as the apiserver's request-info resolver does) because
`/api/v1/namespaces/<ns>/<plural>` and `/api/v1/namespaces/<name>/status` share a shape.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from lab.hub import discovery, errors, partial, table
from lab.hub.errors import ApiError
from lab.hub.hub import Hub
from lab.hub.objects import DeleteOptions, FieldValidation, Propagation, Subresource, WriteOptions, parse_body
from lab.hub.resources import ResourceType
from lab.hub.selectors import FieldSelector, FieldTerm, parse_field_selector, parse_label_selector
from lab.hub.stats import Verb
from lab.hub.store import EventType, Watcher, encode_event

JSON = "application/json"
# Events sent in one write at most, so one watcher cannot hold the event loop for long.
WATCH_WRITE_MAX_EVENTS = 500

router = APIRouter()


def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def json_response(body: Any, status_code: int = 200, warnings: list[str] | None = None) -> Response:
    response = Response(
        json.dumps(body, separators=(",", ":")).encode(), status_code=status_code, media_type=JSON
    )
    for warning in warnings or []:
        escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
        response.headers.append("Warning", f'299 - "{escaped}"')
    return response


def status_response(error: ApiError) -> Response:
    if error.plain:
        return PlainTextResponse(error.message + "\n" if error.message else "", error.code)
    return json_response(error.status(), error.code)


# -- health, version, discovery, openapi ---------------------------------------------------------


@router.get("/healthz", include_in_schema=False)
@router.get("/readyz", include_in_schema=False)
@router.get("/livez", include_in_schema=False)
async def health() -> Response:
    return PlainTextResponse("ok")


@router.get("/version", include_in_schema=False)
async def version(request: Request) -> Response:
    full = _hub(request).config.server_version
    major, minor = full.lstrip("v").split(".")[:2]
    return json_response(
        {
            "major": major,
            "minor": minor,
            "gitVersion": full,
            "gitCommit": "osac-hub-twin",
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.23",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
    )


def _non_resource(request: Request) -> Hub:
    hub = _hub(request)
    hub.stats.record_non_resource(hub.auth.user(request))
    return hub


@router.get("/api", include_in_schema=False)
async def core_versions(request: Request) -> Response:
    _non_resource(request)
    host = request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
    return json_response(discovery.api_versions(host))


@router.get("/apis", include_in_schema=False)
async def groups(request: Request) -> Response:
    return json_response(discovery.api_group_list(_non_resource(request).registry))


@router.get("/api/v1", include_in_schema=False)
async def core_resources(request: Request) -> Response:
    body = discovery.api_resource_list(_non_resource(request).registry, "", "v1")
    return json_response(body)


@router.get("/apis/{group}", include_in_schema=False)
async def group(request: Request, group: str) -> Response:
    hub = _non_resource(request)
    versions = hub.registry.groups().get(group)
    if not versions or not group:
        raise errors.path_not_found()
    return json_response(discovery.api_group(group, versions))


@router.get("/apis/{group}/{version}", include_in_schema=False)
async def group_resources(request: Request, group: str, version: str) -> Response:
    body = discovery.api_resource_list(_non_resource(request).registry, group, version)
    if body is None:
        raise errors.path_not_found()
    return json_response(body)


@router.get("/openapi/v3", include_in_schema=False)
async def openapi_root(request: Request) -> Response:
    return json_response(_non_resource(request).openapi.root())


@router.get("/openapi/v3/{key:path}", include_in_schema=False)
async def openapi_document(request: Request, key: str) -> Response:
    hub = _non_resource(request)
    data = hub.openapi.documents.get(key.strip("/"))
    if data is None:
        raise errors.path_not_found()
    return Response(data, media_type=JSON, headers={"ETag": f'"{hub.openapi.hashes[key.strip("/")]}"'})


# -- resources -----------------------------------------------------------------------------------


@dataclass
class Target:
    rt: ResourceType
    namespace: str | None  # None: every namespace (collection reads of namespaced kinds)
    name: str | None
    subresource: Subresource
    watch_path: bool  # legacy /watch/ prefix


def _resolve(hub: Hub, group: str, version: str, rest: str) -> Target:
    parts = [p for p in rest.split("/") if p]
    watch_path = bool(parts) and parts[0] == "watch"
    if watch_path:
        parts = parts[1:]
    if not parts:
        raise errors.path_not_found()
    if len(parts) >= 3 and parts[0] == "namespaces":
        rt = hub.resource(group, version, parts[2])
        if rt is not None and rt.namespaced:
            return _target(rt, parts[1], parts[3:], watch_path)
    rt = hub.resource(group, version, parts[0])
    if rt is None:
        raise errors.path_not_found()
    if rt.namespaced:
        if len(parts) > 1:
            raise errors.path_not_found()
        return Target(rt, None, None, Subresource.NONE, watch_path)
    return _target(rt, "", parts[1:], watch_path)


def _target(rt: ResourceType, namespace: str, rest: list[str], watch_path: bool) -> Target:
    if len(rest) > 2:
        raise errors.path_not_found()
    name = rest[0] if rest else None
    subresource = Subresource.NONE
    if len(rest) == 2:
        if rest[1] == "status" and rt.has_status:
            subresource = Subresource.STATUS
        elif rest[1] == "scale" and rt.scale is not None:
            subresource = Subresource.SCALE
        else:
            raise errors.path_not_found()
    return Target(rt, namespace, name, subresource, watch_path)


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1", "yes")


def _write_options(request: Request) -> WriteOptions:
    raw = request.query_params.get("fieldValidation") or "Warn"
    try:
        validation = FieldValidation(raw)
    except ValueError as exc:
        raise errors.bad_request(
            f"fieldValidation parameter unsupported: {raw}; must be one of Ignore, Warn, Strict"
        ) from exc
    return WriteOptions(validation=validation, dry_run=bool(request.query_params.get("dryRun")))


def _verb(method: str, target: Target, watch: bool) -> Verb:
    has_name = target.name is not None
    match method:
        case "GET":
            if watch:
                return Verb.WATCH
            return Verb.GET if has_name else Verb.LIST
        case "POST" if not has_name and target.subresource is Subresource.NONE:
            return Verb.CREATE
        case "PUT" if has_name:
            return Verb.UPDATE
        case "PATCH" if has_name:
            return Verb.PATCH
        case "DELETE" if target.subresource is Subresource.NONE:
            return Verb.DELETE if has_name else Verb.DELETECOLLECTION
    raise errors.method_not_allowed(method.lower(), target.rt.plural, target.rt.group)


@router.api_route(
    "/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False
)
async def core_resource(request: Request, rest: str) -> Response:
    return await _handle(request, "", "v1", rest)


@router.api_route(
    "/apis/{group}/{version}/{rest:path}",
    methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
    include_in_schema=False,
)
async def group_resource(request: Request, group: str, version: str, rest: str) -> Response:
    return await _handle(request, group, version, rest)


async def _handle(request: Request, group: str, version: str, rest: str) -> Response:
    hub = _hub(request)
    user = hub.auth.user(request)
    target = _resolve(hub, group, version, rest)
    rt = target.rt
    query = request.query_params
    watch = target.watch_path or _flag(query.get("watch"))
    verb = _verb(request.method, target, watch)
    if target.namespace is None and verb not in (Verb.LIST, Verb.WATCH, Verb.DELETECOLLECTION):
        raise errors.method_not_allowed(verb, rt.plural, rt.group)
    hub.stats.record(user, verb, rt.group_resource, target.subresource)
    hub.faults.check(user, verb, rt, target.subresource, target.name or "")
    namespace = target.namespace or ""
    accept = request.headers.get("accept", "")
    if target.subresource is Subresource.SCALE:
        return await _scale(hub, target, request, verb)
    match verb:
        case Verb.GET:
            assert target.name is not None
            obj = hub.api.get(rt, namespace, target.name)
            if table.wants_table(accept):
                meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                return json_response(table.table(rt, [obj], meta, query.get("includeObject", "Metadata")))
            if partial.wants_object(accept):
                return json_response(partial.partial_object(obj))
            return json_response(obj)
        case Verb.LIST:
            listed = _list(hub, target, request)
            if table.wants_table(accept):
                return json_response(
                    table.table(
                        rt, listed["items"], listed["metadata"], query.get("includeObject", "Metadata")
                    )
                )
            if partial.wants_list(accept):
                return json_response(partial.partial_list(listed))
            return json_response(listed)
        case Verb.WATCH:
            return _watch(hub, target, request, user)
        case Verb.CREATE:
            opts = _write_options(request)
            body = parse_body(await request.body(), request.headers.get("content-type", JSON))
            created = hub.api.create(rt, namespace, body, opts)
            return json_response(created, 201, opts.warnings)
        case Verb.UPDATE:
            assert target.name is not None
            opts = _write_options(request)
            body = parse_body(await request.body(), request.headers.get("content-type", JSON))
            updated, was_created = hub.api.update(rt, namespace, target.name, body, target.subresource, opts)
            return json_response(updated, 201 if was_created else 200, opts.warnings)
        case Verb.PATCH:
            assert target.name is not None
            opts = _write_options(request)
            patched = hub.api.patch(
                rt,
                namespace,
                target.name,
                request.headers.get("content-type", ""),
                await request.body(),
                target.subresource,
                opts,
            )
            return json_response(patched, 200, opts.warnings)
        case Verb.DELETE:
            assert target.name is not None
            result = hub.api.delete(rt, namespace, target.name, await _delete_options(request))
            if not result.deleted:
                return json_response(result.obj)
            meta = result.obj["metadata"]
            details = {"name": meta["name"], "kind": rt.plural, "uid": meta["uid"]}
            if rt.group:
                details["group"] = rt.group
            return json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                }
            )
        case Verb.DELETECOLLECTION:
            listed = _list(hub, target, request)
            options = await _delete_options(request)
            deleted = []
            for obj in listed["items"]:
                meta = obj["metadata"]
                try:
                    deleted.append(hub.api.delete(rt, meta.get("namespace", ""), meta["name"], options).obj)
                except ApiError as exc:
                    if exc.code != 404:
                        raise
            return json_response({**listed, "items": deleted})
    raise errors.method_not_allowed(request.method.lower(), rt.plural, rt.group)  # pragma: no cover


async def _scale(hub: Hub, target: Target, request: Request, verb: Verb) -> Response:
    assert target.name is not None
    namespace = target.namespace or ""
    match verb:
        case Verb.GET:
            return json_response(hub.api.get_scale(target.rt, namespace, target.name))
        case Verb.UPDATE:
            opts = _write_options(request)
            body = parse_body(await request.body(), request.headers.get("content-type", JSON))
            return json_response(
                hub.api.update_scale(target.rt, namespace, target.name, body, opts), 200, opts.warnings
            )
        case Verb.PATCH:
            opts = _write_options(request)
            scaled = hub.api.patch(
                target.rt,
                namespace,
                target.name,
                request.headers.get("content-type", ""),
                await request.body(),
                Subresource.SCALE,
                opts,
            )
            return json_response(scaled, 200, opts.warnings)
    raise errors.method_not_allowed(verb, target.rt.plural, target.rt.group)


def _list(hub: Hub, target: Target, request: Request) -> dict[str, Any]:
    query = request.query_params
    labels = parse_label_selector(query.get("labelSelector"))
    fields = parse_field_selector(query.get("fieldSelector"), target.rt.field_selector_paths())
    limit_raw = query.get("limit")
    try:
        limit = int(limit_raw) if limit_raw else None
    except ValueError as exc:
        raise errors.bad_request(f"invalid limit: {limit_raw}") from exc
    return hub.api.list_objects(target.rt, target.namespace, labels, fields, limit, query.get("continue"))


async def _delete_options(request: Request) -> DeleteOptions:
    query = request.query_params
    raw = await request.body()
    body: dict[str, Any] = {}
    if raw.strip():
        parsed = parse_body(raw, request.headers.get("content-type", JSON))
        if isinstance(parsed, dict):
            body = parsed
    policy = body.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
    if body.get("orphanDependents") is True or query.get("orphanDependents") == "true":
        policy = "Orphan"
    try:
        propagation = Propagation(policy)
    except ValueError as exc:
        raise errors.bad_request(f"unsupported propagationPolicy {policy!r}") from exc
    preconditions = body.get("preconditions") or {}
    return DeleteOptions(
        propagation=propagation,
        precondition_uid=preconditions.get("uid"),
        precondition_rv=preconditions.get("resourceVersion"),
        dry_run=bool(body.get("dryRun") or query.get("dryRun")),
    )


def _watch(hub: Hub, target: Target, request: Request, user: str) -> Response:
    query = request.query_params
    rt = target.rt
    labels = parse_label_selector(query.get("labelSelector"))
    fields = parse_field_selector(query.get("fieldSelector"), rt.field_selector_paths())
    if target.name is not None:  # legacy watch of one object by its path
        fields = FieldSelector((*fields.terms, FieldTerm("metadata.name", target.name, negate=False)))
    raw_rv = query.get("resourceVersion") or ""
    send_initial = _flag(query.get("sendInitialEvents"))
    try:
        since = None if raw_rv in ("", "0") or send_initial else int(raw_rv)
    except ValueError as exc:
        raise errors.bad_request(f"invalid resource version: {raw_rv}") from exc
    try:
        timeout = float(query.get("timeoutSeconds") or hub.config.watch_timeout_seconds)
    except ValueError as exc:
        raise errors.bad_request("invalid timeoutSeconds") from exc
    bookmarks = _flag(query.get("allowWatchBookmarks"))
    renderer = None
    if table.wants_table(request.headers.get("accept", "")):
        include = query.get("includeObject", "Metadata")

        def renderer(event_type: EventType, obj: dict[str, Any]) -> bytes:
            meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
            return encode_event(event_type, table.table(rt, [obj], meta, include))

        bookmarks = False

    try:
        watcher = hub.store.watch(rt, target.namespace, labels, fields, since, renderer)
    except ApiError as exc:
        # Like the apiserver: once the watch is accepted, an expired version is an ERROR event.
        return StreamingResponse(_single(encode_event(EventType.ERROR, exc.status())), media_type=JSON)
    if send_initial and bookmarks:
        watcher.backlog.append(_bookmark(rt, hub.store.rv, initial_end=True))
    return StreamingResponse(_stream(hub, watcher, timeout, bookmarks, user), media_type=JSON)


async def _single(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return encode_event(EventType.BOOKMARK, {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta})


async def _stream(
    hub: Hub, watcher: Watcher, duration: float, bookmarks: bool, user: str
) -> AsyncGenerator[bytes, None]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration
    sent = 0
    try:
        if hub.closing:
            return
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            wait = min(remaining, hub.config.bookmark_interval_seconds) if bookmarks else remaining
            try:
                data = await watcher.next(wait)
            except TimeoutError:
                if bookmarks and loop.time() < deadline:
                    yield _bookmark(watcher.rt, hub.store.rv)
                continue
            if data is None:
                return
            # Everything already queued goes out in one write, as the apiserver's watch does: one
            # event per write would let a busy server fall further behind with every burst.
            chunk = [data]
            while True:
                sent += 1
                hub.stats.record_watch_event(user, watcher.last_delay)
                if hub.faults.cut_watch(user, watcher.rt, sent):
                    yield b"".join(chunk)
                    return
                more = watcher.next_buffered() if len(chunk) < WATCH_WRITE_MAX_EVENTS else None
                if more is None:
                    break
                chunk.append(more)
            yield b"".join(chunk)
    finally:
        hub.store.unwatch(watcher)
