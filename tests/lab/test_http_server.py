"""The twins' servers listen on a socket bound before their app is built: the port in the URL they
were built with is theirs from then on (a port only picked, then bound later, could be taken by a
test in another process meanwhile)."""

from __future__ import annotations

import socket

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from lab.http_server import ThreadedServer, bound_socket, refusing_port


async def _hello(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


APP = Starlette(routes=[Route("/", _hello)])


def test_a_reserved_port_is_held_until_its_server_serves_and_released_after() -> None:
    sock = bound_socket()
    port = sock.getsockname()[1]
    for reuse in (0, 1):  # another process binding the same port cannot have it, even asking for reuse
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError):
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
            other.bind(("127.0.0.1", port))
    with ThreadedServer(APP, sock=sock) as server:
        assert server.port == port
        assert httpx.get(f"{server.url}/").text == "hello"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))  # free once the server stopped


def test_a_server_never_started_gives_its_port_back() -> None:
    server = ThreadedServer(APP)
    port = server.port
    server.stop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_a_fixed_port_in_use_is_refused_at_once_naming_it() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot bind 127.0.0.1:{port}"):
            ThreadedServer(APP, port=port)


def test_a_refusing_port_refuses_and_nobody_else_listens_on_it() -> None:
    with refusing_port() as port:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError):
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", port))
