"""One `events/watch` stream per worker process, shared by every activity waiting on a BMI.

The stream has no resume point, so the watcher subscribes first and then lists to close the gap, and
does that again after every disconnect. It keeps the latest known snapshot per BMI id and wakes the
waiters on each change. Only while the stream is down does it poll (one GET per waited id, with a
growing interval). A waiting activity therefore costs a constant number of API calls (at most one
seeding GET, one per relist that misses its BMI, and one confirming GET for "gone"), however long a
host takes.

Gone is only ever a DELETED event or a GET's NotFound: a BMI a list does not show is forgotten, and a
waiter on it asks for it by id (a list is many requests, and what it misses proves nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from activities.bmaas.client import INSTANCES, BmaasClient, cel_string
from activities.bmaas.errors import BmaasApiError
from activities.bmaas.snapshot import BmiSnapshot
from contracts.bmaas import ORDER_LABEL, SYSTEM_TENANT, BmaasErrorType

log = logging.getLogger(__name__)

# Scope of the stream and of the gap-closing list: CaaS BMIs only (system tenant, order label).
EVENT_FILTER = (
    "has(event.bare_metal_instance) && "
    f"event.bare_metal_instance.metadata.tenant == {cel_string(SYSTEM_TENANT)} && "
    f"{cel_string(ORDER_LABEL)} in event.bare_metal_instance.metadata.labels"
)
LIST_FILTER = (
    f"this.metadata.tenant == {cel_string(SYSTEM_TENANT)} && "
    f"{cel_string(ORDER_LABEL)} in this.metadata.labels"
)

_CREATED_OR_UPDATED = ("EVENT_TYPE_OBJECT_CREATED", "EVENT_TYPE_OBJECT_UPDATED", "EVENT_TYPE_OBJECT_SIGNALED")
_DELETED = "EVENT_TYPE_OBJECT_DELETED"
# Gone ids are remembered this long so a late list answer cannot resurrect them.
_TOMBSTONE_TTL = 900.0


class Gone:
    """Marker: the BMI no longer exists."""

    def __repr__(self) -> str:
        return "GONE"


GONE = Gone()
Observed = BmiSnapshot | Gone


@dataclass
class _Read:
    """A GET in flight; stale once its id changed meanwhile (its answer is then dropped)."""

    stale: bool = False


@dataclass
class WatcherStats:
    subscriptions: int = 0
    lists: int = 0
    events: int = 0
    polls: int = 0
    seeds: int = 0
    disconnects: int = 0


class BmiWatcher:
    """The process-wide BMI observer.

    Args:
        client: the process's BmaasClient.
        idle_timeout: re-subscribe (and re-list) after this much silence on the stream, which also
            catches half-open connections. Costs one list per period per process, not per waiter.
        poll_initial / poll_max: polling interval bounds while the stream is down.
        reconnect_initial / reconnect_max: backoff between failed subscriptions.
    """

    def __init__(
        self,
        client: BmaasClient,
        *,
        event_filter: str = EVENT_FILTER,
        list_filter: str = LIST_FILTER,
        idle_timeout: float = 300.0,
        poll_initial: float = 1.0,
        poll_max: float = 30.0,
        reconnect_initial: float = 0.2,
        reconnect_max: float = 15.0,
    ) -> None:
        self.client = client
        self.event_filter = event_filter
        self.list_filter = list_filter
        self.idle_timeout = idle_timeout
        self.poll_initial = poll_initial
        self.poll_max = poll_max
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.stats = WatcherStats()
        self._objects: dict[str, BmiSnapshot] = {}
        self._tombstones: dict[str, float] = {}
        self._touched: dict[str, int] = {}  # id -> sequence number of its last change
        self._seq = 0
        # The GETs in flight, per id: a change of the id while one is in flight makes its answer stale.
        self._reads: dict[str, list[_Read]] = {}
        # The waited ids, each with its waiters' events. A waiter is woken by changes to its own BMI
        # only: waking every waiter on every event cost a scale-up of N hosts N x (events per host)
        # wake-ups, all on the activities' loop.
        self._wakers: dict[str, set[asyncio.Event]] = {}
        self._up: asyncio.Event | None = None
        self._down: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_error: str | None = None
        # Kinds of unexpected poll failures logged in this outage (each once).
        self._poll_errors: set[str] = set()
        self._skipped_malformed = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the stream and the standby poller on the running loop (idempotent)."""
        loop = asyncio.get_running_loop()
        if self._tasks and self._loop is loop and not all(t.done() for t in self._tasks):
            # Neither loop lets an exception out; should one die all the same (a bug), the next wait
            # starts it again rather than every wait hanging without it.
            self._tasks = [self._restarted(loop, t) if t.done() else t for t in self._tasks]
            return
        self._loop = loop
        self._up = asyncio.Event()
        self._down = asyncio.Event()
        self._down.set()
        self._tasks = [
            loop.create_task(self._stream_loop(), name="bmaas-watch"),
            loop.create_task(self._poll_loop(), name="bmaas-watch-poller"),
        ]

    def _restarted(self, loop: asyncio.AbstractEventLoop, dead: asyncio.Task[None]) -> asyncio.Task[None]:
        exc = None if dead.cancelled() else dead.exception()
        why = "cancelled" if dead.cancelled() else type(exc).__name__ if exc else "returned"
        log.error("BMI watcher task %s ended (%s); starting it again", dead.get_name(), why)
        run = self._stream_loop if dead.get_name() == "bmaas-watch" else self._poll_loop
        return loop.create_task(run(), name=dead.get_name())

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._up is not None and self._down is not None:
            self._set_streaming(False)

    async def __aenter__(self) -> BmiWatcher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def streaming(self) -> bool:
        """True while subscribed and the gap-closing list has been applied."""
        return self._up is not None and self._up.is_set()

    async def wait_streaming(self, within: float) -> None:
        """Wait (up to `within` seconds) until the stream is up and listed; for tests and readiness."""
        self.start()
        assert self._up is not None
        async with asyncio.timeout(within):
            await self._up.wait()

    # -- reading -------------------------------------------------------------------------------

    def observed(self, bmi_id: str) -> Observed | None:
        """The latest snapshot, GONE, or None when nothing is known about this id."""
        if bmi_id in self._objects:
            return self._objects[bmi_id]
        if bmi_id in self._tombstones:
            return GONE
        return None

    async def refresh(self, bmi_id: str) -> Observed:
        """A GET, applied to the shared state (seeding a waiter, or confirming an absence); the latest
        observation afterwards. Asks again if a relist forgot the id while the GET was in flight."""
        while True:
            self.stats.seeds += 1
            observed = await self._fetch(bmi_id)
            if observed is not None:
                return observed

    async def _fetch(self, bmi_id: str) -> Observed | None:
        """One GET. Its answer is applied only if nothing changed the id while it was in flight: an
        event or a list seen meanwhile may be newer (a DELETED event must never be undone by a GET
        answered just before the wipe finished)."""
        read = _Read()
        self._reads.setdefault(bmi_id, []).append(read)
        try:
            obj = await self.client.get_instance(bmi_id)
        except BmaasApiError as err:
            if not err.is_not_found:
                raise
            obj = None  # NotFound is final: ids are never reused, so no later change can undo it
        finally:
            reads = self._reads[bmi_id]
            reads.remove(read)
            if not reads:
                del self._reads[bmi_id]
        if obj is not None and obj.get("id") != bmi_id:
            # Applied, it would be dropped as another BMI's and the id asked for again at once, for
            # ever: the wait would never heartbeat.
            raise BmaasApiError(f"GET /{INSTANCES}/{bmi_id}: answered another BMI", BmaasErrorType.PROTOCOL)
        if obj is None:
            self._apply_gone(bmi_id)
        elif not read.stale:
            self._apply(BmiSnapshot.from_api(obj))
        self._wake(bmi_id)
        return self.observed(bmi_id)

    async def wait(
        self,
        bmi_id: str,
        done: Callable[[Observed], bool],
        *,
        tick: float,
        on_tick: Callable[[Observed, bool], None],
    ) -> Observed:
        """Wait until `done(observed)`; calls `on_tick(observed, streaming)` after every check that
        was not done, so at least every `tick` s (the caller paces its heartbeats, see
        activities.heartbeats), as the hub informer's wait does.

        Raises a non-retryable BmaasInvalidArgument for a BMI outside the watcher's scope (no event
        would ever arrive for it).
        """
        self.start()
        waker = asyncio.Event()
        self._wakers.setdefault(bmi_id, set()).add(waker)
        try:
            current = self.observed(bmi_id)
            if current is None:
                current = await self.refresh(bmi_id)
            if isinstance(current, BmiSnapshot) and not current.is_caas_worker:
                raise BmaasApiError(
                    f"BMI {bmi_id} is not a CaaS worker (tenant {SYSTEM_TENANT}, label {ORDER_LABEL})",
                    BmaasErrorType.INVALID_ARGUMENT,
                )
            while True:
                waker.clear()
                observed = self.observed(bmi_id)
                # Unknown again: a relist did not show it. Only the server, asked by id, can say gone.
                current = await self.refresh(bmi_id) if observed is None else observed
                if done(current):
                    return current
                on_tick(current, self.streaming)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(tick):
                        await waker.wait()
        finally:
            wakers = self._wakers[bmi_id]
            wakers.discard(waker)
            if not wakers:
                del self._wakers[bmi_id]

    # -- state ---------------------------------------------------------------------------------

    def _apply(self, snapshot: BmiSnapshot) -> bool:
        if not snapshot.id:
            return False
        cached = self._objects.get(snapshot.id)
        if (
            cached is not None
            and cached.version is not None
            and snapshot.version is not None
            and snapshot.version < cached.version
        ):
            return False  # an older view (a list answer racing an event)
        self._tombstones.pop(snapshot.id, None)
        self._objects[snapshot.id] = snapshot
        self._touch(snapshot.id)
        return True

    def _apply_gone(self, bmi_id: str) -> None:
        self._objects.pop(bmi_id, None)
        self._tombstones[bmi_id] = time.monotonic()
        self._touch(bmi_id)

    def _forget(self, bmi_id: str) -> None:
        """Drop what is known of an id (a list did not show it): unknown, not gone."""
        self._objects.pop(bmi_id, None)
        self._touched.pop(bmi_id, None)
        self._stale_reads(bmi_id)

    def _touch(self, bmi_id: str) -> None:
        self._seq += 1
        self._touched[bmi_id] = self._seq
        self._stale_reads(bmi_id)

    def _stale_reads(self, bmi_id: str) -> None:
        for read in self._reads.get(bmi_id, ()):
            read.stale = True

    def _wake(self, bmi_id: str) -> None:
        for waker in self._wakers.get(bmi_id, ()):
            waker.set()

    def _wake_all(self) -> None:
        for wakers in self._wakers.values():
            for waker in wakers:
                waker.set()

    def _apply_event(self, event: dict[str, Any]) -> None:
        self.stats.events += 1
        obj = event.get("bare_metal_instance")
        if not isinstance(obj, dict):
            return
        snapshot = self._readable(obj)
        if snapshot is None:
            # What changed is unknown: the id is forgotten, so its waiter asks by id (and is told).
            bmi_id = obj.get("id")
            if isinstance(bmi_id, str) and bmi_id in self._objects:
                self._forget(bmi_id)
                self._wake(bmi_id)
            return
        if event.get("type") == _DELETED:
            self._apply_gone(snapshot.id)
        elif event.get("type") in _CREATED_OR_UPDATED:
            self._apply(snapshot)
        self._wake(snapshot.id)

    def _readable(self, obj: Any) -> BmiSnapshot | None:
        """The snapshot of a listed or streamed BMI, or None for one of another shape (logged once
        per process): one malformed BMI of any order must not tear down the stream every wait
        shares. A waiter on it reads it by id, and gets the typed protocol error."""
        try:
            return BmiSnapshot.from_api(obj)
        except BmaasApiError as err:
            if err.error_type != BmaasErrorType.PROTOCOL:
                raise
            if not self._skipped_malformed:
                self._skipped_malformed = True
                log.warning("a BMI of another shape was skipped (%s)", err.message)
            return None

    async def _relist(self) -> None:
        """Close the gap: the list updates the ids untouched while it was in flight. An id it does not
        show is forgotten, never taken for gone: a waiter on it then asks by id (see `wait`)."""
        self.stats.lists += 1
        started = self._seq
        items = await self.client.list_instances(self.list_filter)
        listed: set[str] = set()
        for item in items:
            snapshot = self._readable(item)
            if snapshot is None:
                continue  # forgotten, if it was known: its waiter asks by id, and is told
            listed.add(snapshot.id)
            if snapshot.id in self._tombstones and self._touched.get(snapshot.id, 0) > started:
                continue  # deleted by an event after the list was taken
            self._apply(snapshot)
        for bmi_id in list(self._objects):
            if bmi_id not in listed and self._touched.get(bmi_id, 0) <= started:
                self._forget(bmi_id)
        now = time.monotonic()
        for bmi_id, at in list(self._tombstones.items()):
            if now - at > _TOMBSTONE_TTL and bmi_id not in self._wakers:
                del self._tombstones[bmi_id]
                self._touched.pop(bmi_id, None)
        self._wake_all()

    def _set_streaming(self, up: bool) -> None:
        assert self._up is not None and self._down is not None
        if up:
            self._down.clear()
            self._up.set()
        else:
            self._up.clear()
            self._down.set()

    # -- background tasks ----------------------------------------------------------------------

    async def _stream_loop(self) -> None:
        backoff = self.reconnect_initial
        while True:
            try:
                async with self.client.watch(self.event_filter, idle_timeout=self.idle_timeout) as events:
                    self.stats.subscriptions += 1
                    await self._relist()
                    self._set_streaming(True)
                    self._last_error = None
                    backoff = self.reconnect_initial
                    async for event in events:
                        self._apply_event(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Messages from the client are secret-free by construction.
                message = str(exc) if isinstance(exc, BmaasApiError) else type(exc).__name__
                if message != self._last_error:
                    log.warning("BMI watch interrupted: %s", message)
                    self._last_error = message
            if self.streaming:
                self.stats.disconnects += 1
            self._set_streaming(False)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.reconnect_max)

    async def _poll_loop(self) -> None:
        assert self._up is not None and self._down is not None
        while True:
            await self._down.wait()
            interval = self.poll_initial
            self._poll_errors.clear()
            while not self._up.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await self._up.wait()
                if self._up.is_set():
                    break
                for bmi_id in sorted(self._wakers):
                    if self._up.is_set():
                        break
                    self.stats.polls += 1
                    try:
                        await self._fetch(bmi_id)
                    except Exception as exc:
                        # An answer the client could not read (a garbled encoding, a malformed
                        # object) must not end polling: every wait would hang until the stream is
                        # back. Named by its type only: its text may quote the body. Other
                        # BMaaS errors are the outage the stream's loop reports.
                        if isinstance(exc, BmaasApiError) and exc.error_type != BmaasErrorType.PROTOCOL:
                            continue
                        kind = exc.error_type.value if isinstance(exc, BmaasApiError) else type(exc).__name__
                        if kind not in self._poll_errors:
                            self._poll_errors.add(kind)
                            log.warning("BMI poll failed (%s); polling goes on", kind)
                interval = min(interval * 2, self.poll_max)
