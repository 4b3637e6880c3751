"""Background controllers a real control plane runs next to the API server: the garbage collector
(owner references), the namespace controller (empties and finalizes terminating namespaces) and
event expiry. They react to store changes and run on the server loop, after the request that caused
the change has been answered (background propagation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from lab.hub.errors import ApiError
from lab.hub.objects import DeleteOptions, ObjectApi
from lab.hub.resources import ResourceType
from lab.hub.store import Change, EventType

log = logging.getLogger(__name__)

Task = tuple[str, Any]


class Controllers:
    def __init__(self, api: ObjectApi, event_ttl_seconds: float | None) -> None:
        self.api = api
        self.store = api.store
        self.event_ttl = event_ttl_seconds
        self._queue: asyncio.Queue[Task] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self.store.on_change.append(self._on_change)
        self.events = api.registry.get("", "v1", "events")

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name="hub-gc"))
        if self.event_ttl and self.events is not None:
            self._tasks.append(asyncio.create_task(self._expire_events(), name="hub-event-ttl"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def idle(self) -> None:
        """Wait until every queued piece of work has been handled (for tests and shutdown)."""
        await self._queue.join()

    def _on_change(self, change: Change) -> None:
        meta = change.obj["metadata"]
        if change.type is EventType.DELETED:
            self._queue.put_nowait(("owner-gone", meta["uid"]))
            if change.rt.namespaced:
                self._queue.put_nowait(("namespace-check", change.namespace))
            return
        if change.rt is self.api.namespaces and meta.get("deletionTimestamp"):
            self._queue.put_nowait(("namespace-drain", meta["name"]))
        refs = meta.get("ownerReferences") or []
        if any(self.store.by_uid(ref.get("uid", "")) is None for ref in refs):
            self._queue.put_nowait(("dangling", (change.rt, change.namespace, meta["name"])))

    async def _run(self) -> None:
        while True:
            kind, arg = await self._queue.get()
            try:
                if kind == "owner-gone":
                    self._owner_gone(arg)
                elif kind == "dangling":
                    rt, namespace, name = arg
                    obj = self.store.get(rt, namespace, name)
                    if obj is not None:
                        self._collect(rt, obj)
                elif kind == "namespace-drain":
                    self._drain_namespace(arg)
                elif kind == "namespace-check":
                    self._check_namespace(arg)
            except Exception:
                log.exception("hub controller task %s %r failed", kind, arg)
            finally:
                self._queue.task_done()
            await asyncio.sleep(0)  # let requests in between long cascades

    def _owner_gone(self, uid: str) -> None:
        for rt, obj in self.store.dependents(uid):
            self._collect(rt, obj)

    def _collect(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Delete an object none of whose owners exist; drop dangling references if some still do."""
        refs = obj["metadata"].get("ownerReferences") or []
        if not refs:
            return
        alive = [r for r in refs if self.store.by_uid(r.get("uid", "")) is not None]
        meta = obj["metadata"]
        if alive:
            for ref in refs:
                if ref not in alive:
                    current = self.store.get(rt, meta.get("namespace", ""), meta["name"])
                    if current is not None:
                        self.api.remove_owner_reference(rt, current, ref.get("uid", ""))
            return
        if meta.get("deletionTimestamp"):
            return
        with contextlib.suppress(ApiError):
            self.api.delete(rt, meta.get("namespace", ""), meta["name"], DeleteOptions())

    def _namespaced_types(self) -> list[ResourceType]:
        return [rt for rt in self.api.registry if rt.namespaced]

    def _drain_namespace(self, namespace: str) -> None:
        for rt in self._namespaced_types():
            for obj in self.store.select(rt, namespace):
                if not obj["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(ApiError):
                        self.api.delete(rt, namespace, obj["metadata"]["name"], DeleteOptions())
        self._check_namespace(namespace)

    def _check_namespace(self, namespace: str) -> None:
        ns = self.store.get(self.api.namespaces, "", namespace)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        if self.store.count_in_namespace(self._namespaced_types(), namespace) == 0:
            self.api.finalize_namespace(namespace)

    async def _expire_events(self) -> None:
        assert self.event_ttl and self.events is not None
        period = max(0.5, min(60.0, self.event_ttl / 4))
        while True:
            await asyncio.sleep(period)
            cutoff = datetime.now(UTC) - timedelta(seconds=self.event_ttl)
            for obj in self.store.select(self.events):
                stamp = obj.get("lastTimestamp") or obj["metadata"].get("creationTimestamp")
                try:
                    when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
                except ValueError:
                    continue
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                if when < cutoff:
                    with contextlib.suppress(ApiError):
                        meta = obj["metadata"]
                        self.api.delete(self.events, meta.get("namespace", ""), meta["name"], DeleteOptions())
