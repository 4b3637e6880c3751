"""InFlight: concurrent identical reads share one request, and nothing outlives it."""

from __future__ import annotations

import asyncio

import pytest

from activities.inflight import InFlight


class Backend:
    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def read(self) -> str:
        self.calls += 1
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return f"answer {self.calls}"


async def test_callers_asking_at_once_share_one_request_and_later_ones_ask_again() -> None:
    backend, shared = Backend(), InFlight[str, str]()
    callers = [asyncio.ensure_future(shared.run("key", backend.read)) for _ in range(5)]
    other = asyncio.ensure_future(shared.run("other key", backend.read))
    await asyncio.sleep(0)
    backend.release.set()
    assert await asyncio.gather(*callers) == ["answer 1"] * 5
    assert await other == "answer 2"
    assert backend.calls == 2 and shared.joined == 4
    # Nothing is kept: the next caller's answer comes from a request of its own.
    assert await shared.run("key", backend.read) == "answer 3"


async def test_an_error_reaches_every_caller_and_the_next_caller_tries_again() -> None:
    backend, shared = Backend(), InFlight[str, str]()
    backend.fail = ConnectionError("refused")
    callers = [asyncio.ensure_future(shared.run("key", backend.read)) for _ in range(3)]
    await asyncio.sleep(0)
    backend.release.set()
    for caller in callers:
        with pytest.raises(ConnectionError):
            await caller
    backend.fail = None
    assert await shared.run("key", backend.read) == "answer 2"


async def test_a_cancelled_caller_leaves_the_request_to_the_others() -> None:
    backend, shared = Backend(), InFlight[str, str]()
    first = asyncio.ensure_future(shared.run("key", backend.read))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(shared.run("key", backend.read))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    backend.release.set()
    assert await second == "answer 1" and backend.calls == 1
