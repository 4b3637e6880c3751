"""Concurrent identical reads share one request.

When a cluster scales up, its workers create their hosts at the same moment, and each asks the same
questions: which disk image boots this release, what is the cluster's discovery ignition. `InFlight`
lets the second asker await the first one's request instead of sending its own. Nothing is kept
once the request ends, so every answer comes from a request still in flight when its caller asked.
Only for reads whose answer does not depend on who asks, and that no caller's own write precedes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class InFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._calls: dict[K, asyncio.Future[V]] = {}
        self.joined = 0  # callers served by another's request (for tests and figures)

    async def run(self, key: K, call: Callable[[], Awaitable[V]]) -> V:
        """`call()`'s answer, from a request already in flight for `key` if there is one. A caller
        cancelled meanwhile leaves the request to the others; its error reaches every caller."""
        shared = self._calls.get(key)
        if shared is None:
            shared = asyncio.ensure_future(call())
            self._calls[key] = shared
            shared.add_done_callback(lambda done: self._forget(key, done))
        else:
            self.joined += 1
        return await asyncio.shield(shared)

    def _forget(self, key: K, done: asyncio.Future[V]) -> None:
        if self._calls.get(key) is done:
            del self._calls[key]
        if not done.cancelled():
            done.exception()  # retrieved here: every caller may have gone
