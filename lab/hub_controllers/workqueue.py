"""A de-duplicating work queue and the reconcile-loop runner every controller uses.

Like client-go's workqueue: a key is never processed by two workers at once, a key added while it
is being processed is processed again afterwards, and failures are retried with per-key backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

from lab.hub_controllers.informer import Informer
from lab.hub_controllers.kube import Obj, WatchEventType, key_of

log = logging.getLogger(__name__)

MapFn = Callable[[WatchEventType, Obj], list[str]]


class WorkQueue:
    def __init__(self) -> None:
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._ready = asyncio.Event()
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}

    def add(self, key: str) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._ready.set()

    def add_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= due:
                return  # an earlier wake-up is already booked; its reconcile re-books if needed
            existing[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> str:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._ready.set()

    def shutdown(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()


class Controller(ABC):
    """Runs `reconcile(key)` for queued keys; a returned float asks for another pass that much later."""

    name: str = "controller"
    workers: int = 2

    def __init__(self) -> None:
        self.queue = WorkQueue()
        self._informers: list[Informer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._failures: dict[str, int] = {}

    def watch(self, informer: Informer, mapper: MapFn | None = None) -> None:
        """Enqueue keys for every event of `informer` (the object's own key unless `mapper` says)."""
        self._informers.append(informer)

        def handler(kind: WatchEventType, obj: Obj) -> None:
            keys = mapper(kind, obj) if mapper is not None else [key_of(obj)]
            for key in keys:
                self.queue.add(key)

        informer.add_handler(handler)

    def needs(self, informer: Informer) -> None:
        """Wait for `informer` to be synced before reconciling, without reacting to its events."""
        self._informers.append(informer)

    @abstractmethod
    async def reconcile(self, key: str) -> float | None: ...

    def start(self) -> None:
        for index in range(self.workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"{self.name}-{index}"))

    async def stop(self) -> None:
        self.queue.shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _work(self) -> None:
        # Decisions made on a half-filled cache would be wrong (e.g. "no Machine exists yet").
        for informer in self._informers:
            await informer.wait_synced()
        while True:
            key = await self.queue.get()
            try:
                again = await self.reconcile(key)
                self._failures.pop(key, None)
                if again is not None:
                    self.queue.add_after(key, again)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = min(0.05 * 2**failures, 5.0)
                log.warning("%s: reconcile %s failed (%s); retry in %.2fs", self.name, key, exc, delay)
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)
