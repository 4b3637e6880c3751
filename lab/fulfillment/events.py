"""Fan-out of object events to `events/watch` subscribers (one bounded buffer per subscriber)."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from typing import Any

from lab.fulfillment.celfilter import Predicate
from lab.fulfillment.models import EventType

# A subscriber this far behind is cut off: it re-lists after reconnecting, like a real client must.
MAX_BUFFERED_EVENTS = 10_000
# Events sent in one write at most, so one subscriber cannot hold the event loop for long.
WATCH_WRITE_MAX_EVENTS = 500


class Subscription:
    def __init__(self, predicate: Predicate, max_buffered: int) -> None:
        self._predicate = predicate
        self._max = max_buffered
        self._items: deque[dict[str, Any]] = deque()
        self._wakeup = asyncio.Event()
        self.closed = False

    def offer(self, event: dict[str, Any]) -> None:
        if self.closed or not self._predicate(event):
            return
        if len(self._items) >= self._max:
            self.close()
            return
        self._items.append(event)
        self._wakeup.set()

    def close(self) -> None:
        self.closed = True
        self._wakeup.set()

    async def next(self) -> dict[str, Any] | None:
        """The next event, or None once the subscription is closed and drained."""
        while not self._items and not self.closed:
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._items.popleft() if self._items else None

    def next_buffered(self) -> dict[str, Any] | None:
        """The next event if one is already buffered, without waiting."""
        return self._items.popleft() if self._items else None


class EventBus:
    def __init__(self, max_buffered: int = MAX_BUFFERED_EVENTS) -> None:
        self._subscriptions: set[Subscription] = set()
        self._ids = itertools.count(1)
        self._max = max_buffered
        self._closed = False

    def subscribe(self, predicate: Predicate) -> Subscription:
        sub = Subscription(predicate, self._max)
        if self._closed:
            sub.close()
        else:
            self._subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscriptions.discard(sub)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscriptions)

    def publish(self, event_type: EventType, payload_field: str, payload: dict[str, Any]) -> None:
        event = {"id": str(next(self._ids)), "type": event_type.value, payload_field: payload}
        for sub in list(self._subscriptions):
            sub.offer(event)

    def close(self) -> None:
        """End every stream (server shutdown); buffered events are still delivered first."""
        self._closed = True
        for sub in self._subscriptions:
            sub.close()
