"""The waits' heartbeats are paced: none within a wait's first tick, then at most one a tick."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from temporalio.testing import ActivityEnvironment

from activities.heartbeats import Heartbeat


class Progress(BaseModel):
    seen: int


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_wait_heartbeats_a_tick_after_it_began_then_once_a_tick() -> None:
    env = ActivityEnvironment()
    sent: list[Any] = []
    env.on_heartbeat = lambda *details: sent.extend(details)
    clock = Clock()
    built = 0

    async def waiting() -> None:
        def details() -> Progress:
            nonlocal built
            built += 1
            return Progress(seen=built)

        beat = Heartbeat(10.0, clock=clock)
        for at in (0.0, 3.0, 9.9):  # changes seen within the first tick
            clock.now = 100.0 + at
            beat(details)
        assert sent == [] and built == 0  # nothing sent, and the details not even gathered
        clock.now = 110.0
        beat(details)
        assert sent == [{"seen": 1}]  # plain JSON data, for any data converter
        for at in (110.5, 119.9):
            clock.now = at
            beat(details)
        assert len(sent) == 1
        clock.now = 120.0
        beat(details)
        assert sent == [{"seen": 1}, {"seen": 2}] and built == 2

    await env.run(waiting)
