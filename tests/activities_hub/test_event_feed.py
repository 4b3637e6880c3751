"""The hand-over of a watch stream's events from its reading thread to the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from activities.kube import _EventFeed


def _events(n: int, then: Exception | None = None) -> Iterator[dict[str, Any]]:
    for index in range(n):
        yield {"type": "ADDED", "object": {"metadata": {"name": f"o{index}"}}}
    if then is not None:
        raise then


def _names(batch: list[dict[str, Any]]) -> list[str]:
    return [e["object"]["metadata"]["name"] for e in batch]


async def test_a_burst_read_while_the_loop_was_busy_arrives_in_one_take() -> None:
    feed = _EventFeed(asyncio.get_running_loop())
    reader = threading.Thread(target=feed.pump, args=(_events(1000),))
    reader.start()
    reader.join(30)  # the loop is not looking meanwhile
    assert not reader.is_alive()
    assert _names(await feed.take()) == [f"o{i}" for i in range(1000)]
    assert await feed.take() == []  # the stream ended cleanly
    assert feed.stop()  # and says so: its connection can be reused


async def test_events_keep_coming_as_they_are_read() -> None:
    loop = asyncio.get_running_loop()
    feed = _EventFeed(loop)
    gate = threading.Semaphore(0)

    def paced() -> Iterator[dict[str, Any]]:
        for index in range(3):
            gate.acquire()
            yield {"object": {"metadata": {"name": f"o{index}"}}}

    pumping = loop.run_in_executor(None, feed.pump, paced())
    seen: list[str] = []
    for _ in range(3):
        gate.release()
        seen += _names(await asyncio.wait_for(feed.take(), 30))
    assert seen == ["o0", "o1", "o2"]
    assert await asyncio.wait_for(feed.take(), 30) == []
    await pumping


async def test_a_broken_stream_hands_over_what_it_read_then_its_error() -> None:
    feed = _EventFeed(asyncio.get_running_loop())
    await asyncio.to_thread(feed.pump, _events(2, then=ConnectionResetError("cut")))
    assert _names(await feed.take()) == ["o0", "o1"]
    with pytest.raises(ConnectionResetError):
        await feed.take()


async def test_the_reader_waits_at_the_bound_and_stop_releases_it() -> None:
    feed = _EventFeed(asyncio.get_running_loop(), max_pending=3)
    pulled = 0

    def counted() -> Iterator[dict[str, Any]]:
        nonlocal pulled
        for event in _events(100):
            pulled += 1
            yield event

    reader = threading.Thread(target=feed.pump, args=(counted(),), daemon=True)
    reader.start()
    received: list[dict[str, Any]] = []
    while len(received) < 6:
        batch = await asyncio.wait_for(feed.take(), 30)
        assert len(batch) <= 3  # never more than the bound in hand
        received += batch
    assert _names(received) == [f"o{i}" for i in range(len(received))]
    # Read ahead by at most the bound, plus the one event it holds while it waits.
    assert pulled <= len(received) + 3 + 1
    assert reader.is_alive()
    assert not feed.stop()  # still reading: the informer shuts the stream down
    reader.join(30)
    assert not reader.is_alive()
