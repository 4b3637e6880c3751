"""List-and-watch caches of hub objects, one per kind, shared by every controller.

Semantics follow client-go's reflector: list, then watch from the list's resourceVersion; when a
watch ends normally resume from the last seen resourceVersion (bookmarks included); on 410 Gone or a
broken connection re-list and replay the difference as events, so no change is ever missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

import httpx

from lab.hub_controllers.kube import ApiError, KubeApi, Obj, WatchEventType, key_of
from lab.hub_controllers.resources import ApiResource

log = logging.getLogger(__name__)

Handler = Callable[[WatchEventType, Obj], None]


class Informer:
    def __init__(
        self,
        api: KubeApi,
        resource: ApiResource,
        *,
        watch_timeout_s: int = 240,
        min_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
    ) -> None:
        self.api = api
        self.resource = resource
        self.resource_version = ""
        self._cache: dict[str, Obj] = {}
        # namespace -> key -> object, kept in step with `_cache` (same insertion order per namespace),
        # so that `in_namespace` costs the namespace's objects, not every object of the kind.
        self._by_namespace: dict[str, dict[str, Obj]] = {}
        self._handlers: list[Handler] = []
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watch_timeout_s = watch_timeout_s
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self.relists = 0  # observable by tests: how often the cache was rebuilt

    # -- reading ---------------------------------------------------------------------------------
    def get(self, key: str) -> Obj | None:
        return self._cache.get(key)

    def items(self) -> list[Obj]:
        return list(self._cache.values())

    def in_namespace(self, namespace: str) -> list[Obj]:
        """The cached objects whose `metadata.namespace` is `namespace`, in cache order."""
        return list(self._by_namespace.get(namespace, {}).values())

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)
        for obj in self._cache.values():  # late subscribers see the current world
            self._dispatch(handler, WatchEventType.ADDED, obj)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer-{self.resource.plural}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = self._min_backoff_s
        need_list = True
        while True:
            try:
                if need_list:
                    items, rv = await self.api.list(self.resource)
                    self._replace(items, rv)
                    need_list = False
                    backoff = self._min_backoff_s
                async for event in self.api.watch(
                    self.resource, self.resource_version, self._watch_timeout_s
                ):
                    backoff = self._min_backoff_s
                    self._apply(event.type, event.object)
                # A normal end (server-side timeout): resume from the last resourceVersion.
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                need_list = True
                if exc.is_gone:
                    log.debug("%s watch expired (410); re-listing", self.resource.plural)
                    continue
                log.warning("%s list/watch failed: %s", self.resource.plural, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
            except (httpx.HTTPError, ValueError) as exc:
                need_list = True
                log.debug("%s watch disconnected (%r); re-listing", self.resource.plural, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)

    # -- cache maintenance -----------------------------------------------------------------------
    def _replace(self, items: Iterable[Obj], resource_version: str) -> None:
        self.relists += 1
        fresh = {key_of(o): o for o in items}
        gone = [k for k in self._cache if k not in fresh]
        for key in gone:
            removed = self._remove(key)
            if removed is not None:  # always: `gone` was read from the cache
                self._notify(WatchEventType.DELETED, removed)
        for key, obj in fresh.items():
            previous = self._cache.get(key)
            self._store(key, obj)
            if previous is None:
                self._notify(WatchEventType.ADDED, obj)
            elif _rv(previous) != _rv(obj):
                self._notify(WatchEventType.MODIFIED, obj)
        self.resource_version = resource_version
        self._synced.set()

    def _apply(self, kind: WatchEventType, obj: Obj) -> None:
        rv = _rv(obj)
        if rv:
            self.resource_version = rv
        if kind is WatchEventType.BOOKMARK:
            return
        key = key_of(obj)
        if kind is WatchEventType.DELETED:
            self._remove(key)
        else:
            self._store(key, obj)
        self._notify(kind, obj)

    def _store(self, key: str, obj: Obj) -> None:
        previous = self._cache.get(key)
        self._cache[key] = obj
        old_ns, new_ns = _namespace(previous), _namespace(obj)
        if previous is not None and old_ns != new_ns:
            # Only "" vs. no namespace can share a key; rebuild so the order stays the cache's.
            self._unindex(old_ns, key)
            if new_ns is not None:
                self._by_namespace[new_ns] = {k: o for k, o in self._cache.items() if _namespace(o) == new_ns}
        elif new_ns is not None:
            # An existing key keeps its place, a new one goes last: the order `_cache` has too.
            self._by_namespace.setdefault(new_ns, {})[key] = obj

    def _remove(self, key: str) -> Obj | None:
        obj = self._cache.pop(key, None)
        if obj is not None:
            self._unindex(_namespace(obj), key)
        return obj

    def _unindex(self, namespace: str | None, key: str) -> None:
        bucket = self._by_namespace.get(namespace) if namespace is not None else None
        if bucket is not None and namespace is not None:
            bucket.pop(key, None)
            if not bucket:
                del self._by_namespace[namespace]  # namespaces come and go (one per test, per order)

    def _notify(self, kind: WatchEventType, obj: Obj) -> None:
        for handler in self._handlers:
            self._dispatch(handler, kind, obj)

    @staticmethod
    def _dispatch(handler: Handler, kind: WatchEventType, obj: Obj) -> None:
        try:
            handler(kind, obj)
        except Exception:  # a broken handler must not stop the cache
            log.exception("informer handler failed")


def _namespace(obj: Obj | None) -> str | None:
    """The index key: only string namespaces can equal `in_namespace`'s argument."""
    namespace = None if obj is None else obj.get("metadata", {}).get("namespace")
    return namespace if isinstance(namespace, str) else None


def _rv(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


class InformerSet:
    """One informer per kind, created on first use and shared by all controllers."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._informers: dict[ApiResource, Informer] = {}
        self._started = False

    def get(self, resource: ApiResource) -> Informer:
        informer = self._informers.get(resource)
        if informer is None:
            informer = self._informers[resource] = Informer(self.api, resource)
            if self._started:
                informer.start()
        return informer

    def start(self) -> None:
        self._started = True
        for informer in self._informers.values():
            informer.start()

    async def stop(self) -> None:
        for informer in self._informers.values():
            await informer.stop()

    async def wait_synced(self) -> None:
        for informer in list(self._informers.values()):
            await informer.wait_synced()
