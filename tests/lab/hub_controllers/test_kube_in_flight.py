"""`KubeApi` keeps a burst of requests waiting on its side, not in the HTTP pool: at most
`MAX_REQUESTS_IN_FLIGHT` reach the server at once, every request of the burst is answered, and a
request that cannot get a slot in time fails as the pool would have."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from lab.http_server import ThreadedServer
from lab.hub_controllers.kube import MAX_REQUESTS_IN_FLIGHT, KubeApi
from lab.hub_controllers.resources import SECRETS
from tests.held_requests import HeldRequests


class _Counting(HeldRequests):
    """Answers every GET after `hold` seconds, counting the requests it holds at once."""

    async def secret(self, request: Request) -> JSONResponse:
        await self.wait()
        name = request.path_params["name"]
        return JSONResponse({"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name}})


@pytest.fixture
def counting() -> Iterator[tuple[_Counting, str]]:
    app = _Counting(hold=0.05)
    routes = [Route("/api/v1/namespaces/{ns}/secrets/{name}", app.secret)]
    server = ThreadedServer(Starlette(routes=routes)).start()
    try:
        yield app, server.url
    finally:
        server.stop()


def test_a_burst_waits_for_a_slot_and_is_answered_whole(counting: tuple[_Counting, str]) -> None:
    app, url = counting
    burst = MAX_REQUESTS_IN_FLIGHT * 3

    async def run() -> list[str]:
        api = KubeApi(url, "t")
        try:
            found = await asyncio.gather(*(api.get(SECRETS, "ns", f"s{i}") for i in range(burst)))
        finally:
            await api.aclose()
        return [obj["metadata"]["name"] for obj in found if obj is not None]

    names = asyncio.run(run())
    assert names == [f"s{i}" for i in range(burst)]
    assert app.answered == burst
    assert 1 < app.most <= MAX_REQUESTS_IN_FLIGHT


def test_a_request_without_a_slot_in_time_fails_like_a_full_pool(counting: tuple[_Counting, str]) -> None:
    app, url = counting
    app.hold = 2.0

    async def run() -> BaseException | None:
        api = KubeApi(url, "t", timeout=0.5)
        try:
            holders = [
                asyncio.create_task(api.get(SECRETS, "ns", f"h{i}")) for i in range(MAX_REQUESTS_IN_FLIGHT)
            ]
            await asyncio.sleep(0)  # every slot taken before the next request asks
            try:
                await api.get(SECRETS, "ns", "late")
            except httpx.PoolTimeout as err:
                return err
            finally:
                for task in holders:
                    task.cancel()
                await asyncio.gather(*holders, return_exceptions=True)
        finally:
            await api.aclose()
        return None

    err = asyncio.run(run())
    assert isinstance(err, httpx.PoolTimeout)
    assert f"{MAX_REQUESTS_IN_FLIGHT} requests in flight" in str(err)
