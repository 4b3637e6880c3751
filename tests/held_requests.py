"""A stand-in server's way to hold requests a moment and count how many it holds at once."""

from __future__ import annotations

import asyncio
import threading


class HeldRequests:
    """Holds each request `hold` seconds; `most` is the most held at once, `answered` the total."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.now = self.most = self.answered = 0
        self._lock = threading.Lock()

    async def wait(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.hold)
        finally:
            with self._lock:
                self.now -= 1
                self.answered += 1
