"""The chaos harness's Temporal dev server: a first start whose port was taken meanwhile picks new
ones (a free port is only free until someone binds it); the ports it picks are all different."""

from __future__ import annotations

import socket
from pathlib import Path

from bench.chaos.processes import TemporalDevServer
from lab.http_server import distinct_free_ports


def test_distinct_free_ports_are_distinct() -> None:
    ports = distinct_free_ports(20)
    assert len(set(ports)) == 20


async def test_a_first_start_whose_port_was_taken_picks_new_ports(tmp_path: Path) -> None:
    server = TemporalDevServer(tmp_path)
    taken = server.port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as thief:
        thief.bind(("127.0.0.1", taken))
        thief.listen()
        try:
            await server.start()
            assert server.port != taken
            client = await server.client()
            assert (await client.service_client.check_health()) is not None
        finally:
            server.stop()
    assert "address already in use" in server.log_file.read_text()
