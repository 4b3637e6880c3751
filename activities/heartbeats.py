"""The heartbeats of the waiting activities, paced.

A wait heartbeats so that Temporal notices a dead worker (the heartbeat timeout) and can hand the
wait a cancellation, and so that operators see what it waits for (the pending activity's details).
Every heartbeat the SDK sends is a request to the server and a write of the workflow's state, and
most waits end within seconds: unpaced, a worker lifecycle sent more heartbeats than it ran
activities (bench/README.md, round 12). So a wait heartbeats one tick after it began, then at most
once a tick, a tick being at most a third of its heartbeat timeout. The server still hears from a
wait well within its timeout, and a wait that ends within its first tick costs it nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from temporalio import activity


def tick_seconds(default: float) -> float:
    """How often a waiting activity heartbeats: a third of its heartbeat timeout, at most `default`."""
    timeout = activity.info().heartbeat_timeout
    if timeout and timeout.total_seconds() > 0:
        return max(0.05, min(default, timeout.total_seconds() / 3))
    return default


class Heartbeat:
    """One waiting activity's heartbeats. Create it as the wait begins and call it as often as the
    wait likes (on every change it sees, on every tick): it sends only when a heartbeat is due, and
    only then builds the details, which may be costly to gather."""

    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._next = clock() + every

    def due(self) -> bool:
        """Whether a heartbeat is due now; once it said so, not again for a tick."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.every
        return True

    def __call__(self, details: Callable[[], Any]) -> None:
        if self.due():
            built = details()
            # Plain JSON data: readable by any data converter (and by the next attempt).
            activity.heartbeat(built.model_dump(mode="json") if isinstance(built, BaseModel) else built)
