"""`KubeApi` given the hub's app: requests reach it in process, with the server's authentication,
conflicts and answers; watches still go over the network."""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest

from lab.http_server import free_port
from lab.hub.app import create_hub_app
from lab.hub.config import HubConfig
from lab.hub.testing import CONTROLLER_USER
from lab.hub_controllers.kube import ApiError, KubeApi
from lab.hub_controllers.resources import SECRETS

TOKEN = secrets.token_urlsafe(16)


def test_requests_reach_the_app_in_process_and_watches_the_network() -> None:
    # Nothing listens at this address: only the app can answer the requests.
    nobody = f"http://127.0.0.1:{free_port()}"
    app = create_hub_app(HubConfig(tokens={TOKEN: CONTROLLER_USER}))

    async def run() -> None:
        async with app.router.lifespan_context(app):
            api = KubeApi(nobody, TOKEN, app=app)
            intruder = KubeApi(nobody, "not-a-token", app=app)
            try:
                created = await api.create(SECRETS, {"metadata": {"name": "s", "namespace": "default"}})
                stale = dict(created, metadata=dict(created["metadata"]))
                created["metadata"]["labels"] = {"a": "1"}
                updated = await api.replace(SECRETS, created)
                assert updated["metadata"]["labels"] == {"a": "1"}
                assert (await api.get(SECRETS, "default", "s")) == updated

                with pytest.raises(ApiError) as conflict:
                    await api.replace(SECRETS, stale)  # an old resourceVersion: compare-and-swap fails
                assert conflict.value.is_conflict
                with pytest.raises(ApiError) as unauthorized:
                    await intruder.get(SECRETS, "default", "s")
                assert unauthorized.value.code == 401

                with pytest.raises(httpx.ConnectError):
                    async for _ in api.watch(SECRETS, resource_version=""):
                        break
                assert app.state.hub.stats.report().by_user == {CONTROLLER_USER: 4}
            finally:
                await api.aclose()
                await intruder.aclose()

    asyncio.run(run())
