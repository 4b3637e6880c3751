"""The shared informer's re-list after a 410 that arrives mid-stream, while the hub refuses lists.

A unit test with a scripted kube (the informer takes any object with `list`, `_open_watch` and
`relist_backoff`): the twin sends 410 only as a stream's first event, never after others. No clock
is read: the informer's backoff is set far longer than the test, and its list attempts are counted
over a fixed number of event-loop turns.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from activities.kube import AGENTS, HubKube, HubUnavailable, Informer, ObjectList
from contracts.hub import HubErrorType

LOOP_TURNS = 500


class ScriptedStream:
    """A watch body: one ADDED event, then a 410 ERROR event (the cache's version expired)."""

    def __init__(self) -> None:
        agent = {"metadata": {"name": "a1", "namespace": "ns", "resourceVersion": "11"}}
        self._events = [
            {"type": "ADDED", "object": agent},
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}},
        ]

    def stream(self, amt: int | None = None, decode_content: bool = True) -> Iterator[bytes]:
        for event in self._events:
            yield (json.dumps(event) + "\n").encode()

    def shutdown(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class OutageKube:
    """Lists once, then every list fails (a hub outage starting right after the first watch)."""

    relist_backoff = (60.0, 60.0)  # longer than the test: a backed-off informer lists no more

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0

    async def list(self, resource: Any, namespace: str | None = None, **kwargs: Any) -> ObjectList:
        await asyncio.sleep(0)  # a request yields to the loop, as a real one does
        self.lists += 1
        if self.lists == 1:
            return ObjectList(items=[], resource_version="10")
        raise HubUnavailable("hub list Agent: HTTP 503", type=HubErrorType.UNAVAILABLE, non_retryable=False)

    def _open_watch(self, resource: Any, resource_version: str | None) -> ScriptedStream:
        self.watches += 1
        return ScriptedStream()


async def test_a_failing_relist_after_a_mid_stream_410_is_backed_off():
    kube = OutageKube()
    informer = Informer(cast(HubKube, kube), AGENTS, None)
    await informer.start()
    try:
        # The first list, the watch (an event, then 410), the first re-list, which fails.
        deadline = datetime.now(UTC) + timedelta(seconds=30)
        while kube.lists < 2:
            assert datetime.now(UTC) < deadline, "the informer never re-listed after the 410"
            await asyncio.sleep(0.01)
        assert informer.stats.expired == 1 and kube.watches == 1
        # Backed off now: however many turns the loop takes, no further list is sent. (Re-listing at
        # once, it sent one per turn: hundreds a second against a hub that is already failing.)
        for _ in range(LOOP_TURNS):
            await asyncio.sleep(0)
        assert kube.lists == 2
    finally:
        await informer.stop()
