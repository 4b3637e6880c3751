"""The one wrapper of the hub's Kubernetes API used by every hub activity.

Built once at worker start from a kubeconfig with the official `kubernetes` client. That client is
blocking, so each request runs on a bounded thread pool (the event loop never blocks; the pool size
caps concurrent hub requests per process). Requests go through the client's `ApiClient` with paths
built here rather than through the generated typed APIs: one code path for core and custom kinds,
explicit patch content types, and dict objects that validate against the CRD schemas as they are.

Waiting activities observe the hub through `Informer`s: one watch stream per kind for the whole
process (list, then watch from the list's resourceVersion; resume from the last resourceVersion
after a clean close; re-list after 410 Gone or a broken stream), a local cache, and waiters woken on
change. Hub calls per waiting activity therefore do not grow with how long a host takes to boot.
A waiter names the index keys it cares about (an object's name, or keys such as an Agent's MACs
from `Informer.add_index`), so a change wakes the few waiters it concerns rather than every waiter of
the namespace, and it reads the matching objects from the index rather than scanning them all.

Errors are mapped once, here, to `HubApiError` (a Temporal `ApplicationError`) whose `type` is a
`HubErrorType`: 400, 422 (naming the invalid fields), 401/403 (retryable in the activities that hold
a host) and an object's own 404 (a Status naming it: the only "gone") non-retryable; 409, 5xx, any
other 404 (a path the hub does not serve, a proxy's page) and transport failures retryable. Messages
never carry request or response bodies, nor a Status's free text: its reason only when it is a
StatusReason, its causes only as field paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION, KubeConfigLoader, KubeConfigMerger
from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.file_stamp import FileStamp, file_stamp
from contracts.hub import HubErrorType

log = logging.getLogger(__name__)
# One span per hub request (no-op unless the process set up tracing); see `HubKube._request`.
_tracer = trace.get_tracer("osac.hub")

T = TypeVar("T")
JSON = "application/json"
# client-go's metadata client asks the same, with whole objects as the fallback for an older server.
METADATA_LIST_KIND = "PartialObjectMetadataList"
METADATA_LIST_ACCEPT = f"{JSON};as={METADATA_LIST_KIND};g=meta.k8s.io;v=v1,{JSON}"
# Objects behind the cache read one by one before a whole list is cheaper (at most a quarter).
MAX_READS_BEHIND_CACHE = 8
KubeObject = dict[str, Any]
Transform = Callable[[KubeObject], KubeObject]
Indexer = Callable[[KubeObject], Iterable[str]]


# ---------------------------------------------------------------------------------------------
# Kinds


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{root}/{self.plural}"

    def object_path(self, namespace: str | None, name: str, subresource: str | None = None) -> str:
        path = f"{self.collection_path(namespace)}/{quote(name, safe='')}"
        return f"{path}/{subresource}" if subresource else path


SECRETS = Resource("", "v1", "secrets", "Secret")
EVENTS = Resource("", "v1", "events", "Event")
CLUSTER_ORDERS = Resource("osac.openshift.io", "v1alpha1", "clusterorders", "ClusterOrder")
INFRA_ENVS = Resource("agent-install.openshift.io", "v1beta1", "infraenvs", "InfraEnv")
AGENTS = Resource("agent-install.openshift.io", "v1beta1", "agents", "Agent")
NODE_POOLS = Resource("hypershift.openshift.io", "v1beta1", "nodepools", "NodePool")
MACHINES = Resource("cluster.x-k8s.io", "v1beta1", "machines", "Machine")
AGENT_MACHINES = Resource(
    "capi-provider.agent-install.openshift.io", "v1beta1", "agentmachines", "AgentMachine"
)


class PatchType(StrEnum):
    MERGE = "application/merge-patch+json"
    JSON = "application/json-patch+json"


# ---------------------------------------------------------------------------------------------
# Cache transforms: what the process keeps in memory for its waiters


LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


def _strip_order_secrets(obj: KubeObject) -> KubeObject:
    """A cached ClusterOrder never holds the pull secret (waiters need only metadata and status),
    nor the copy of it that `kubectl apply` keeps in an annotation."""
    spec = obj.get("spec")
    if isinstance(spec, dict) and "pullSecret" in spec:
        obj = {**obj, "spec": {k: v for k, v in spec.items() if k != "pullSecret"}}
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if (
        isinstance(metadata, dict)
        and isinstance(annotations, dict)
        and LAST_APPLIED_ANNOTATION in annotations
    ):
        kept = {k: v for k, v in annotations.items() if k != LAST_APPLIED_ANNOTATION}
        obj = {**obj, "metadata": {**metadata, "annotations": kept}}
    return obj


REDACTED = "<redacted>"


def _redact_infraenv_urls(obj: KubeObject) -> KubeObject:
    """Boot artifact URLs carry a token: the cache keeps only whether each one is set."""
    status = obj.get("status")
    if not isinstance(status, dict):
        return obj
    status = dict(status)
    artifacts = status.get("bootArtifacts")
    if isinstance(artifacts, dict):
        status["bootArtifacts"] = {k: (REDACTED if v else v) for k, v in artifacts.items()}
    for key in ("isoDownloadURL",):
        if status.get(key):
            status[key] = REDACTED
    debug = status.get("debugInfo")
    if isinstance(debug, dict):
        status["debugInfo"] = {k: (REDACTED if v else v) for k, v in debug.items()}
    return {**obj, "status": status}


DEFAULT_TRANSFORMS: dict[Resource, Transform] = {
    CLUSTER_ORDERS: _strip_order_secrets,
    INFRA_ENVS: _redact_infraenv_urls,
}


# ---------------------------------------------------------------------------------------------
# Errors


class HubApiError(ApplicationError):
    """A failed hub call, typed for Temporal. Details are one dict of non-secret facts."""

    def __init__(
        self,
        message: str,
        *,
        type: HubErrorType,
        non_retryable: bool,
        code: int | None = None,
        reason: str | None = None,
        kind: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        fields: tuple[str, ...] = (),
    ) -> None:
        facts: dict[str, Any] = {
            "code": code,
            "reason": reason,
            "kind": kind,
            "namespace": namespace,
            "name": name,
            "fields": list(fields),
        }
        super().__init__(message, facts, type=type, non_retryable=non_retryable)
        self.code = code
        self.reason = reason
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.fields = fields


class HubNotFound(HubApiError):
    """404 naming the object (see `_own_not_found`): it does not exist."""


class HubConflict(HubApiError):
    """409 Conflict: a stale resourceVersion. Retry after re-reading."""


def conflict_backoff(attempt: int) -> float:
    """Jittered, growing to 1 s: a busy object still leaves a window between other writers."""
    return min(1.0, 0.02 * 2**attempt) * (0.5 + random.random())


class HubAlreadyExists(HubApiError):
    pass


class HubInvalid(HubApiError):
    """422 Invalid / 400 BadRequest: the request will never succeed as it is."""


class HubAuthError(HubApiError):
    """401 / 403."""


class HubGone(HubApiError):
    """410 Gone: a resourceVersion too old to watch from."""


class HubUnavailable(HubApiError):
    """5xx, 429, a 404 that names no object, timeouts, refused or broken connections."""


class StatusReason(StrEnum):
    """metav1.StatusReason: the reasons an error is allowed to carry. The apiserver writes only these,
    but an admission webhook may put any text in a Status, tenant data included."""

    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    ALREADY_EXISTS = "AlreadyExists"
    CONFLICT = "Conflict"
    GONE = "Gone"
    INVALID = "Invalid"
    SERVER_TIMEOUT = "ServerTimeout"
    STORAGE_READ_ERROR = "StorageReadError"
    TIMEOUT = "Timeout"
    TOO_MANY_REQUESTS = "TooManyRequests"
    BAD_REQUEST = "BadRequest"
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    NOT_ACCEPTABLE = "NotAcceptable"
    REQUEST_ENTITY_TOO_LARGE = "RequestEntityTooLarge"
    UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"
    INTERNAL_ERROR = "InternalError"
    EXPIRED = "Expired"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"


# A field path of a 422's causes (`spec.nodeRequests[0].bareMetal`, `data[.dockerconfigjson]`):
# anything else (spaces, quotes, braces: a message, a value) is dropped.
_FIELD_PATH = re.compile(r"[A-Za-z0-9_$.\[\]/:-]{1,200}")


def _reason(status: dict[str, Any], code: int) -> str:
    """The Status's reason if it is a StatusReason, else the standard phrase of the HTTP code: never
    the server's own text."""
    reason = status.get("reason")
    if isinstance(reason, str) and reason in set(StatusReason):
        return reason
    with contextlib.suppress(ValueError):
        return HTTPStatus(code).phrase
    return ""


