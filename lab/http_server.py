"""Run an ASGI app with uvicorn on a background thread with its own event loop.

Tests and the `lab serve` command use this so that blocking clients (the official kubernetes
client, kubectl, curl) can talk to the twins from the test's own thread without deadlocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def distinct_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Free ports, all different: held open together while picked, so none comes back twice."""
    with contextlib.ExitStack() as held:
        sockets = [
            held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)
        ]
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound now to a free port, to listen on later or never: no other process can take
    the port meanwhile, as it could one picked by `free_port` and bound later. (No SO_REUSEADDR:
    with it, another socket asking for reuse could be bound beside this one until it listens.)"""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def refusing_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port that refuses connections for as long as the block runs: bound, so no other process
    can listen on it, but never listening (a closed port picked at random could be taken)."""
    with bound_socket(host) as sock:
        yield int(sock.getsockname()[1])


class ThreadedServer:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level="warning", lifespan="on", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._server.serve())

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on {self.url} exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {self.url} did not start within {timeout}s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the server's loop (to touch twin state from another thread)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
