"""Kubernetes probes for our processes: `GET /healthz` (liveness) and `GET /readyz` (readiness).

A tiny asyncio HTTP/1.0 server on the process's own event loop, so a blocked loop fails the liveness
probe too. Each probe is a callable returning whether the process is alive / ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

log = logging.getLogger("osac.health")

Probe = Callable[[], bool]
_REQUEST_TIMEOUT = 5.0


def split_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {bind!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class HealthServer:
    def __init__(self, live: Probe, ready: Probe) -> None:
        self._probes: dict[str, Probe] = {"/healthz": live, "/livez": live, "/readyz": ready}
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
            probe = self._probes.get(path.split("?", 1)[0])
            if method not in ("GET", "HEAD") or probe is None:
                status, text = "404 Not Found", "not found\n"
            else:
                try:
                    ok = probe()
                except Exception:
                    log.exception("health probe %s raised", path)
                    ok = False
                status, text = ("200 OK", "ok\n") if ok else ("503 Service Unavailable", "unavailable\n")
            body = b"" if method == "HEAD" else text.encode()
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(text)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def serve_health(bind: str | None, live: Probe, ready: Probe) -> AsyncIterator[HealthServer | None]:
    """Serve the probes on `bind` (host:port) for the duration of the block; nothing when None."""
    if not bind:
        yield None
        return
    server = HealthServer(live, ready)
    await server.start(*split_bind(bind))
    log.info("health probes on %s (/healthz, /readyz)", bind)
    try:
        yield server
    finally:
        await server.stop()
