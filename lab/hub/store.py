"""In-memory object storage: one global resourceVersion, per-kind/per-namespace indexes, an event window
for watch resumption, and fan-out of changes to per-watcher bounded queues.

All methods are synchronous and run on the server's event loop, so each one is atomic: a watcher
registered in the same call as a list or a replay can never miss or duplicate an event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

from lab.hub.errors import expired
from lab.hub.resources import ResourceType
from lab.hub.selectors import FieldSelector, LabelSelector

Obj = dict[str, Any]
ObjKey = tuple[tuple[str, str, str], str, str]  # (resource key, namespace, name)


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    ERROR = "ERROR"


class CloseReason(StrEnum):
    TIMEOUT = "timeout"
    OVERFLOW = "overflow"  # the client did not keep up: its stream is closed, it must re-watch
    FAULT = "fault"  # closed on purpose by the API faults knob
    SHUTDOWN = "shutdown"
    CLIENT = "client"


def encode_event(event_type: str, obj: Obj) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


class Change:
    """One stored write; encoded once per event type and shared by every watcher that wants it."""

    __slots__ = ("_encoded", "namespace", "obj", "old", "rt", "rv", "type")

    def __init__(self, rv: int, event_type: EventType, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        self.rv = rv
        self.type = event_type
        self.rt = rt
        self.namespace: str = obj["metadata"].get("namespace", "")
        self.obj = obj
        self.old = old
        self._encoded: dict[EventType, bytes] = {}

    def encoded(self, event_type: EventType) -> bytes:
        data = self._encoded.get(event_type)
        if data is None:
            data = self._encoded[event_type] = encode_event(event_type, self.obj)
        return data


Renderer = Callable[[EventType, Obj], bytes]


class Watcher:
    def __init__(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        maxsize: int,
        renderer: Renderer | None = None,
    ) -> None:
        self.rt = rt
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.renderer = renderer
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=maxsize)
        # Initial and replayed events: not bounded by the queue size, they are sent first.
        self.backlog: deque[bytes] = deque()
        self.closed: CloseReason | None = None
        # When each queued line was published, and how long the line last taken waited to be sent
        # (None for a backlog line): the lab's own watch delay, which the reaction figures include.
        self._queued_at: deque[float] = deque()
        self.last_delay: float | None = None

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)

    def render(self, change: Change) -> bytes | None:
        """The line this watcher sends for `change`, or None when the change is not for it."""
        now = self.matches(change.obj)
        if change.type is EventType.MODIFIED:
            # Like the watch cache: an object moving out of/into the selection is DELETED/ADDED for us.
            before = self.matches(change.old)
            if now and not before:
                event_type = EventType.ADDED
            elif before and not now:
                event_type = EventType.DELETED
            elif now:
                event_type = EventType.MODIFIED
            else:
                return None
        elif now:
            event_type = change.type
        else:
            return None
        return change.encoded(event_type) if self.renderer is None else self.renderer(event_type, change.obj)

    def offer(self, change: Change) -> None:
        if self.closed is not None:
            return
        data = self.render(change)
        if data is not None:
            self.push(data)

    def push(self, data: bytes) -> None:
        try:
            self.queue.put_nowait(data)
            self._queued_at.append(time.monotonic())
        except asyncio.QueueFull:
            self.close(CloseReason.OVERFLOW)

    async def next(self, wait: float) -> bytes | None:
        """The next line to send; None when closed. Raises TimeoutError when nothing came in time."""
        if self.closed is not None:
            return None
        buffered = self.next_buffered()
        if buffered is not None:
            return buffered
        return self._taken(await asyncio.wait_for(self.queue.get(), wait))

    def next_buffered(self) -> bytes | None:
        """The next line if one is already waiting, without waiting; None when none is (or closed:
        `next` then says so)."""
        if self.closed is not None:
            return None
        if self.backlog:
            self.last_delay = None
            return self.backlog.popleft()
        return None if self.queue.empty() else self._taken(self.queue.get_nowait())

    def _taken(self, data: bytes | None) -> bytes | None:
        self.last_delay = time.monotonic() - self._queued_at.popleft() if data is not None else None
        return data

    def close(self, reason: CloseReason) -> None:
        if self.closed is not None:
            return
        self.closed = reason
        # Its stream ends now; what is queued is dropped with it (the client re-watches).
        self.backlog.clear()
        while not self.queue.empty():
            self.queue.get_nowait()
        self._queued_at.clear()
        self.queue.put_nowait(None)  # wakes the stream


class Store:
    def __init__(self, window: int, queue_size: int) -> None:
        self.rv = 0
        # Per kind, like the apiserver's watch cache: the latest changes, and the version of the
        # newest change that has left the window (watching from before it answers 410 Gone).
        self._windows: dict[tuple[str, str, str], deque[Change]] = {}
        self._floors: dict[tuple[str, str, str], int] = {}
        self._window_size = max(1, window)
        self._queue_size = queue_size
        self._objects: dict[tuple[str, str, str], dict[str, dict[str, Obj]]] = {}
        self._uids: dict[str, tuple[ResourceType, str, str]] = {}
        self._dependents: dict[str, set[ObjKey]] = {}
        self._watchers: dict[tuple[str, str, str], set[Watcher]] = {}
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self.on_change: list[Callable[[Change], None]] = []

    # -- reads -----------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        return self._objects.get(rt.key, {}).get(namespace, {}).get(name)

    def select(self, rt: ResourceType, namespace: str | None = None, name: str | None = None) -> list[Obj]:
        by_ns = self._objects.get(rt.key, {})
        if namespace is not None:
            spaces: Iterable[tuple[str, dict[str, Obj]]] = [(namespace, by_ns.get(namespace, {}))]
        else:
            spaces = sorted(by_ns.items())
        out: list[Obj] = []
        for _, objects in spaces:
            if name is not None:
                if name in objects:
                    out.append(objects[name])
            else:
                out.extend(objects[n] for n in sorted(objects))
        return out

    def count_in_namespace(self, types: Iterable[ResourceType], namespace: str) -> int:
        return sum(len(self._objects.get(rt.key, {}).get(namespace, {})) for rt in types)

    def by_uid(self, uid: str) -> tuple[ResourceType, Obj] | None:
        where = self._uids.get(uid)
        if where is None:
            return None
        rt, namespace, name = where
        obj = self.get(rt, namespace, name)
        return None if obj is None else (rt, obj)

    def dependents(self, owner_uid: str) -> list[tuple[ResourceType, Obj]]:
        out = []
        for key, namespace, name in sorted(self._dependents.get(owner_uid, ())):
            rt = self._types[key]
            obj = self.get(rt, namespace, name)
            if obj is not None:
                out.append((rt, obj))
        return out

    # -- writes ----------------------------------------------------------------------------------

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, rt: ResourceType, obj: Obj, old: Obj | None) -> Change:
        """Store `obj` (its resourceVersion already set from `next_rv`) and publish the change."""
        meta = obj["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        self._types[rt.key] = rt
        self._objects.setdefault(rt.key, {}).setdefault(namespace, {})[name] = obj
        self._uids[meta["uid"]] = (rt, namespace, name)
        self._index_owners(rt, old, obj)
        change = Change(
            int(meta["resourceVersion"]), EventType.MODIFIED if old else EventType.ADDED, rt, obj, old
        )
        self._publish(change)
        return change

    def remove(self, rt: ResourceType, final: Obj) -> Change:
        """Remove the object; `final` is its last state, with the deletion's resourceVersion."""
        meta = final["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        objects = self._objects.get(rt.key, {}).get(namespace, {})
        old = objects.pop(name, None)
        if not objects:
            self._objects.get(rt.key, {}).pop(namespace, None)
        self._uids.pop(meta["uid"], None)
        self._index_owners(rt, old, None)
        change = Change(int(meta["resourceVersion"]), EventType.DELETED, rt, final, old)
        self._publish(change)
        return change

    def _index_owners(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            key: ObjKey = (rt.key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            for ref in obj["metadata"].get("ownerReferences") or []:
                uid = ref.get("uid")
                if not uid:
                    continue
                if add:
                    self._dependents.setdefault(uid, set()).add(key)
                else:
                    deps = self._dependents.get(uid)
                    if deps is not None:
                        deps.discard(key)
                        if not deps:
                            del self._dependents[uid]

    def _publish(self, change: Change) -> None:
        key = change.rt.key
        window = self._windows.setdefault(key, deque())
        window.append(change)
        if len(window) > self._window_size:
            self._floors[key] = window.popleft().rv
        for watcher in list(self._watchers.get(change.rt.key, ())):
            watcher.offer(change)
        for callback in self.on_change:
            callback(change)

    # -- watch -----------------------------------------------------------------------------------

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        since: int | None,
        renderer: Renderer | None = None,
    ) -> Watcher:
        """Register a watcher. `since=None` starts with ADDED events for the current objects."""
        floor = self._floors.get(rt.key, 0)
        if since is not None and since < floor:
            raise expired(f"too old resource version: {since} ({floor})")
        watcher = Watcher(rt, namespace, labels, fields, self._queue_size, renderer)
        if since is None:
            for obj in self.select(rt, namespace):
                if watcher.matches(obj):
                    watcher.backlog.append(
                        encode_event(EventType.ADDED, obj)
                        if renderer is None
                        else renderer(EventType.ADDED, obj)
                    )
        else:
            for change in self._windows.get(rt.key, ()):
                if change.rv > since:
                    data = watcher.render(change)
                    if data is not None:
                        watcher.backlog.append(data)
        self._watchers.setdefault(rt.key, set()).add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.get(watcher.rt.key, set()).discard(watcher)

    def watchers(self) -> list[Watcher]:
        return [w for group in self._watchers.values() for w in group]

    def close_watchers(self, reason: CloseReason) -> int:
        watchers = self.watchers()
        for watcher in watchers:
            watcher.close(reason)
        return len(watchers)
