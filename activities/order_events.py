"""Kubernetes Events about a ClusterOrder, and the recorder that writes them in the background.

Events are observability. As Kubernetes' own event recorders do, the status write that carries them
queues them and goes on: a decommission's burst of a hundred WorkerDeleted Events written inside the
write held the order's next status write (the tenant's view of the workers) for seconds. The recorder
writes a few at once for the whole process, retries each a few times, and drops what the hub keeps
refusing or what overflows its queue, with a warning. A process that dies loses what it had queued;
a keyed Event written twice (a retried status write) is one Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import os
import random
import socket
import time
from typing import Any

from activities.kube import (
    EVENTS,
    HubAlreadyExists,
    HubApiError,
    HubConflict,
    HubKube,
    HubNotFound,
    HubUnavailable,
    conflict_backoff,
    now_rfc3339,
)
from contracts.hub import EVENT_COMPONENT, EventInput, EventReason, EventType

log = logging.getLogger(__name__)

EVENT_WRITE_ATTEMPTS = 5
# Events in flight at once, for the whole process: a burst drains quickly without crowding out the
# activities' own hub requests (they share the hub client's threads).
EVENT_WRITES_AT_ONCE = 4
# About 1 KB each: a hub refusing every write for long costs at most about 10 MB, then Events drop.
EVENT_QUEUE_CAPACITY = 10_000

_REPORTING_INSTANCE = f"{socket.gethostname()}-{os.getpid()}"[:128]
# An Event about the object `involved`, and when its status write queued it.
_Queued = tuple[dict[str, Any], EventInput, str]


async def write_order_event(
    kube: HubKube,
    involved: dict[str, Any],
    reason: EventReason,
    message: str,
    type_: EventType = EventType.NORMAL,
    key: str | None = None,
    at: str | None = None,
) -> str | None:
    """Write a core/v1 Event about a ClusterOrder. With a key, retries write one Event.

    `involved` is the involvedObject (apiVersion, kind, name, namespace, uid). Returns the Event's
    name, or None if the namespace is gone. `at`: when it happened (RFC 3339), if not now."""
    namespace = involved["namespace"]
    if key:
        suffix = hashlib.sha256(f"{reason.value}/{key}".encode()).hexdigest()[:16]
    else:  # kube-style: the involved object's name and a timestamp (plus noise against collisions)
        suffix = f"{time.time_ns():x}{random.getrandbits(16):04x}"
    name = f"{involved['name']}.{suffix}"
    now = at or now_rfc3339()
    body = {
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {k: v for k, v in involved.items() if v},
        "reason": reason.value,
        "message": message,
        "type": type_.value,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": EVENT_COMPONENT},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": _REPORTING_INSTANCE,
    }
    try:
        await kube.create(EVENTS, namespace, body)
    except HubAlreadyExists:
        pass  # keyed: this Event was written by an earlier attempt
    except HubNotFound:
        return None
    return name


class OrderEventRecorder:
    """Queues ClusterOrder Events and writes them in the background, `at_once` at a time. Its writer
    tasks start with the first Event, on the loop that records it; `close` drains them."""

    def __init__(
        self, kube: HubKube, *, at_once: int = EVENT_WRITES_AT_ONCE, capacity: int = EVENT_QUEUE_CAPACITY
    ) -> None:
        self._kube = kube
        self._at_once = at_once
        self._capacity = capacity
        self._queue: asyncio.Queue[_Queued] | None = None
        self._writers: list[asyncio.Task[None]] = []
        self.written = 0
        self.dropped = 0  # refused, or the queue was full

    def record(self, involved: dict[str, Any], events: list[EventInput]) -> int:
        """Queue `events` about the object `involved`; how many were queued (the rest dropped)."""
        queue = self._started()
        queued = 0
        at = now_rfc3339()  # when the status write queued them, not when a writer gets to them
        for event in events:
            try:
                queue.put_nowait((involved, event, at))
                queued += 1
            except asyncio.QueueFull:
                self.dropped += 1
        if queued < len(events):
            log.warning(
                "dropped %d Event(s) on ClusterOrder %s: %d already wait to be written",
                len(events) - queued,
                events[0].order.key,
                self._capacity,
            )
        return queued

    async def drain(self, timeout: float) -> bool:
        """Wait until every queued Event is written or dropped; False if `timeout` came first."""
        if self._queue is None:
            return True
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (for up to `timeout` seconds), then stop the writers."""
        if not await self.drain(timeout) and self._queue is not None:
            log.warning("stopping with %d Event(s) not written", self._queue.qsize())
        for writer in self._writers:
            writer.cancel()
        for writer in self._writers:
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        self._writers, self._queue = [], None

    def _started(self) -> asyncio.Queue[_Queued]:
        if self._queue is None:
            self._queue = asyncio.Queue(maxsize=self._capacity)
            self._writers = [
                # A context of their own: not the trace span and activity of the write that came first.
                asyncio.create_task(
                    self._write_queued(self._queue), name=f"order events {i}", context=contextvars.Context()
                )
                for i in range(self._at_once)
            ]
        return self._queue

    async def _write_queued(self, queue: asyncio.Queue[_Queued]) -> None:
        while True:
            involved, event, at = await queue.get()
            try:
                if await self._write(involved, event, at) is None:
                    self.dropped += 1
                else:
                    self.written += 1
            except Exception:  # a writer that died would leave its share of the queue unwritten
                log.exception(
                    "writing Event %s on ClusterOrder %s failed", event.reason.value, event.order.key
                )
                self.dropped += 1
            finally:
                queue.task_done()

    async def _write(self, involved: dict[str, Any], event: EventInput, at: str) -> str | None:
        """A few quick retries, then the Event is dropped (as Kubernetes' own recorders do)."""
        for attempt in range(EVENT_WRITE_ATTEMPTS):
            try:
                return await write_order_event(
                    self._kube, involved, event.reason, event.message, event.type, event.key, at
                )
            except (HubUnavailable, HubConflict):
                if attempt + 1 < EVENT_WRITE_ATTEMPTS:
                    await asyncio.sleep(conflict_backoff(attempt))
            except HubApiError as err:
                # Refused for good (a namespace being deleted forbids new objects; a quota, a
                # webhook): retrying would only crowd out the Events that can still be written.
                log.warning(
                    "dropped Event %s on ClusterOrder %s: %s", event.reason.value, event.order.key, err.type
                )
                return None
        log.warning(
            "dropped Event %s on ClusterOrder %s after %d attempts",
            event.reason.value,
            event.order.key,
            EVENT_WRITE_ATTEMPTS,
        )
        return None
