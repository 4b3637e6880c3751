"""Ports for tests that must not be taken by another process meanwhile: one held bound until a
stand-in server listens on it, and one that refuses connections for as long as a test needs."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from lab.http_server import bound_socket, refusing_port


def _bind_beside(port: int, reuse: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
        other.bind(("127.0.0.1", port))


async def test_a_bound_socket_holds_its_port_until_a_server_listens_on_it() -> None:
    sock = bound_socket()
    port = sock.getsockname()[1]
    try:
        for reuse in (0, 1):  # another process cannot have it, even asking for reuse
            with pytest.raises(OSError):
                _bind_beside(port, reuse)
    except BaseException:
        sock.close()
        raise

    async def hello(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(hello, sock=sock)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await reader.read() == b"hello"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_refusing_port_refuses_and_nobody_else_listens_on_it() -> None:
    with refusing_port() as port:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/", trust_env=False)  # no proxy in between
        for reuse in (0, 1):
            with pytest.raises(OSError):
                _bind_beside(port, reuse)