def _field_paths(causes: Any) -> tuple[str, ...]:
    if not isinstance(causes, list):
        return ()
    paths = {c.get("field") for c in causes if isinstance(c, dict)}
    return tuple(sorted(p for p in paths if isinstance(p, str) and _FIELD_PATH.fullmatch(p)))


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (ValueError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def _own_not_found(
    status: dict[str, Any], verb: str, resource: Resource, namespace: str | None, name: str | None
) -> bool:
    """Whether a 404 is the NotFound of what the request named, the only 404 that says an object
    is gone: a `kind: Status` with reason NotFound whose details name the object (and its kind and
    group, when they are given), as the apiserver answers. A create can only miss its namespace
    (`namespaces "x" not found`); a list or a watch names nothing that could be gone. Not the
    apiserver's "the server could not find the requested resource" (a path it does not serve, such
    as a CRD being installed again: its details name nothing), nor a 404 page from a proxy in front
    of the hub."""
    if status.get("kind") != "Status" or status.get("reason") != StatusReason.NOT_FOUND:
        return False
    details = status.get("details")
    if not isinstance(details, dict):
        return False
    if verb == "create":
        wanted, kinds, group = namespace, {"namespaces"}, ""
    else:
        wanted, kinds, group = name, {resource.plural, resource.kind.lower()}, resource.group
    if not wanted or details.get("name") != wanted:
        return False
    kind = details.get("kind")
    if kind is not None and str(kind).lower() not in kinds:
        return False
    return details.get("group") in (None, "", group)


def map_api_exception(
    exc: ApiException, verb: str, resource: Resource, namespace: str | None, name: str | None
) -> HubApiError:
    """Turn a client exception into a typed error. Never copies the body: it may echo secrets."""
    code = int(exc.status or 0)
    status = _status_body(exc)
    reason = _reason(status, code)
    details = status.get("details") if isinstance(status.get("details"), dict) else {}
    causes = details.get("causes") if isinstance(details, dict) else None
    fields = _field_paths(causes)
    where = f"{resource.kind} {namespace + '/' if namespace else ''}{name or ''}".strip()
    base = f"hub {verb} {where}: HTTP {code} {reason}".strip()
    kw: dict[str, Any] = {
        "code": code,
        "reason": reason,
        "kind": resource.kind,
        "namespace": namespace,
        "name": name,
        "fields": fields,
    }
    if code == 404 and _own_not_found(status, verb, resource, namespace, name):
        return HubNotFound(base, type=HubErrorType.NOT_FOUND, non_retryable=True, **kw)
    if code == 404:
        # Never taken for the object gone (a wait would report it deleted, a release its host
        # free): retried until the hub answers about the object itself.
        return HubUnavailable(
            f"{base} (not the object's own NotFound: retried)",
            type=HubErrorType.UNAVAILABLE,
            non_retryable=False,
            **kw,
        )
    if code == 409 and reason == StatusReason.ALREADY_EXISTS:
        # Retryable: the retry finds the object and adopts it.
        return HubAlreadyExists(base, type=HubErrorType.ALREADY_EXISTS, non_retryable=False, **kw)
    if code == 409:
        return HubConflict(base, type=HubErrorType.CONFLICT, non_retryable=False, **kw)
    if code == 422:
        suffix = f" (fields: {', '.join(fields)})" if fields else ""
        return HubInvalid(base + suffix, type=HubErrorType.INVALID, non_retryable=True, **kw)
    if code == 400:
        return HubInvalid(base, type=HubErrorType.BAD_REQUEST, non_retryable=True, **kw)
    if code == 401:
        return HubAuthError(base, type=HubErrorType.UNAUTHORIZED, non_retryable=True, **kw)
    if code == 403:
        return HubAuthError(base, type=HubErrorType.FORBIDDEN, non_retryable=True, **kw)
    if code == 410:
        return HubGone(base, type=HubErrorType.GONE, non_retryable=False, **kw)
    if code == 0:
        # The client reports transport trouble (e.g. TLS) with status 0.
        return HubUnavailable(
            f"hub {verb} {where}: transport error", type=HubErrorType.TRANSPORT, non_retryable=False, **kw
        )
    return HubUnavailable(base, type=HubErrorType.UNAVAILABLE, non_retryable=False, **kw)


In = TypeVar("In")
R = TypeVar("R")


def refusals_retried(run: Callable[[Any, In], Awaitable[R]]) -> Callable[[Any, In], Awaitable[R]]:
    """For the activities that run while a host is allocated to the attempt: a 401 (a token rotation
    the kubeconfig has not followed yet) or a 403 (a role a rollout forgot) is retried, visible on
    the pending activity, instead of failing the attempt, which deletes the BMI and wipes a healthy
    host for a refusal that says nothing about it. Elsewhere it stays final: the order's workflow,
    whose calls are retried without end, shows it as RequestRefused and asks again later, and a
    refused Event is dropped at once."""

    @functools.wraps(run)
    async def wrapper(self: Any, input: In) -> R:
        try:
            return await run(self, input)
        except HubAuthError as err:
            if not err.non_retryable:
                raise
            raise HubAuthError(
                f"{err.message} (retried: the host stays allocated meanwhile)",
                type=HubErrorType(str(err.type)),
                non_retryable=False,
                code=err.code,
                reason=err.reason,
                kind=err.kind,
                namespace=err.namespace,
                name=err.name,
                fields=err.fields,
            ) from None

    return wrapper


def _transport_error(
    exc: BaseException, verb: str, resource: Resource, namespace: str | None, name: str | None
) -> HubUnavailable:
    where = f"{resource.kind} {namespace + '/' if namespace else ''}{name or ''}".strip()
    return HubUnavailable(
        f"hub {verb} {where}: {type(exc).__name__}",
        type=HubErrorType.TRANSPORT,
        non_retryable=False,
        kind=resource.kind,
        namespace=namespace,
        name=name,
    )


# ---------------------------------------------------------------------------------------------
# The client


@dataclass
class ObjectList:
    items: list[KubeObject]
    resource_version: str | None


@dataclass
class HubStats:
    """What this process asked of the hub, for tests and metrics."""

    requests: Counter[str] = field(default_factory=Counter)  # by verb (get, list, watch, ...)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


_NOT_JSON = object()


def _answer_problem(verb: str, parsed: Any) -> str | None:
    """What is wrong with a 2xx answer's body for `verb`, or None: every answer but a delete's
    (whose body is not read) is an object with metadata, a list's with its items too."""
    if verb == "delete":
        return None
    if parsed is _NOT_JSON:
        return "response is not JSON"
    if not isinstance(parsed, dict):
        return "response is not a JSON object" if parsed is not None else "response is empty"
    if not isinstance(parsed.get("metadata"), dict):
        return "response has no metadata"
    if verb == "list" and not isinstance(parsed.get("items", False), list | None):
        return "list response has no items"
    return None


def _object_list(data: KubeObject) -> ObjectList:
    items = data.get("items") or []
    rv = (data.get("metadata") or {}).get("resourceVersion")
    return ObjectList(items=[i for i in items if isinstance(i, dict)], resource_version=rv)


def _token_file(config: Any, current_context: Mapping[str, Any]) -> str | None:
    """The file the kubeconfig's current user takes its token from, resolved as the client does
    (relative to the kubeconfig naming it); None when the token comes from elsewhere (an inline
    `token` wins over `tokenFile`, an auth provider over both)."""
    user_name = (current_context.get("context") or {}).get("user")
    users = config["users"] if config.safe_get("users") else None
    entry = users.get_with_name(user_name, safe=True) if users is not None and user_name else None
    if entry is None:
        return None
    user = entry.safe_get("user")
    if not isinstance(user, dict) or user.get("token") or "auth-provider" in user:
        return None
    token_file = user.get("tokenFile")
    if not isinstance(token_file, str) or not token_file:
        return None
    base = os.path.abspath(os.path.dirname(entry.path)) if entry.path else ""
    path = os.path.normpath(os.path.join(base, token_file))
    if "exec" in user:
        # An empty file leaves the token to the exec plugin (the client's order), whose expiring
        # token the client's own hook refreshes: that hook is kept.
        try:
            with open(path) as f:
                if not f.read().strip():
                    return None
        except OSError:
            return None
    return path


class _TokenFile:
    """A kubeconfig's `tokenFile` read again whenever it changes (a mounted secret rotated), as the
    in-cluster client re-reads its service account's token; the client alone reads it once. Called
    before every request (the client's `refresh_api_key_hook`): one stat, a read only on a change. A
    file that cannot be read keeps the last token, whose refusal then shows on the calls."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: FileStamp | None = None
        self._lock = threading.Lock()

    def __call__(self, configuration: k8s_client.Configuration) -> None:
        try:
            stamp = file_stamp(self.path)
        except OSError:
            return
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            try:
                with open(self.path) as f:
                    token = f.read().strip()
            except OSError:
                return
            if token:
                configuration.api_key["BearerToken"] = f"Bearer {token}"
                self._stamp = stamp


def _pooled(configuration: k8s_client.Configuration, max_workers: int) -> k8s_client.ApiClient:
    """The API client of either way in: room in the pool for every thread plus one watch stream per
    kind, and only connection set-up retried by urllib3 (its default would send a GET, PUT or DELETE
    again after a read error behind the caller's back; the activity's retry policy decides)."""
    configuration.connection_pool_maxsize = max_workers + 8
    configuration.retries = urllib3.Retry(
        total=3, connect=3, read=0, status=0, other=0, redirect=0, backoff_factor=0.1
    )
    return k8s_client.ApiClient(configuration)


class HubKube:
    """The hub's Kubernetes API for the activities: typed errors, a thread pool, shared informers."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        max_workers: int = 16,
        request_timeout: tuple[float, float] = (5.0, 30.0),
        watch_timeout_seconds: int = 300,
        relist_backoff: tuple[float, float] = (0.2, 10.0),
        transforms: Mapping[Resource, Transform] | None = None,
        cache_catch_up_seconds: float = 2.0,
    ) -> None:
        self._api = api_client
        self.cache_catch_up_seconds = cache_catch_up_seconds
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hub-kube")
        self._request_timeout = request_timeout
        self.watch_timeout_seconds = watch_timeout_seconds
        self.relist_backoff = relist_backoff
        self._transforms = dict(DEFAULT_TRANSFORMS if transforms is None else transforms)
        self._informers: dict[Resource, Informer] = {}
        self._stats_lock = threading.Lock()
        self.stats = HubStats()
        self._closed = False

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | None = None,
        *,
        context: str | None = None,
        max_workers: int = 16,
        **kwargs: Any,
    ) -> HubKube:
        """Load a kubeconfig (token, client certificates and CA as kubectl would use them), as
        `load_kube_config` does; a user's `tokenFile` is read again whenever it changes."""
        configuration = k8s_client.Configuration()
        merged = KubeConfigMerger(path or KUBE_CONFIG_DEFAULT_LOCATION)
        if merged.config is None:
            raise ConfigException("Invalid kube-config file. No configuration found.")
        # No base path: each file's relative paths are its own (as load_kube_config does).
        loader = KubeConfigLoader(config_dict=merged.config, config_base_path=None, active_context=context)
        loader.load_and_set(configuration)
        token_file = _token_file(merged.config, loader.current_context)
        if token_file is not None:
            hook: Any = _TokenFile(token_file)
            configuration.refresh_api_key_hook = hook
        return cls(_pooled(configuration, max_workers), max_workers=max_workers, **kwargs)

    @classmethod
    def in_cluster(cls, *, max_workers: int = 16, **kwargs: Any) -> HubKube:
        """The service account of a pod running on the hub itself."""
        configuration = k8s_client.Configuration()
        k8s_config.load_incluster_config(client_configuration=configuration)
        return cls(_pooled(configuration, max_workers), max_workers=max_workers, **kwargs)

    async def close(self) -> None:
        """Stop the informers, then the pool and the connections."""
        self._closed = True
        for informer in list(self._informers.values()):
            await informer.stop()
        self._informers.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self._api.close)

    # -- raw requests -----------------------------------------------------------------------

    def _count(self, verb: str) -> None:
        with self._stats_lock:
            self.stats.requests[verb] += 1

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: tuple[float, float] | float | None = None,
        accept: str = JSON,
    ) -> Any:
        """Send one request on the calling thread; return the client's RESTResponse (unread)."""
        headers: dict[str, str] = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type or JSON
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        method_, url, header_params, body_, post_params = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self._api.call_api(
            method_,
            url,
            header_params=header_params,
            body=body_,
            post_params=post_params,
            _request_timeout=timeout or self._request_timeout,
        )

    def _request_sync(
        self,
        verb: str,
        method: str,
        resource: Resource,
        namespace: str | None,
        name: str | None,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str | None,
        accept: str = JSON,
    ) -> KubeObject:
        self._count(verb)
        try:
            response = self._open(
                method, path, query=query, body=body, content_type=content_type, accept=accept
            )
            data = response.read()
        except ApiException as exc:
            raise map_api_exception(exc, verb, resource, namespace, name) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _transport_error(exc, verb, resource, namespace, name) from None
        if not 200 <= response.status <= 299:
            error = ApiException(status=response.status, reason=response.reason)
            error.body = data.decode("utf-8", "replace") if data else None
            raise map_api_exception(error, verb, resource, namespace, name) from None
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = _NOT_JSON
        problem = _answer_problem(verb, parsed)
        if problem is not None:
            # A proxy's empty 200 taken for an object, or for an empty list, would be judged as one:
            # a NodePool counted down to no Agents, an Agent deleted as unclaimed.
            raise HubUnavailable(
                f"hub {verb} {resource.kind}: {problem}",
                type=HubErrorType.PROTOCOL,
                non_retryable=False,
                kind=resource.kind,
                namespace=namespace,
                name=name,
            ) from None
        return parsed if isinstance(parsed, dict) else {}

    async def _request(
        self,
        verb: str,
        method: str,
        resource: Resource,
        namespace: str | None,
        name: str | None,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str = JSON,
    ) -> KubeObject:
        if self._closed:
            raise RuntimeError("HubKube is closed")
        loop = asyncio.get_running_loop()
        with _tracer.start_as_current_span(
            f"hub {verb} {resource.kind}",
            kind=trace.SpanKind.CLIENT,
            attributes=_span_attributes(verb, resource, namespace, name),
            record_exception=False,  # the span gets the error type and code, never a message or body
            set_status_on_exception=False,
        ) as span:
            try:
                return await loop.run_in_executor(
                    self._executor,
                    lambda: self._request_sync(
                        verb, method, resource, namespace, name, path, query, body, content_type, accept
                    ),
                )
            except HubApiError as err:
                span.set_attribute("error.type", str(err.type))
                if err.code:
                    span.set_attribute("http.response.status_code", err.code)
                span.set_status(trace.StatusCode.ERROR, str(err.type))
                raise

    # -- verbs ------------------------------------------------------------------------------

    async def get(self, resource: Resource, namespace: str | None, name: str) -> KubeObject:
        path = resource.object_path(namespace, name)
        return await self._request("get", "GET", resource, namespace, name, path)

    async def get_optional(self, resource: Resource, namespace: str | None, name: str) -> KubeObject | None:
        try:
            return await self.get(resource, namespace, name)
        except HubNotFound:
            return None

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        """A fresh list from the hub (not the informer cache)."""
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        path = resource.collection_path(namespace)
        return _object_list(await self._request("list", "GET", resource, namespace, None, path, query=query))

    async def list_metadata(
        self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None
    ) -> ObjectList:
        """The objects' metadata only (a PartialObjectMetadataList): enough to find one by uid or
        owner, for a fraction of a full list's bytes. A hub without such lists answers in full."""
        return _object_list(await self._list_metadata(resource, namespace, label_selector))

    async def _list_metadata(
        self, resource: Resource, namespace: str | None, label_selector: str | None
    ) -> dict[str, Any]:
        path = resource.collection_path(namespace)
        query = {"labelSelector": label_selector}
        return await self._request(
            "list", "GET", resource, namespace, None, path, query=query, accept=METADATA_LIST_ACCEPT
        )

    async def list_current(
        self, resource: Resource, namespace: str | None, *, label_selector: str | None = None
    ) -> ObjectList:
        """What `list` returns, for a fraction of the bytes: the hub lists only the objects'
        metadata, and each object comes from the shared informer's cache once it holds that version
        (or a newer one). The cache follows the same hub a moment behind, so it is waited for
        briefly (`cache_catch_up_seconds`); what it still lacks then is read one by one, or listed
        in full when that is much.

        A full list of Agents carries every host's inventory, and each worker lists its InfraEnv's
        Agents a few times: whole lists carried about 4 x the square of the order's workers in Agents.
        Falls back to `list` while the kind's informer is not synced (it is never started here), for
        kinds the informer transforms, and on a hub that answers with whole objects.
        The objects from the cache are shared with every waiter: read them, never modify them."""
        informer = self._informers.get(resource)
        if informer is None or not informer.synced or informer.transforms:
            return await self.list(resource, namespace, label_selector=label_selector)
        data = await self._list_metadata(resource, namespace, label_selector)
        if data.get("kind") != METADATA_LIST_KIND:
            return _object_list(data)  # a hub without metadata-only lists answered in full
        listed = _object_list(data)
        wanted: list[tuple[str, str, str | None]] = []  # namespace, name, version listed
        for item in listed.items:
            m = meta(item)
            wanted.append(
                (
                    str(m.get("namespace") or namespace or ""),
                    str(m.get("name") or ""),
                    _resource_version(item),
                )
            )

        def cached(entry: tuple[str, str, str | None]) -> KubeObject | None:
            obj = informer.get(entry[0], entry[1])
            return obj if obj is not None and _version_at_least(_resource_version(obj), entry[2]) else None

        def settled(entry: tuple[str, str, str | None]) -> bool:
            """In the cache at the listed version or newer, or gone from a cache that has seen
            everything up to the list (deleted since: as if listed a moment later)."""
            if cached(entry) is not None:
                return True
            return informer.get(entry[0], entry[1]) is None and _version_at_least(
                informer.resource_version, listed.resource_version
            )

        lagging = [entry for entry in wanted if not settled(entry)]
        if lagging and self.cache_catch_up_seconds > 0:
            keys = [informer.name_key(name) for _, name, _ in lagging] if namespace else None
            with contextlib.suppress(WaitTimedOut):
                await informer.wait(
                    lambda: True if all(settled(entry) for entry in lagging) else None,
                    namespace=namespace,
                    keys=keys,
                    deadline=datetime.now(UTC) + timedelta(seconds=self.cache_catch_up_seconds),
                    tick_seconds=self.cache_catch_up_seconds,
                )
            lagging = [entry for entry in lagging if not settled(entry)]
        if len(lagging) > max(MAX_READS_BEHIND_CACHE, len(wanted) // 4):
            return await self.list(resource, namespace, label_selector=label_selector)
        reads = await asyncio.gather(*(self.get_optional(resource, ns, name) for ns, name, _ in lagging))
        read = dict(zip(lagging, reads, strict=True))  # None: deleted since the list
        items = [read[entry] if entry in read else cached(entry) for entry in wanted]
        return ObjectList(
            items=[obj for obj in items if obj is not None], resource_version=listed.resource_version
        )

    async def create(self, resource: Resource, namespace: str | None, body: KubeObject) -> KubeObject:
        body = {"apiVersion": resource.api_version, "kind": resource.kind, **body}
        name = (body.get("metadata") or {}).get("name")
        path = resource.collection_path(namespace)
        return await self._request("create", "POST", resource, namespace, name, path, body=body)

    async def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
    ) -> KubeObject:
        """Merge patch by default. Put `metadata.resourceVersion` in a merge patch to make it a
        compare-and-swap (409 Conflict when the object changed since it was read)."""
        path = resource.object_path(namespace, name, subresource)
        verb = f"patch/{subresource}" if subresource else "patch"
        return await self._request(
            verb, "PATCH", resource, namespace, name, path, body=patch, content_type=patch_type.value
        )

    async def replace(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: KubeObject,
        *,
        subresource: str | None = None,
    ) -> KubeObject:
        path = resource.object_path(namespace, name, subresource)
        verb = f"update/{subresource}" if subresource else "update"
        return await self._request(verb, "PUT", resource, namespace, name, path, body=body)

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bool:
        """Delete; True if this call deleted (or started deleting) it, False if it was already gone.

        `uid` makes the delete conditional on the object still being that incarnation,
        `resource_version` on it being unchanged since it was read (HubConflict otherwise)."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": propagation,
        }
        preconditions = {"uid": uid, "resourceVersion": resource_version}
        if any(preconditions.values()):
            body["preconditions"] = {k: v for k, v in preconditions.items() if v}
        path = resource.object_path(namespace, name)
        try:
            await self._request("delete", "DELETE", resource, namespace, name, path, body=body)
        except HubNotFound:
            return False
        return True

    # -- informers --------------------------------------------------------------------------

    def informer(self, resource: Resource) -> Informer:
        """The process-wide shared informer of a kind (started by its first waiter)."""
        informer = self._informers.get(resource)
        if informer is None:
            informer = Informer(self, resource, self._transforms.get(resource))
            self._informers[resource] = informer
        return informer

    async def wait_object(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        evaluate: Callable[[KubeObject | None], T | None],
        *,
        deadline: datetime | None = None,
        on_tick: Callable[[KubeObject | None], None] | None = None,
        tick_seconds: float = 10.0,
        verdict_at_deadline: bool = True,
    ) -> T:
        """Wait until `evaluate(object)` (None: the object does not exist) is not None.

        Subscribes to the shared informer, then reads the object fresh, so the first answer is
        never a lagging cache's; afterwards only cache entries at least as new as what was already
        read are evaluated, and absence from the cache is confirmed by a fresh read once (then the
        informer reports the object's creation). Raises WaitTimedOut at the deadline if a fresh
        read then does not satisfy `evaluate` either (without `verdict_at_deadline`: at once, for a
        caller that only wakes up to look at something else and reads afresh itself)."""
        informer = self.informer(resource)
        await informer.start()
        floor: str | None = None
        known_absent = False
        # The object the hub had deleted at the last read, still in a cache that lags (or cannot
        # hear): never evaluated as if it existed.
        deleted_uid: Any = None
        read_at = 0.0
        cached_since_read = False
        absent = object()

        async def read() -> T | None:
            """Evaluate the object as the hub holds it now, and note what the cache must catch up to."""
            nonlocal floor, known_absent, deleted_uid, read_at, cached_since_read
            fresh = await self.get_optional(resource, namespace, name)
            if fresh is not None:
                fresh = informer.transform(fresh)
            read_at, cached_since_read = time.monotonic(), False
            floor = _resource_version(fresh) or floor
            known_absent = fresh is None
            deleted_uid = meta(informer.get(namespace, name) or {}).get("uid") if known_absent else None
            return evaluate(fresh)

        def check() -> Any:
            nonlocal cached_since_read
            obj = informer.get(namespace, name)
            if obj is None:
                if known_absent:
                    return None
                # Gone from a cache that had it: confirmed at once. Never seen by the cache since
                # the hub had it at the last read: the cache lags (its event on the way, or a watch
                # being made again), so read afresh once a tick, not in a loop that hammers the
                # hub, never heartbeats and never reaches the deadline.
                if cached_since_read or time.monotonic() - read_at >= tick_seconds:
                    return absent
                return None
            if deleted_uid is not None and meta(obj).get("uid") == deleted_uid:
                return None
            cached_since_read = True
            if _older(obj, floor):
                return None  # the cache has not caught up with the fresh read yet
            return evaluate(obj)

        def tick() -> None:
            if on_tick is not None:
                on_tick(informer.get(namespace, name))

        while True:
            result = await read()
            if result is not None:
                return result
            try:
                outcome = await informer.wait(
                    check,
                    namespace=namespace,
                    keys=[informer.name_key(name)],
                    deadline=deadline,
                    on_tick=tick,
                    tick_seconds=tick_seconds,
                )
            except WaitTimedOut:
                if not verdict_at_deadline:
                    raise
                # The cache may be blind (a watch cut and not made again, a stream gone quiet) while
                # it still counts as synced: the deadline's verdict is the hub's own answer, and a
                # hub that cannot answer makes it a retryable error, never a false timeout.
                result = await read()
                if result is not None:
                    return result
                raise
            if outcome is not absent:
                return outcome

    # Used by Informer: the streaming request runs on the informer's own thread.
    def _open_watch(self, resource: Resource, resource_version: str | None) -> Any:
        self._count("watch")
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": self.watch_timeout_seconds,
        }
        read_timeout = self.watch_timeout_seconds + 30.0
        try:
            response = self._open(
                "GET",
                resource.collection_path(None),
                query=query,
                timeout=(self._request_timeout[0], read_timeout),
            )
        except ApiException as exc:
            raise map_api_exception(exc, "watch", resource, None, None) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _transport_error(exc, "watch", resource, None, None) from None
        if not 200 <= response.status <= 299:
            data = response.read()
            error = ApiException(status=response.status, reason=response.reason)
            error.body = data.decode("utf-8", "replace") if data else None
            raise map_api_exception(error, "watch", resource, None, None) from None
        return response.response  # the urllib3 response, streamed line by line


def _span_attributes(
    verb: str, resource: Resource, namespace: str | None, name: str | None
) -> dict[str, str]:
    """What a hub span says: verb, kind and object, plus the order and worker slot of the calling
    activity (from its workflow id: cluster-workers/<ns>/<order> or worker/<ns>/<order>/<slot>)."""
    attributes = {"osac.hub.verb": verb, "osac.hub.resource": resource.plural}
    if namespace:
        attributes["osac.hub.namespace"] = namespace
    if name:
        attributes["osac.hub.name"] = name
    if activity.in_activity():
        parts = (activity.info().workflow_id or "").split("/")
        if len(parts) >= 3:
            attributes["osac.order"] = f"{parts[1]}/{parts[2]}"
        if len(parts) == 4 and parts[0] == "worker":
            attributes["osac.slot"] = parts[3]
    return attributes


# ---------------------------------------------------------------------------------------------
# Shared informers


class WaitTimedOut(Exception):
    """An informer wait reached its deadline."""


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): re-list."""


@dataclass(eq=False)
class _Waiter:
    namespace: str | None
    keys: frozenset[str] | None  # None: woken by every change in its namespace
    event: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    expired: int = 0
    disconnects: int = 0


def _iter_lines(response: Any) -> Iterator[bytes]:
    """Split a streamed watch body into lines (one JSON event per line)."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=True):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _shut_down(response: Any) -> None:
    """End a blocked read of a watch stream at once (urllib3's `shutdown`)."""
    with contextlib.suppress(Exception):
        response.shutdown()


def _release(response: Any) -> None:
    with contextlib.suppress(Exception):
        response.release_conn()


class _EventFeed:
    """Carries a watch stream's events from the thread that reads (and decodes) them to the loop.

    The thread reads on by itself, and the loop takes every event read since it last looked in one
    go. With a round trip per line, a loop busy with hundreds of activities applied about one event
    per turn, and the cache fell further behind with every burst of changes (bench/README.md, round 9).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int = 10_000) -> None:
        self._loop = loop
        self._max_pending = max_pending
        self._lock = threading.Condition()
        self._events: list[dict[str, Any]] = []
        self._woken = False  # a wake-up is on its way to the loop
        self._ended = False
        self._error: BaseException | None = None
        self._stopped = False
        self._ready = asyncio.Event()

    def pump(self, events: Iterator[dict[str, Any]]) -> None:
        """On the stream thread: read until the stream ends, fails or `stop` is called."""
        error: BaseException | None = None
        try:
            for event in events:
                with self._lock:
                    # Bounded: a loop this far behind gets the hub's overflow close, not our memory.
                    while len(self._events) >= self._max_pending and not self._stopped:
                        self._lock.wait(1.0)
                    if self._stopped:
                        return
                    self._events.append(event)
                    wake = self._wake_due()
                if wake:
                    self._wake()
        except Exception as exc:
            error = exc
        with self._lock:
            self._ended, self._error = True, error
            wake = self._wake_due()
        if wake:
            self._wake()

    def _wake_due(self) -> bool:
        """Under the lock: whether the loop needs a wake-up (none is on its way yet)."""
        due = not self._woken and not self._stopped
        self._woken = True
        return due

    def _wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self._loop.call_soon_threadsafe(self._ready.set)

    async def take(self) -> list[dict[str, Any]]:
        """Every event read since the last take, waiting for one; [] once the stream ended cleanly,
        and the stream's error if it broke."""
        while True:
            with self._lock:
                events, self._events = self._events, []
                ended, error = self._ended, self._error
                self._woken = False
                self._ready.clear()
                self._lock.notify_all()
            if events:
                return events
            if ended:
                if error is not None:
                    raise error
                return []
            await self._ready.wait()

    def stop(self) -> bool:
        """Stop taking events; whether the stream had ended by itself."""
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
            return self._ended


class Informer:
    """One watch of one kind across all namespaces, a local cache, and waiters woken on change.

    Lifecycle: started lazily on the event loop of its first waiter, stopped by `HubKube.close()`.
    The blocking stream is read on a thread of its own, so a slow hub never takes a request thread.
    """

    def __init__(self, kube: HubKube, resource: Resource, transform: Transform | None) -> None:
        self._kube = kube
        self.resource = resource
        self._transform = transform
        self._objects: dict[tuple[str, str], KubeObject] = {}
        self._by_namespace: dict[str, dict[str, KubeObject]] = {}
        self._indexers: list[Indexer] = []
        self._keys: dict[tuple[str, str], frozenset[str]] = {}  # each object's index keys
        self._index: dict[tuple[str, str], set[str]] = {}  # (namespace, key) -> object names
        self._resource_version: str | None = None
        self._waiters: set[_Waiter] = set()
        self._broad_waiters: set[_Waiter] = set()  # the ones without keys; the others by key:
        self._keyed_waiters: dict[tuple[str, str], set[_Waiter]] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._synced: asyncio.Event | None = None
        self._stream_thread: ThreadPoolExecutor | None = None
        self._response: Any = None
        self._delivered = 0  # events of the current watch stream
        self.connected = False
        self.stats = InformerStats()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop and self._task is not None:
            raise RuntimeError("an informer serves one event loop")
        self._loop = loop
        if self._synced is None:
            self._synced = asyncio.Event()
        if self._stream_thread is None:
            self._stream_thread = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"hub-watch-{self.resource.plural}"
            )
        # A fresh context: the shared watch must not inherit the activity (and trace span) that
        # happened to start it.
        self._task = loop.create_task(
            self._run(), name=f"informer-{self.resource.plural}", context=contextvars.Context()
        )

    async def stop(self) -> None:
        task, self._task = self._task, None
        self._shutdown_stream()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.connected = False
        # The cache and resourceVersion are kept: a later start() resumes (or re-lists on 410).
        if self._stream_thread is not None:
            self._stream_thread.shutdown(wait=False, cancel_futures=True)
            self._stream_thread = None

    def _shutdown_stream(self) -> None:
        """Unblock the stream thread."""
        response = self._response
        if response is None:
            return
        _shut_down(response)
        _release(response)

    @property
    def synced(self) -> bool:
        return self._synced is not None and self._synced.is_set()

    @property
    def observed_via(self) -> str:
        """How fresh the cache is: "watch" (stream up) or "relisting" (stream down, retrying)."""
        return "watch" if self.connected else "relisting"

    # -- reading the cache ------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> KubeObject | None:
        return self._objects.get((namespace, name))

    def items(self, namespace: str | None = None) -> list[KubeObject]:
        if namespace is None:
            return list(self._objects.values())
        return list(self._by_namespace.get(namespace, {}).values())

    def indexed(self, namespace: str, keys: Iterable[str]) -> list[KubeObject]:
        """The objects of `namespace` with any of `keys` (see `add_index`, `name_key`), by name."""
        names: set[str] = set()
        for key in keys:
            names.update(self._index.get((namespace, key), ()))
        objects = self._by_namespace.get(namespace, {})
        return [objects[name] for name in sorted(names)]

    @staticmethod
    def name_key(name: str) -> str:
        """Every object's own index key."""
        return f"name={name}"

    def add_index(self, indexer: Indexer) -> None:
        """Index objects also by `indexer(object)` (computed once per version of an object).
        Adding the same function again does nothing."""
        if indexer in self._indexers:
            return
        self._indexers.append(indexer)
        for key, obj in list(self._objects.items()):
            self._store(key, obj)

    @property
    def resource_version(self) -> str | None:
        """The version the cache is at: of the last list, event or bookmark it took in."""
        return self._resource_version

    @property
    def transforms(self) -> bool:
        """Whether the cache keeps less (or other) than the hub serves."""
        return self._transform is not None

    def transform(self, obj: KubeObject) -> KubeObject:
        """What the cache would keep of `obj` (e.g. a fresh read, before waiters look at it)."""
        return self._transform(obj) if self._transform else obj

    # -- waiting ----------------------------------------------------------------------------

    async def wait(
        self,
        check: Callable[[], T | None],
        *,
        namespace: str | None = None,
        keys: Iterable[str] | None = None,
        deadline: datetime | None = None,
        on_tick: Callable[[], None] | None = None,
        tick_seconds: float = 10.0,
    ) -> T:
        """Return `check()` once it is not None, evaluated on the cache after every change in
        `namespace` (all namespaces if None) to an object that had or has one of `keys` (any
        object if None; keys need a namespace), after a re-list, and at least every `tick_seconds`
        (when `on_tick` runs too, e.g. to heartbeat). Raises WaitTimedOut once `deadline` passed
        (the check runs at least once even if the deadline is already past). Cancellation
        propagates."""
        if keys is not None and namespace is None:
            raise ValueError("an informer wait on index keys needs a namespace")
        await self.start()
        waiter = _Waiter(namespace, frozenset(keys) if keys is not None else None)
        self._waiters.add(waiter)
        if waiter.keys is None:
            self._broad_waiters.add(waiter)
        for key in waiter.keys or ():
            self._keyed_waiters.setdefault((namespace or "", key), set()).add(waiter)
        try:
            while True:
                waiter.event.clear()  # before checking, so a change during the check is not lost
                if self.synced:
                    result = check()
                    if result is not None:
                        return result
                if on_tick is not None:
                    on_tick()
                timeout = tick_seconds
                if deadline is not None:
                    remaining = (deadline - datetime.now(UTC)).total_seconds()
                    if remaining <= 0:
                        if not self.synced:
                            # Unknowable while the hub cannot be listed: retry rather than
                            # report a timeout that may be false.
                            raise HubUnavailable(
                                f"hub {self.resource.plural} not observable past the deadline",
                                type=HubErrorType.UNAVAILABLE,
                                non_retryable=False,
                                kind=self.resource.kind,
                            )
                        raise WaitTimedOut()
                    timeout = max(0.01, min(timeout, remaining))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), timeout)
        finally:
            self._waiters.discard(waiter)
            self._broad_waiters.discard(waiter)
            for key in waiter.keys or ():
                keyed = self._keyed_waiters.get((namespace or "", key))
                if keyed is not None:
                    keyed.discard(waiter)
                    if not keyed:
                        del self._keyed_waiters[(namespace or "", key)]

    def _notify(self, namespace: str | None, changed: frozenset[str] | None = None) -> None:
        """Wake the waiters a change concerns: in `namespace` (None: all) with one of the `changed`
        keys (None: any), and every waiter that named no keys."""
        for waiter in self._broad_waiters if changed is not None else self._waiters:
            if namespace is None or waiter.namespace is None or waiter.namespace == namespace:
                waiter.event.set()
        if changed is None or namespace is None:
            return
        for key in changed:
            for waiter in self._keyed_waiters.get((namespace, key), ()):
                waiter.event.set()

    def _store(self, key: tuple[str, str], obj: KubeObject | None) -> frozenset[str]:
        """Put (None: remove) an object into the cache and its indexes; its keys before and after."""
        namespace, name = key
        before = self._keys.pop(key, frozenset())
        for index_key in before:
            names = self._index.get((namespace, index_key))
            if names is not None:
                names.discard(name)
                if not names:
                    del self._index[(namespace, index_key)]
        if obj is None:
            self._objects.pop(key, None)
            in_namespace = self._by_namespace.get(namespace)
            if in_namespace is not None:
                in_namespace.pop(name, None)
                if not in_namespace:
                    del self._by_namespace[namespace]
            return before
        self._objects[key] = obj
        self._by_namespace.setdefault(namespace, {})[name] = obj
        after = {self.name_key(name)}
        for indexer in self._indexers:
            after.update(indexer(obj))
        self._keys[key] = frozenset(after)
        for index_key in after:
            self._index.setdefault((namespace, index_key), set()).add(name)
        return before | self._keys[key]

    # -- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        floor, cap = self._kube.relist_backoff
        delay = floor
        need_list = self._resource_version is None  # a restarted informer first tries to resume
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                opened = loop.time()
                delivered = await self._watch_once(loop)
                # A clean close (server timeout): resume from the last resourceVersion. Only a
                # server that closes at once with nothing to say is backed off rather than spun on;
                # a stream that delivered events is resumed at once so the cache never falls behind.
                if delivered == 0 and loop.time() - opened < 1.0:
                    await asyncio.sleep(delay)
                    delay = min(cap, delay * 2)
                else:
                    delay = floor
            except asyncio.CancelledError:
                raise
            except (_Expired, HubGone):  # 410 as a watch ERROR event or as the HTTP status
                self.stats.expired += 1
                need_list = True
                self.connected = False
            except Exception as exc:
                self.connected = False
                self.stats.disconnects += 1
                if self._delivered and not need_list:
                    # Cut mid-stream after events: the last resourceVersion is good, resume from it.
                    # Never after a failed list (need_list): `_delivered` counts the stream before
                    # it, and a hub refusing lists would be asked again at once, without end.
                    delay = floor
                    continue
                # Broken before anything arrived, or a failed list: re-list after a backoff.
                need_list = True
                log.info(
                    "hub watch of %s interrupted (%s); re-listing", self.resource.plural, type(exc).__name__
                )
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(cap, delay * 2)

    async def _relist(self) -> None:
        self._delivered = 0  # the events counted were the previous stream's
        listing = await self._kube.list(self.resource)
        self.stats.lists += 1
        self._objects, self._by_namespace, self._keys, self._index = {}, {}, {}, {}
        for obj in listing.items:
            key = self._key(obj)
            if key is not None:
                self._store(key, self._transform(obj) if self._transform else obj)
        self._resource_version = listing.resource_version
        assert self._synced is not None
        self._synced.set()
        self._notify(None)

    async def _watch_once(self, loop: asyncio.AbstractEventLoop) -> int:
        """Follow one watch stream until it closes; the number of events it delivered."""
        kube, resource, rv = self._kube, self.resource, self._resource_version
        self._delivered = 0
        stream_thread = self._stream_thread
        assert stream_thread is not None
        response = await loop.run_in_executor(stream_thread, kube._open_watch, resource, rv)
        self._response = response
        self.stats.watches += 1
        self.connected = True
        feed = _EventFeed(loop)
        events = (json.loads(line) for line in _iter_lines(response))
        pumping = loop.run_in_executor(stream_thread, feed.pump, events)
        try:
            while batch := await feed.take():
                for event in batch:
                    self._apply(event)
                    self._delivered += 1
            return self._delivered
        finally:
            self._response = None
            if not feed.stop():
                # Still reading (we stopped early): unblock it; the connection goes back once it ends.
                _shut_down(response)
            pumping.add_done_callback(lambda _: _release(response))

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            if code == 410:
                raise _Expired()
            raise RuntimeError(f"watch error {code}")
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if rv:
            self._resource_version = rv
        if kind == "BOOKMARK":
            return
        key = self._key(obj)
        if key is None:
            return
        self.stats.events += 1
        if kind == "DELETED":
            changed = self._store(key, None)
        elif kind in ("ADDED", "MODIFIED"):
            changed = self._store(key, self._transform(obj) if self._transform else obj)
        else:
            return
        self._notify(key[0], changed)

    @staticmethod
    def _key(obj: KubeObject) -> tuple[str, str] | None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return None
        return (str(meta.get("namespace") or ""), str(name))


# ---------------------------------------------------------------------------------------------
# Small helpers shared by the activity modules


def _resource_version(obj: KubeObject | None) -> str | None:
    value = meta(obj).get("resourceVersion") if obj is not None else None
    return str(value) if value else None


def _compare_versions(a: str | None, b: str | None) -> int | None:
    """-1, 0 or 1 as resourceVersion `a` is older than, equal to or newer than `b`; None when that
    cannot be told. Integers compare as kube-apiserver guarantees since 1.35 (KEP-5504, within one
    resource) and the twin issues; other strings only as equal."""
    if not a or not b:
        return None
    if a == b:
        return 0
    if a.isdigit() and b.isdigit():
        return -1 if int(a) < int(b) else 1
    return None


def _older(obj: KubeObject, floor: str | None) -> bool:
    """Whether a cached object predates a version already read (not when that cannot be told)."""
    return _compare_versions(_resource_version(obj), floor) == -1


def _version_at_least(held: str | None, version: str | None) -> bool:
    """Whether `held` is `version` or newer (not when that cannot be told)."""
    return _compare_versions(held, version) in (0, 1)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, dict) else {}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    value = meta(obj).get("labels")
    return value if isinstance(value, dict) else {}


def condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for cond in conditions or []:
        if isinstance(cond, dict) and cond.get("type") == type_:
            return cond
    return None


def condition_true(obj: Mapping[str, Any], type_: str) -> bool:
    cond = condition(obj, type_)
    return cond is not None and cond.get("status") == "True"


def dig(obj: Mapping[str, Any], *path: str) -> Any:
    current: Any = obj
    for key in path:
        if not isinstance(current, dict):
            return None
        current = current.get(key)
    return current
